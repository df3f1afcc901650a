"""The replay engine against the real vLLM server (CPU build, tiny model): shipped scenarios
(scenarios/vllm/) replayed end to end with token-id prompts and with chat, every call accounted for,
exact output lengths, prefix-cache hits seen by the server when the trace shares prefixes and not when
sharing is off, vLLM's own error responses recorded while the run goes on, and the server metrics
(/metrics timeline, per-task joins) in the result folder and the report.

Each replay uses its own `run.seed`, so prompts differ between tests and no test gets prefix-cache hits
from another one's prompts on the shared server.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from simulator import scenario as sc
from simulator.cli import main as cli_main
from simulator.live.client import PreflightError
from simulator.pipeline.live import run_scenario
from simulator.metrics import results
from simulator.metrics import server as server_metrics
from simulator.metrics.records import CallRecord, TaskRecord
from simulator.traces.native import write
from simulator.workload import Call, Task, Workload

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = REPO / "scenarios" / "vllm"
CONTEXT = 4096  # the launcher's --max-model-len
SESSIONS_CLOSER = "workload.stagger=0.25"
"""The Claude Code sessions 0.25 s apart instead of the shipped 1 s: still one after another, each replay
of them 1.5 s shorter (the calls, their prompts and the prefixes they share are the same)."""


@dataclass
class Replay:
    """One finished replay: what was planned and what the result folder holds."""

    workload: Workload
    summary: dict[str, Any]
    calls: list[CallRecord]
    tasks: list[TaskRecord]
    folder: Path

    @property
    def timeline(self) -> dict[str, Any]:
        return self.summary["server"]["timeline"]

    def planned(self) -> dict[tuple[str, int], Call]:
        return {(t.id, i): c for t in self.workload.all_tasks() for i, c in enumerate(t.calls)}


def replay(server, scenario_path: Path, folder: Path, *overrides: str, preflight: bool = True) -> Replay:
    """Run a scenario file against `server` through the runner API."""
    scenario = sc.load(scenario_path, [f"target.base_url={server.base_url}", *overrides])
    workload = sc.load_workload(scenario)
    summary, outcome = asyncio.run(run_scenario(scenario, workload, folder, handle_sigint=False, preflight=preflight))
    assert outcome.stop_reason == "completed"
    return Replay(workload, summary, results.read_calls(folder), results.read_tasks(folder), folder)


def assert_every_call_done(run: Replay, exact_input: bool = True) -> None:
    """One ok record per planned call, none failed; exact output (and prompt) lengths from usage."""
    planned = run.planned()
    assert len(run.calls) == len(planned) == run.summary["calls"]["planned"] == run.summary["calls"]["ok"]
    assert {(c.task_id, c.call_index) for c in run.calls} == set(planned)
    assert all(c.ok for c in run.calls), [c.error_message for c in run.calls if not c.ok][:3]
    assert run.summary["errors"] == {} and run.summary["calls"]["not_done"] == 0
    for c in run.calls:
        call = planned[(c.task_id, c.call_index)]
        assert c.output_tokens == c.requested_output_tokens == call.output_tokens
        assert call.input_tokens + call.output_tokens <= CONTEXT
        if exact_input:
            assert c.input_tokens == call.input_tokens
    assert len(run.tasks) == sum(1 for _ in run.workload.all_tasks())
    assert all(t.ok and t.calls == t.calls_planned for t in run.tasks)


def usage_hit_share(run: Replay) -> float:
    cached = [c for c in run.calls if c.ok]
    assert all(c.cached_tokens is not None for c in cached), "vLLM reports cached_tokens for every call"
    return sum(c.cached_tokens for c in cached) / sum(c.input_tokens for c in cached)


def assert_counters_match_usage(run: Replay) -> None:
    """The server's prefix-cache counters over the run equal what its usage said, call by call."""
    ok = [c for c in run.calls if c.ok]
    assert run.timeline["failed_scrapes"] == 0
    assert run.timeline["prefix_cache_queries_delta"] == sum(c.input_tokens for c in ok)
    assert run.timeline["prefix_cache_hits_delta"] == sum(c.cached_tokens for c in ok)
    assert run.timeline["generation_tokens_delta"] == sum(c.output_tokens for c in ok)


@pytest.fixture(scope="module")
def claude_code_run(vllm_server, tmp_path_factory) -> Replay:
    """The Claude Code scenario (first three sessions, token-id prompts) through `agentload run`."""
    folder = tmp_path_factory.mktemp("replay") / "claude-code"
    scenario = SCENARIOS / "claude-code.yaml"
    overrides = [f"target.base_url={vllm_server.base_url}", "run.max_tasks=3", "run.seed=1", SESSIONS_CLOSER]
    code = cli_main(["run", str(scenario), "-o", str(folder), "--no-progress",
                     *(arg for o in overrides for arg in ("--set", o))])
    assert code == 0
    workload = sc.load_workload(sc.load(scenario, overrides))
    summary = json.loads((folder / results.SUMMARY_FILE).read_text())
    return Replay(workload, summary, results.read_calls(folder), results.read_tasks(folder), folder)


def test_claude_code_token_ids_every_call_exact_and_prefix_cache_hit(claude_code_run):
    run = claude_code_run
    assert_every_call_done(run)
    assert len(run.calls) >= 10
    assert_counters_match_usage(run)
    # the sessions' prompts grow turn after turn on a shared prefix: most prompt tokens are hits
    assert run.timeline["prefix_cache_hit_share"] > 0.5
    assert usage_hit_share(run) > 0.5
    # every call after a task's first one reuses that task's earlier prompt
    later = [c for c in run.calls if c.call_index > 0]
    assert later and all(c.cached_tokens > 0 for c in later)


def test_sharing_off_keeps_prefix_cache_hits_near_zero(vllm_server, tmp_path, claude_code_run):
    run = replay(vllm_server, SCENARIOS / "claude-code.yaml", tmp_path / "r",
                 "run.max_tasks=3", "run.seed=3", "target.share_prefixes=false", SESSIONS_CLOSER)
    assert_every_call_done(run)
    assert_counters_match_usage(run)
    # the same calls as the shared run, and the same prompt lengths, but no prefix in common
    assert sorted((c.task_id, c.call_index, c.input_tokens) for c in run.calls) == \
        sorted((c.task_id, c.call_index, c.input_tokens) for c in claude_code_run.calls)
    assert run.timeline["prefix_cache_hit_share"] < 0.01
    assert usage_hit_share(run) < 0.01
    assert claude_code_run.timeline["prefix_cache_hit_share"] > 50 * max(run.timeline["prefix_cache_hit_share"], 1e-3)
    print(f"prefix-cache hit share: sharing on {claude_code_run.timeline['prefix_cache_hit_share']:.3f}, "
          f"off {run.timeline['prefix_cache_hit_share']:.3f}")


def test_claude_code_chat_every_call_exact_output_and_prefix_cache_hit(vllm_server, tmp_path):
    run = replay(vllm_server, SCENARIOS / "claude-code.yaml", tmp_path / "r",
                 "run.max_tasks=3", "run.seed=2", "target.api=chat", SESSIONS_CLOSER)
    # chat prompts are calibrated text: lengths near the plan, not exact
    assert_every_call_done(run, exact_input=False)
    planned = run.planned()
    for c in run.calls:
        want = planned[(c.task_id, c.call_index)].input_tokens
        assert abs(c.input_tokens - want) <= max(8, 0.05 * want), (c.task_id, c.call_index, c.input_tokens, want)
    assert_counters_match_usage(run)
    assert run.timeline["prefix_cache_hit_share"] > 0.5


def test_bursty_azure_sample_every_call_done_and_queue_seen(vllm_server, tmp_path):
    run = replay(vllm_server, SCENARIOS / "azure-bursty.yaml", tmp_path / "r", "run.seed=5")
    assert_every_call_done(run)
    assert len(run.tasks) == 40
    assert_counters_match_usage(run)
    # one-call tasks with unique prompts: nothing to reuse
    assert run.timeline["prefix_cache_hits_delta"] == 0
    rows = server_metrics.read_task_rows(run.folder)
    assert len(rows) == 40 and all(r["running_mean"] is not None for r in rows)
    assert run.timeline["num_requests_running"]["max"] >= 1
    assert sum(r["running_mean"] for r in rows) > 0
    assert run.summary["server"]["per_task"]["waiting_mean"]["count"] == 40


def test_subagents_every_call_done_with_per_task_server_load(vllm_server, tmp_path):
    # prompts and outputs at half the shipped scale keep the five agents' 53 calls to seconds on a CPU
    run = replay(vllm_server, SCENARIOS / "subagents.yaml", tmp_path / "r", "run.seed=4",
                 "workload.transforms.token_scale=0.01")
    assert_every_call_done(run)
    subs = [t for t in run.tasks if t.parent_id is not None]
    assert len(subs) == 4 and {t.parent_id for t in subs} == {"trace_0277"}
    assert run.summary["tasks"]["sub_tasks_finished"] == 4
    assert_counters_match_usage(run)
    assert run.timeline["prefix_cache_hit_share"] > 0.5
    rows = {r["task_id"]: r for r in server_metrics.read_task_rows(run.folder)}
    assert set(rows) == {t.task_id for t in run.tasks}
    for sub in subs:
        row = rows[sub.task_id]
        assert row["parent_id"] == "trace_0277"
        assert row["kv_cache_usage_mean"] is not None and 0 <= row["kv_cache_usage_mean"] <= 1
        assert row["cache_hit_share"] is not None and 0 <= row["cache_hit_share"] <= 1


def _error_workload() -> Workload:
    def chain(n: int, base: int, out: int = 6) -> tuple[Call, ...]:
        return tuple(Call(input_tokens=base + 128 * j, output_tokens=out, gap=0.01 if j else 0.0,
                          hash_ids=tuple(range(2 * j + 2)), block_size=64) for j in range(n))
    return Workload((
        Task("ok-a", chain(3, 256), arrival=0.0),
        Task("ok-b", chain(3, 300), arrival=0.05),
        # prompt longer than the context: vLLM rejects the second call
        Task("too-long", (Call(input_tokens=200, output_tokens=4), Call(input_tokens=5000, output_tokens=4, gap=0.01),
                          Call(input_tokens=300, output_tokens=4)), arrival=0.02),
        # bad parameters: no output tokens; more output than the context leaves
        Task("zero-output", (Call(input_tokens=150, output_tokens=0),), arrival=0.03),
        Task("over-budget", (Call(input_tokens=4000, output_tokens=200),), arrival=0.04),
    ))


def test_vllm_error_responses_are_recorded_and_the_run_goes_on(vllm_server, tmp_path):
    write(_error_workload(), tmp_path / "errors.jsonl")
    path = tmp_path / "errors.yaml"
    path.write_text("workload: {trace: errors.jsonl}\ntarget: {base_url: x, vocab_size: 1024}\n"
                    "run: {seed: 6, scrape_interval: 0.25}\n")
    run = replay(vllm_server, path, tmp_path / "r")
    failed = {c.task_id: c for c in run.calls if not c.ok}
    assert set(failed) == {"too-long", "zero-output", "over-budget"}
    for c in failed.values():
        assert c.status == 400 and c.error_class == "http_4xx"
    assert "maximum context length is 4096" in failed["too-long"].error_message
    assert "5000" in failed["too-long"].error_message and failed["too-long"].call_index == 1
    assert "max_tokens must be at least 1" in failed["zero-output"].error_message
    assert "min_tokens must be less than or equal to max_tokens" in failed["over-budget"].error_message
    # the other calls complete, exactly; the failed tasks stop at their failed call
    ok = [c for c in run.calls if c.ok]
    assert sorted((c.task_id, c.call_index) for c in ok) == \
        [("ok-a", 0), ("ok-a", 1), ("ok-a", 2), ("ok-b", 0), ("ok-b", 1), ("ok-b", 2), ("too-long", 0)]
    assert all(c.output_tokens == c.requested_output_tokens for c in ok)
    tasks = {t.task_id: t for t in run.tasks}
    assert tasks["ok-a"].ok and tasks["ok-b"].ok
    assert not tasks["too-long"].ok and tasks["too-long"].failed_call == 1
    assert run.summary["errors"] == {"http_4xx": 3}
    assert run.summary["calls"]["planned"] == 11 and run.summary["calls"]["ok"] == 7
    assert run.summary["calls"]["not_done"] == 4 and run.summary["tasks"]["failed"] == 3


def test_unknown_model_fails_the_preflight_or_every_call_with_vllms_message(vllm_server, tmp_path):
    overrides = ("run.max_tasks=2", "run.seed=7", "target.model=no-such-model", SESSIONS_CLOSER)
    with pytest.raises(PreflightError, match="'no-such-model' is not served by .*; it serves: ") as err:
        replay(vllm_server, SCENARIOS / "claude-code.yaml", tmp_path / "checked", *overrides)
    assert vllm_server.model_name in str(err.value)
    assert not (tmp_path / "checked").exists()
    run = replay(vllm_server, SCENARIOS / "claude-code.yaml", tmp_path / "r", *overrides, preflight=False)
    assert len(run.calls) == 2 and not any(c.ok for c in run.calls)
    for c in run.calls:
        assert c.status == 404 and c.error_class == "http_4xx" and "no-such-model" in c.error_message
    assert run.summary["tasks"]["failed"] == 2 and run.summary["calls"]["not_done"] == run.summary["calls"]["planned"]
    [top] = run.summary["error_messages"]
    assert top["count"] == 2 and "no-such-model" in top["message"]


def test_result_folder_holds_server_metrics_and_report_shows_them(claude_code_run, capsys):
    run = claude_code_run
    server = run.summary["server"]
    assert server["scraped"] and server["interval_s"] == 0.5
    samples = server_metrics.read_samples(run.folder)
    assert len(samples) == run.timeline["samples"] >= 2
    assert samples[0]["t"] == 0.0 and [s["t"] for s in samples] == sorted(s["t"] for s in samples)
    for key in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
                "prefix_cache_queries", "prefix_cache_hits", "prompt_tokens", "generation_tokens"):
        assert all(key in s for s in samples), key
    rows = server_metrics.read_task_rows(run.folder)
    assert len(rows) == len(run.tasks) == 3
    assert all(r["kv_cache_usage_mean"] is not None and r["waiting_mean"] is not None for r in rows)
    assert all(r["cache_hit_share"] is not None for r in rows)

    capsys.readouterr()
    assert cli_main(["report", str(run.folder)]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert f"Server /metrics: {run.timeline['samples']} scrapes every 0.5 s, 0 failed" in printed
    assert f"prefix-cache hit share (server counters): {100 * run.timeline['prefix_cache_hit_share']:.1f}%" in printed
    assert "Per-task server load, across 3 tasks" in printed and "mean KV-cache usage" in printed
