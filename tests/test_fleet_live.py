"""A live fleet: built-in emulator replicas (the twin of `tiny-vllm-cpu` in real time) behind a launched
sglang-router, replaying a cut of the shipped quickstart (the Claude Code sessions of traces/claude-code):
every call accounted for in the replicas' own counters, per-replica figures in summary.json, and the
cache-aware and sticky-session policies keeping more of the prefix cache than round robin. Then what goes
wrong: a replica killed mid-run (its calls fail and are counted, the others go on, the summary names it),
a replica never healthy, the router not installed, and settings a live fleet cannot take.

The pieces are tested on their own too: the emulator's replica header, the client's session keys and
replica field (absent outside a fleet), the twin's ``request_success`` counter.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from simulator import scenario as sc
from simulator.behaviour import CallRequest
from simulator.cli import main
from simulator.emulator.server import Emulator
from simulator.emulator.settings import EmulatorSettings
from simulator.fleet import launch
from simulator.fleet.launch import FleetError, emulator_argv
from simulator.scenario.fleet import REPLICA_HEADER, ROUTING_KEY_HEADER
from simulator.live.client import Client, Target
from simulator.metrics import results
from simulator.metrics.results import record_dict
from simulator.pipeline.execute import execute_async
from simulator.pipeline.fleet_live import FleetLiveExecutor
from simulator.pipeline.plan import plan_run
from simulator.workload import Call

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
CUT = [  # the quickstart's seven sessions, prompts at half its scale, tool time and arrivals compressed
    "emulator=null", "workload.transforms.token_scale=0.02", "workload.transforms.context_cap=2048",
    "workload.transforms.gap_scale=0.01", "workload.transforms.gap_cap=0.05", "workload.stagger=0.2",
]
POLICIES = ("round_robin", "cache_aware", "manual")


def fleet_set(policy: str, *more: str) -> list[str]:
    """--set arguments: the cut, and a fleet of three twin-timed emulator replicas behind `policy`."""
    extra = "".join(f", {m}" for m in more)
    return [*CUT, f"fleet={{replicas: 3, emulator: {{profile: tiny-vllm-cpu}}, router: {{policy: {policy}{extra}}}}}"]


def cli_run(folder: Path, overrides: list[str]) -> tuple[int, str]:
    """`agentload run` of the quickstart with `overrides`; its exit code and what it printed."""
    argv = ["run", str(QUICKSTART), "--no-progress", "-o", str(folder)]
    for item in overrides:
        argv += ["--set", item]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    return code, out.getvalue()


@pytest.fixture(scope="module")
def router() -> None:
    """sglang-router (the ``fleet`` extra), or a skip: a failure under CI (``CI=true``), which installs it."""
    if not launch.router_installed():
        reason = f"sglang-router is not installed: {launch.INSTALL_HINT}"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture(scope="module")
def policy_runs(router, tmp_path_factory) -> dict[str, tuple[Path, dict[str, Any], str]]:
    """The cut replayed once per policy, each on a fleet of its own: (folder, summary.json, printed)."""
    runs = {}
    for policy in POLICIES:
        folder = tmp_path_factory.mktemp("fleet") / policy
        code, printed = cli_run(folder, fleet_set(policy))
        assert code == 0, printed
        runs[policy] = folder, json.loads((folder / "summary.json").read_text()), printed
    return runs


@pytest.mark.parametrize("policy", POLICIES)
def test_every_call_is_accounted_for_by_the_replicas_counters(policy_runs, policy):
    folder, summary, _ = policy_runs[policy]
    fleet = summary["fleet"]
    calls = results.read_calls(folder)
    answered = [c for c in calls if c.status is not None]
    assert summary["calls"]["ok"] == summary["calls"]["planned"] == len(calls) == len(answered) == 84
    # client calls with a status == the sum of the replicas' vllm:request_success_total over the run
    assert fleet["client_calls"] == len(answered) == fleet["served"] == sum(r["served"] for r in fleet["replicas"])
    assert fleet["accounted"] is True and fleet["died"] == [] and fleet["policy"] == policy
    # each record names the replica that answered it, and each replica's count agrees with its own
    assert {c.replica for c in calls} <= {"r0", "r1", "r2"}
    for replica in fleet["replicas"]:
        mine = [c for c in calls if c.replica == replica["name"]]
        assert replica["client_calls"] == replica["served"] == len(mine)
        assert replica["prompt_tokens"] == sum(c.input_tokens for c in mine)
        assert replica["state"] == "up" and replica["url"].startswith("http://127.0.0.1:")
        assert (folder / "fleet" / f"{replica['name']}.log").exists()
        assert (folder / "fleet" / f"{replica['name']}_metrics.jsonl").read_text().count("request_success") >= 2
    assert sum(r["call_share"] for r in fleet["replicas"]) == pytest.approx(1.0)
    run = json.loads((folder / "run.json").read_text())
    assert [r["name"] for r in run["fleet"]["replicas"]] == ["r0", "r1", "r2"]
    assert run["fleet"]["router"]["policy"] == policy and "--policy" in run["fleet"]["router"]["command"]
    assert (folder / "fleet" / "router.log").exists()


def test_cache_aware_and_sticky_sessions_keep_more_prefix_hits_than_round_robin(policy_runs):
    share = {policy: policy_runs[policy][1]["fleet"]["prefix_hit_share"] for policy in POLICIES}
    print("fleet prefix-hit share:", {k: round(v, 3) for k, v in share.items()})
    assert share["cache_aware"] > share["round_robin"] + 0.05
    assert share["manual"] > share["round_robin"] + 0.05
    moves = {policy: policy_runs[policy][1]["fleet"]["moves"] for policy in POLICIES}
    # sticky session keys: a task's calls (sub-agents with their parent's key) never change replica
    assert moves["manual"]["moves"] == 0 and moves["manual"]["tasks"] > 0
    assert moves["round_robin"]["moves"] > moves["manual"]["moves"]


def test_the_console_prints_the_replica_table_and_the_fleet_line(policy_runs):
    _, summary, printed = policy_runs["round_robin"]
    assert "Fleet replicas (router policy: round_robin)" in printed
    for name in ("r0", "r1", "r2"):
        assert any(line.split("│")[1].strip() == name for line in printed.splitlines() if line.count("│") > 2)
    assert "fleet: replicas served 84 calls, the client got answers to 84 (all accounted)" in printed
    hit = summary["fleet"]["prefix_hit_share"]
    assert f"prefix-hit share {100 * hit:.1f}%" in printed
    assert "served by: a fleet of 3 emulator replicas behind sglang-router (round_robin): live against http" in printed


class _CountingSink:
    """Passes records on to the run's writer; calls `then` once `after` calls were recorded."""

    def __init__(self, sink: Any, after: int, then: Any) -> None:
        self.sink, self.after, self.then, self.calls = sink, after, then, 0

    def call(self, record: Any, gaps: Any = ()) -> None:
        self.sink.call(record, gaps)
        self.calls += 1
        if self.calls == self.after:
            self.then()

    def task(self, record: Any) -> None:
        self.sink.task(record)


def test_a_replica_killed_mid_run_fails_its_calls_the_others_go_on_and_the_summary_names_it(router, tmp_path):
    # no retries in the router: a call it sends to the dead replica fails instead of going elsewhere
    scenario = sc.load(QUICKSTART, [*fleet_set("round_robin", "args: [--disable-retries]"), "run.retries=0"])
    workload = sc.load_workload(scenario)
    held: dict[str, Any] = {}

    def kill_r1() -> None:
        held["killed_at"] = held["driver"].now()
        held["fleet"].replicas[1].server.process.kill()

    def on_driver(driver: Any) -> None:
        held["driver"] = driver
        driver.sink = _CountingSink(driver.sink, 12, kill_r1)

    executor = FleetLiveExecutor(handle_sigint=False, on_fleet=lambda fleet: held.update(fleet=fleet),
                                 on_driver=on_driver)
    folder = tmp_path / "run"
    with asyncio.Runner() as runner:
        summary, result = runner.run(execute_async(plan_run(scenario, workload, folder), executor))
    assert result.stop_reason == "completed"
    fleet = summary.fleet
    assert fleet is not None and fleet.died == ["r1"]
    r0, r1, r2 = fleet.replicas
    assert (r0.state, r1.state, r2.state) == ("up", "died", "up")
    assert "killed by SIGKILL" in (r1.note or "") and "fleet/r1.log" in (r1.note or "")
    calls = results.read_calls(folder)
    failed = [c for c in calls if not c.ok]
    # its calls failed (cut mid-stream, or refused through the router) and are counted as failed attempts
    print("failed after the kill:", dict(summary.errors), "replicas named:", sorted({str(c.replica) for c in failed}))
    assert failed and summary.calls.failed_attempts == len(failed)
    assert all(c.replica in (None, "r1") for c in failed)
    assert sum(summary.errors.values()) == len(failed)
    # the others went on serving after the kill
    after = [c for c in calls if c.ok and c.actual_send > held["killed_at"]]
    assert {c.replica for c in after} == {"r0", "r2"}
    assert not any(c.ok and c.replica == "r1" and c.actual_send > held["killed_at"] for c in calls)
    # everything launched is stopped at the end
    assert not any(r.server.running() for r in held["fleet"].replicas)
    assert not held["fleet"].router.running()


def test_a_replica_never_healthy_is_a_clear_error_naming_it_with_its_log(router, tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    booting = ("import os, sys, time; open(os.path.join(sys.argv[1], str(os.getpid())), 'w').close(); "
               "print('booting, never listening', flush=True); time.sleep(60)")
    server = json.dumps({"argv": [sys.executable, "-c", booting, str(pids)]})
    out = tmp_path / "run"
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["run", str(QUICKSTART), "--no-progress", "-o", str(out), "--set", CUT[0],
                     "--set", f"fleet={{replicas: 2, server: {server}, startup_timeout: 2}}"])
    text = err.getvalue()
    assert code == 2, text
    assert "fleet replica r0 not ready" in text and "within 2s" in text
    assert "booting, never listening" in text and "r0.log" in text and "(fleet replica r1 failed too)" in text
    assert not (out / "run.json").exists()
    started = [int(p.name) for p in pids.iterdir()]
    assert len(started) == 2
    for pid in started:  # stopped (and reaped) before the error was said
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_without_sglang_router_the_error_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(launch, "ROUTER_PACKAGE", "sglang_router_not_installed_here")
    out = tmp_path / "run"
    code = main(["run", str(QUICKSTART), "--no-progress", "-o", str(out), *sum((["--set", s] for s in fleet_set("manual")), [])])
    err = capsys.readouterr().err
    assert code == 2
    assert "sglang-router is not installed" in err and "pip install 'agentload[fleet]'" in err
    assert "quickstart.yaml" in err and "fleet.router" in err
    assert not (out / "fleet").exists()  # nothing was launched


@pytest.mark.parametrize("setting, words", [
    ("target={api: completions}", "refuses token-id prompts"),
    ("fleet.router.policy=least_outstanding", "sglang-router has no policy 'least_outstanding'"),
    ("fleet.router.eviction_interval=2.5", "takes whole seconds"),
    ("fleet.emulator.cache_blocks=100", "cache_blocks cannot be given"),
    ("fleet.router.url=http://127.0.0.1:9", "an existing router knows its own replicas"),
    ("run.workers=2", "a fleet runs from this process"),
    ("fleet.disaggregation={prefill: 1, decode: 2, kv_bytes_per_token: 1000, link_gbps: 100}", "on the twin only"),
])
def test_settings_a_live_fleet_cannot_take_are_clear_errors_before_anything_starts(router, tmp_path, capsys, setting,
                                                                                   words):
    out = tmp_path / "run"
    code = main(["run", str(QUICKSTART), "--no-progress", "-o", str(out),
                 *sum((["--set", s] for s in [*fleet_set("manual"), setting]), [])])
    err = capsys.readouterr().err
    assert code == 2 and words in err, err
    assert not (out / "fleet").exists()


def test_emulator_replicas_get_their_settings_as_options_and_their_name():
    argv = emulator_argv({"profile": "tiny-vllm-cpu", "seed": 3, "faults": ["http_503:0.25"]}, "r4")
    assert argv[:4] == [sys.executable, "-m", "simulator", "serve-emulator"]
    tail = argv[4:]
    assert tail == ["--host", "{host}", "--port", "{port}", "--profile", "tiny-vllm-cpu", "--seed", "3",
                    "--fault", "http_503:0.25", "--replica", "r4"]
    with pytest.raises(FleetError, match="fleet.emulator.*ttft"):
        emulator_argv({"ttft": -1}, "r0")


async def test_the_emulator_names_its_replica_in_every_response_errors_too():
    async with Emulator(EmulatorSettings(ttft=0, itl=0, replica="r7")) as named, \
            Emulator(EmulatorSettings(ttft=0, itl=0)) as plain, aiohttp.ClientSession() as session:
        body = {"model": "agentload-emulator", "prompt": [11, 12, 13], "max_tokens": 2, "stream": True}
        for url, want in ((named.url, "r7"), (plain.url, None)):
            async with session.get(f"{url}/v1/models") as resp:
                assert resp.headers.get(REPLICA_HEADER) == want
            async with session.post(f"{url}/v1/completions", json=body) as resp:
                assert resp.status == 200 and resp.headers.get(REPLICA_HEADER) == want
                assert b"[DONE]" in await resp.read()
            async with session.post(f"{url}/v1/completions", json={**body, "max_tokens": -1}) as resp:
                assert resp.status == 400 and resp.headers.get(REPLICA_HEADER) == want


@contextlib.asynccontextmanager
async def _capturing_emulator(seen: list[tuple[dict[str, str], dict[str, Any]]]):
    """An emulator (replica 'r7') that keeps each completion request's headers and body."""
    emulator = Emulator(EmulatorSettings(ttft=0, itl=0, replica="r7"))
    app = emulator.app()

    @web.middleware
    async def capture(request: web.Request, handler: Any) -> Any:
        if request.path.endswith("completions"):
            seen.append((dict(request.headers), json.loads(await request.read())))
        return await handler(request)

    app.middlewares.append(capture)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()
        await emulator.timing.close()


async def test_a_fleet_client_sends_session_keys_and_records_the_replica_a_plain_one_neither():
    seen: list[tuple[dict[str, str], dict[str, Any]]] = []
    sub = CallRequest("sub-1", "c", 0, Call(input_tokens=20, output_tokens=2), 0, "root-1")
    async with _capturing_emulator(seen) as url:
        fleet = Target(base_url=url, session_header=ROUTING_KEY_HEADER, session_user=True,
                       replica_header=REPLICA_HEADER, setup_url=url)
        async with Client(fleet, 0.0) as client:
            parent_key, _ = await client.send(sub, 0.0)
        own = Target(base_url=url, session_header="x-session", session_sub_agents="own", replica_header=REPLICA_HEADER)
        async with Client(own, 0.0) as client:
            own_key, _ = await client.send(sub, 0.0)
        async with Client(Target(base_url=url), 0.0) as client:
            plain, _ = await client.send(sub, 0.0)
    (h1, b1), (h2, b2), (h3, b3) = seen
    assert h1[ROUTING_KEY_HEADER] == "root-1" and b1["user"] == "root-1"  # a sub-agent carries its parent's key
    assert h2["x-session"] == "sub-1" and "user" not in b2
    assert ROUTING_KEY_HEADER not in h3 and "x-session" not in h3 and "user" not in b3
    assert parent_key.ok and parent_key.replica == own_key.replica == "r7"
    # outside a fleet the record is as it was: no replica read, none written
    assert plain.ok and plain.replica is None and "replica" not in record_dict(plain)
    assert record_dict(parent_key)["replica"] == "r7"


def test_the_twin_counts_finished_requests_as_vllm_request_success(tmp_path):
    from simulator.pipeline.execute import execute
    from simulator.pipeline.twin import TwinExecutor
    from simulator.sim.profile import load_profile

    scenario = sc.load(QUICKSTART, CUT[1:])
    workload = sc.load_workload(scenario)
    folder = tmp_path / "sim"
    summary, _ = execute(plan_run(scenario, workload, folder), TwinExecutor(load_profile("tiny-vllm-cpu")))
    samples = [json.loads(line) for line in (folder / "server_metrics.jsonl").read_text().splitlines()]
    assert samples[0]["request_success"] == 0 and samples[-1]["request_success"] == summary.calls.ok == 84
    assert summary.server["timeline"]["request_success_delta"] == 84


def _load_replica_middleware() -> Any:
    """The ASGI middleware module as vLLM's Python loads it: from its own folder, outside the package."""
    import importlib.util

    path = launch.REPLICA_MIDDLEWARE_DIR / (launch.REPLICA_MIDDLEWARE.split(".")[0] + ".py")
    spec = importlib.util.spec_from_file_location("agentload_replica_header_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


async def test_the_vllm_middleware_names_the_replica_on_every_response_start(monkeypatch):
    module = _load_replica_middleware()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    async def run(middleware: Any) -> list[dict[str, Any]]:
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await middleware({"type": "http"}, None, send)
        return sent

    monkeypatch.setenv("AGENTLOAD_REPLICA", "r3")
    monkeypatch.setenv("AGENTLOAD_REPLICA_HEADER", REPLICA_HEADER)
    start, body = await run(module.ReplicaHeader(app))
    assert start["headers"] == [(b"content-type", b"text/event-stream"), (REPLICA_HEADER.encode(), b"r3")]
    assert body == {"type": "http.response.body", "body": b"data: [DONE]\n\n"}
    monkeypatch.delenv("AGENTLOAD_REPLICA")
    start, _ = await run(module.ReplicaHeader(app))
    assert start["headers"] == [(b"content-type", b"text/event-stream")]


def test_vllm_replicas_are_launched_with_the_middleware_and_their_name(tmp_path):
    scenario = sc.load(QUICKSTART, [*CUT, f"fleet={{replicas: 2, vllm: {{model: tiny, args: [--seed, '1'], "
                                          f"env: {{PYTHONPATH: /opt/mine}}, python: {sys.executable}}}}}"])
    replicas = launch.replica_servers(scenario.fleet, tmp_path, scenario.resolve)
    assert [r.name for r in replicas] == ["r0", "r1"]
    server = replicas[1].server
    server.port = 8001
    command = server.command()
    assert command[command.index("--model") + 1] == str(QUICKSTART.parent / "tiny")
    assert command[-4:] == ["--seed", "1", "--middleware", launch.REPLICA_MIDDLEWARE]
    env = server.environment()
    assert env["AGENTLOAD_REPLICA"] == "r1" and env["AGENTLOAD_REPLICA_HEADER"] == REPLICA_HEADER
    assert env["PYTHONPATH"] == os.pathsep.join([str(launch.REPLICA_MIDDLEWARE_DIR), "/opt/mine"])
    assert server.log_path == tmp_path / "r1.log" and server.name == "fleet replica r1"


async def test_the_chat_preflight_sends_text_past_the_template_so_a_router_takes_it(monkeypatch):
    from simulator.live import client as client_module
    from simulator.live.prompts import ASSUMED_CALIBRATION, TextCalibration

    async def long_template(tokenize: Any, model: Any) -> TextCalibration:  # a template of 20 tokens, as vLLM's
        return dataclasses.replace(ASSUMED_CALIBRATION, overhead_tokens=20, source="tokenize")

    monkeypatch.setattr(client_module, "calibrate_text", long_template)
    seen: list[tuple[dict[str, str], dict[str, Any]]] = []
    async with _capturing_emulator(seen) as url:
        async with Client(Target(base_url=url, api="chat"), 0.0) as client:
            found = await client.preflight()
    assert found["model"] == "agentload-emulator"
    (_, body), = seen
    assert body["messages"][0]["content"].strip()  # sglang-router refuses an empty message (HTTP 400)
