"""The emulator backed by the server twin in real time (`simulator.emulator.twin_timing`): a live replay
against it agrees with `simulate` on the same profile; queueing, prefix hits and preemption show."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
import yaml

from simulator import scenario as sc
from simulator.emulator.prefix_cache import block_hash_ids
from simulator.emulator.server import Emulator
from simulator.emulator.settings import EmulatorSettings
from simulator.emulator.twin_timing import TwinTiming
from simulator.errors import InputError
from simulator.live.probes import parse_metrics
from simulator.pipeline.live import run_scenario
from simulator.metrics import results
from simulator.sim.profile import load_profile
from simulator.pipeline.twin import simulate_to_folder
from simulator.workload import Call, Task, Workload

BLOCK = 16
# Steps long enough (>= 20 ms) that the event loop's jitter on a busy machine is small beside them.
PROFILE = {
    "name": "test-twin",
    "scheduler": {"max_num_seqs": 8, "max_num_batched_tokens": 512, "max_model_len": 2048},
    "kv_cache": {"block_size": BLOCK, "num_blocks": 4000},
    "step_time": {"fixed": 0.02, "per_token": 0.0001, "per_decode_seq": 0.001},
}


def write_profile(folder: Path, **changes) -> Path:
    data = yaml.safe_load(yaml.safe_dump(PROFILE))
    for section, values in changes.items():
        data[section].update(values)
    path = folder / "profile.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def conversation(task: str, arrival: float, shared: int) -> Task:
    """Three turns, each prompt extending the last; the first `shared` blocks are every task's own
    system prompt (hash ids 1..shared)."""
    system = tuple(range(1, shared + 1))
    own = tuple(hash((task, i)) & 0xFFFFFF for i in range(12))
    calls = tuple(
        Call(input_tokens=(shared + 4 * (turn + 1)) * BLOCK + 5, output_tokens=12 + 4 * turn, gap=0.1 if turn else 0.0,
             hash_ids=system + own[: 4 * (turn + 1)], block_size=BLOCK)
        for turn in range(3)
    )
    return Task(task, calls, arrival=arrival)


def scenario_for(folder: Path, profile: Path) -> sc.Scenario:
    text = f"workload: {{trace: unused.jsonl}}\nemulator: {{profile: {profile.name}}}\ntarget: null\n"
    return sc.parse(text, str(folder / "scenario.yaml"))


def by_key(calls):
    return {(c.task_id, c.call_index, c.attempt): c for c in calls}


def test_live_replay_on_the_twin_emulator_agrees_with_simulate(tmp_path):
    profile_path = write_profile(tmp_path)
    workload = Workload(tuple(conversation(f"t{i}", 0.4 * i, shared=8) for i in range(4)))
    scenario = scenario_for(tmp_path, profile_path)
    live_summary, outcome = asyncio.run(run_scenario(scenario, workload, tmp_path / "live", handle_sigint=False))
    sim_summary, _ = simulate_to_folder(workload, load_profile(profile_path), tmp_path / "sim")
    live, sim = by_key(results.read_calls(tmp_path / "live")), by_key(results.read_calls(tmp_path / "sim"))
    assert set(live) == set(sim) and len(live) == 12
    for key, s in sim.items():
        r = live[key]
        assert r.ok and s.ok, key
        assert r.output_tokens == s.output_tokens == r.requested_output_tokens, key
        assert r.cached_tokens == s.cached_tokens, key
        # a few engine steps (20-40 ms each) of slack: on a busy machine the event loop runs late at
        # times, which shifts the client's next sends and so the batches they join
        assert r.ttft == pytest.approx(s.ttft, abs=0.1), key
        assert r.latency == pytest.approx(s.latency, abs=0.1, rel=0.15), key
    assert sum(c.output_tokens for c in live.values()) == sum(c.output_tokens for c in sim.values())
    total_live, total_sim = sum(c.latency for c in live.values()), sum(c.latency for c in sim.values())
    assert total_live == pytest.approx(total_sim, rel=0.1)
    # every later conversation finds the shared system prompt; later turns find their own history
    assert all(live[(f"t{i}", 0, 0)].cached_tokens == 8 * BLOCK for i in range(1, 4))
    assert all(live[(f"t{i}", 2, 0)].cached_tokens >= (8 + 4) * BLOCK for i in range(4))
    # the run's /metrics probe read the twin's counters
    server = live_summary["server"]
    assert server.get("note") is None, server


async def _stream(session: aiohttp.ClientSession, url: str, prompt: list[int], out: int) -> tuple[float, float, int, int]:
    """(ttft, e2e, tokens, cached) of one streamed completion, on the loop's clock."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    first, tokens, cached = None, 0, None
    body = {"prompt": prompt, "max_tokens": out, "stream": True, "stream_options": {"include_usage": True}}
    async with session.post(url + "/v1/completions", json=body) as response:
        assert response.status == 200
        async for line in response.content:
            if not line.startswith(b"data: {"):
                continue
            chunk = yaml.safe_load(line[6:])
            if chunk["choices"]:
                tokens += 1
                if first is None:
                    first = loop.time() - start
            if chunk.get("usage"):
                cached = chunk["usage"]["prompt_tokens_details"]["cached_tokens"]
    return first, loop.time() - start, tokens, cached


async def _serve(settings: EmulatorSettings, requests: list[tuple[list[int], int]]):
    emulator = Emulator(settings)
    url = await emulator.start()
    try:
        async with aiohttp.ClientSession() as session:
            results_ = await asyncio.gather(*(_stream(session, url, p, n) for p, n in requests))
            metrics = parse_metrics(await (await session.get(url + "/metrics")).text())
            stats = await (await session.get(url + "/agentload/stats")).json()
    finally:
        await emulator.stop()
    return results_, metrics, stats


def test_requests_beyond_max_num_seqs_queue(tmp_path):
    profile = write_profile(tmp_path, scheduler={"max_num_seqs": 2})
    prompts = [[100 + i] * 40 for i in range(6)]
    done, metrics, stats = asyncio.run(_serve(EmulatorSettings(profile=str(profile)), [(p, 10) for p in prompts]))
    ttfts = sorted(r[0] for r in done)
    e2es = sorted(r[1] for r in done)
    assert all(r[2] == 10 for r in done)
    assert stats["twin"]["max_running"] == 2
    # the last two waited for two rounds of two 10-token requests (>= 20 steps of >= 20 ms)
    assert ttfts[-1] > e2es[1]
    assert metrics["num_requests_running"] == 0 and metrics["generation_tokens"] == 60


def test_shared_prefixes_hit_the_twins_prefix_cache(tmp_path):
    profile = write_profile(tmp_path)
    system = list(range(10, 10 + 10 * BLOCK))

    async def two_turns():
        settings = EmulatorSettings(profile=str(profile))
        emulator = Emulator(settings)
        url = await emulator.start()
        try:
            async with aiohttp.ClientSession() as session:
                first = await _stream(session, url, system + [7] * 20, 5)
                second = await _stream(session, url, system + [8] * 20, 5)
                other = await _stream(session, url, [9] * len(system), 5)
                metrics = parse_metrics(await (await session.get(url + "/metrics")).text())
        finally:
            await emulator.stop()
        return first, second, other, metrics

    first, second, other, metrics = asyncio.run(two_turns())
    assert first[3] == 0 and other[3] == 0
    assert second[3] == 10 * BLOCK
    assert metrics["prefix_cache_hits"] == 10 * BLOCK
    assert metrics["prefix_cache_queries"] == 3 * len(system) + 40


def test_a_tiny_kv_cache_preempts_and_every_request_still_completes(tmp_path):
    # 24 blocks of 16: six 60-token requests fit at admission, not with 100 generated tokens each
    profile = write_profile(tmp_path, kv_cache={"num_blocks": 24}, scheduler={"max_model_len": 384})
    prompts = [[200 + i] * 60 for i in range(6)]
    done, metrics, stats = asyncio.run(_serve(EmulatorSettings(profile=str(profile)), [(p, 100) for p in prompts]))
    assert all(r[2] == 100 for r in done)
    assert stats["twin"]["preemptions"] > 0
    assert metrics["num_preemptions"] == stats["twin"]["preemptions"]
    # as vLLM counts them: each prompt queried once, at its first admission, none again after preemption
    assert metrics["prefix_cache_queries"] == 6 * 60


def test_block_hash_ids_follow_equal_token_prefixes():
    a = block_hash_ids(list(range(50)), 16)
    b = block_hash_ids(list(range(32)) + [0] * 18, 16)
    assert len(a) == 3 and a[:2] == b[:2] and a[2] != b[2]
    assert block_hash_ids(list(range(15)), 16) == []
    # a block equal in content at the same position but after a different prefix is a different block
    assert block_hash_ids([1] * 16 + [5] * 16, 16)[1] != block_hash_ids([2] * 16 + [5] * 16, 16)[1]


def test_the_profile_sets_the_context_length_and_bad_profiles_are_input_errors(tmp_path):
    profile = write_profile(tmp_path)
    emulator = Emulator(EmulatorSettings(profile=str(profile), max_model_len=131072))
    assert isinstance(emulator.timing, TwinTiming) and emulator.settings.max_model_len == 2048
    with pytest.raises(InputError) as info:
        sc.parse("workload: {trace: x.jsonl}\nemulator:\n  profile: no-such-profile\n", str(tmp_path / "s.yaml"))
    assert info.value.path == "emulator.profile" and info.value.line == 3
    scenario = scenario_for(tmp_path, profile)
    assert scenario.emulator.profile == str(profile)  # resolved against the scenario's folder


def test_quickstart_runs_a_twin_whose_context_holds_every_call():
    root = Path(__file__).resolve().parents[1]
    scenario = sc.load(root / "scenarios" / "quickstart.yaml")
    profile = load_profile(scenario.emulator.profile)
    workload = sc.load_workload(scenario)
    assert max(c.input_tokens + c.output_tokens for c in workload.all_calls()) <= profile.scheduler.max_model_len


def test_serve_emulator_takes_a_profile_and_rejects_bad_ones(tmp_path):
    import argparse

    from simulator.cli import serve_emulator

    parser = argparse.ArgumentParser()
    serve_emulator.register(parser.add_subparsers())
    args = parser.parse_args(["serve-emulator", "--profile", "tiny-vllm-cpu"])
    assert serve_emulator.settings_from(args).profile == "tiny-vllm-cpu"
    with pytest.raises(InputError):
        serve_emulator.settings_from(parser.parse_args(["serve-emulator", "--profile", "no-such-profile"]))
    with pytest.raises(InputError) as info:
        serve_emulator.settings_from(parser.parse_args(["serve-emulator", "--profile", "tiny-vllm-cpu", "--ttft", "0.1"]))
    assert info.value.field == "--profile"
