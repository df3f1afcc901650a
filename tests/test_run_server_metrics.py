"""Server metrics in live runs: the /metrics probe during `run_scenario`, the result files, the summary's
`server` section and its report; against the built-in emulator, given a /metrics route here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aiohttp import web

from simulator import scenario as sc
from simulator.cli import main
from simulator.emulator.server import Emulator
from simulator.emulator.settings import EmulatorSettings
from simulator.pipeline.live import run_scenario
from simulator.metrics import results
from simulator.metrics import server as server_metrics
from simulator.metrics.records import CallRecord, TaskRecord
from simulator.metrics.summary import Summary
from simulator.report.terminal import render
from simulator.traces.native import write
from simulator.workload import Call, SubTask, Task, Workload
from rich.console import Console

QUERIES_PER_REQUEST = 100
HITS_PER_REQUEST = 40


class MeteredEmulator(Emulator):
    """The emulator plus a vLLM-shaped /metrics whose counters follow the requests it served."""

    def app(self) -> web.Application:
        app = super().app()
        app.router.add_get("/metrics", self._metrics)
        return app

    async def _metrics(self, request: web.Request) -> web.Response:
        n = self.requests
        text = (
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{engine="0"}} {float(self.active_streams)}\n'
            "# TYPE vllm:num_requests_waiting gauge\n"
            'vllm:num_requests_waiting{engine="0"} 2.0\n'
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            'vllm:kv_cache_usage_perc{engine="0"} 0.25\n'
            "# TYPE vllm:prefix_cache_queries_total counter\n"
            f'vllm:prefix_cache_queries_total{{engine="0"}} {float(QUERIES_PER_REQUEST * n)}\n'
            "# TYPE vllm:prefix_cache_hits_total counter\n"
            f'vllm:prefix_cache_hits_total{{engine="0"}} {float(HITS_PER_REQUEST * n)}\n'
        )
        return web.Response(text=text, content_type="text/plain")


def workload() -> Workload:
    tasks = []
    for i in range(3):
        chain = tuple(Call(input_tokens=64 * (j + 2), output_tokens=5, gap=0.05 if j else 0.0,
                           hash_ids=tuple(range(j + 2)), block_size=64) for j in range(3))
        subs = (SubTask(0, Task(f"t{i}-sub", (Call(input_tokens=80, output_tokens=3),))),) if i == 0 else ()
        tasks.append(Task(f"t{i}", chain, arrival=0.05 * i, subtasks=subs))
    return Workload(tuple(tasks))


def scenario_at(tmp_path: Path, base_url: str | None, *overrides: str) -> sc.Scenario:
    write(workload(), tmp_path / "w.jsonl")
    target = f"target: {{base_url: '{base_url}'}}\n" if base_url else "emulator: {ttft: 0.005, itl: 0.002}\n"
    path = tmp_path / "s.yaml"
    path.write_text("workload: {trace: w.jsonl}\n" + target + "run: {scrape_interval: 0.05}\n")
    return sc.load(path, list(overrides))


async def test_run_scrapes_metrics_and_joins_them_with_tasks(tmp_path):
    emulator = MeteredEmulator(EmulatorSettings(ttft=0.01, itl=0.01, block_size=64))
    url = await emulator.start()
    try:
        scenario = scenario_at(tmp_path, url)
        out = tmp_path / "r"
        summary, _ = await run_scenario(scenario, sc.load_workload(scenario), out, handle_sigint=False)
    finally:
        await emulator.stop()
    planned_calls = workload().counts()[1]
    server = summary.server
    assert server["scraped"] is True and server["interval_s"] == 0.05
    timeline = server["timeline"]
    assert timeline["failed_scrapes"] == 0 and timeline["samples"] >= 2
    # the counters follow the emulator's request count: every call of the run, nothing before it
    assert timeline["prefix_cache_queries_delta"] == QUERIES_PER_REQUEST * planned_calls
    assert timeline["prefix_cache_hit_share"] == pytest.approx(HITS_PER_REQUEST / QUERIES_PER_REQUEST)
    assert timeline["kv_cache_usage_perc"] == {"mean": 0.25, "max": 0.25}
    assert timeline["num_requests_running"]["max"] >= 1

    samples = server_metrics.read_samples(out)
    assert len(samples) == timeline["samples"]
    times = [s["t"] for s in samples]
    assert times == sorted(times) and times[0] >= 0
    assert all("prefix_cache_hits" in s for s in samples)

    rows = server_metrics.read_task_rows(out)
    tasks = results.read_tasks(out)
    assert sorted(r["task_id"] for r in rows) == sorted(t.task_id for t in tasks) == \
        sorted(t.id for t in workload().all_tasks())
    assert sorted(r["parent_id"] or "" for r in rows) == ["", "", "", "t0"]
    assert all(r["kv_cache_usage_mean"] == pytest.approx(0.25) and r["waiting_mean"] == pytest.approx(2.0) for r in rows)
    # the emulator reports cached_tokens: each task's share is its cached over its prompt tokens
    calls = results.read_calls(out)
    for row in rows:
        mine = [c for c in calls if c.task_id == row["task_id"]]
        assert row["cached_tokens"] == sum(c.cached_tokens for c in mine)
        assert row["cache_hit_share"] == pytest.approx(row["cached_tokens"] / sum(c.input_tokens for c in mine))
    assert server["per_task"]["kv_cache_usage_mean"]["count"] == 4
    assert server["usage_cached_tokens"]["calls_reporting"] == planned_calls
    assert json.loads((out / "summary.json").read_text())["server"] == json.loads(json.dumps(server))


def test_report_shows_the_server_section(tmp_path, capsys):
    summary = {
        "tasks": {}, "calls": {},
        "server": server_metrics.server_section(
            [{"task_id": "a", "kv_cache_usage_mean": 0.5, "waiting_mean": 1.0, "running_mean": 3.0, "cache_hit_share": 0.75}],
            [CallRecord("a", "c", 0, 0, 0.0, 0.0, 1.0, True, input_tokens=400, cached_tokens=300)],
            {"samples": 7, "failed_scrapes": 0, "num_requests_running": {"mean": 2.5, "max": 4.0},
             "kv_cache_usage_perc": {"mean": 0.4, "max": 0.5}, "prefix_cache_queries_delta": 400.0,
             "prefix_cache_hits_delta": 300.0, "prefix_cache_hit_share": 0.75, "num_preemptions_delta": 2.0},
            interval_s=1.0),
    }
    console = Console(width=140, record=True)
    console.print(*render(Summary.model_validate(summary), console.width))
    text = console.export_text()
    assert "Server /metrics: 7 scrapes every 1 s, 0 failed" in text
    assert "KV-cache usage" in text and "50.00%" in text
    assert "prefix-cache hit share (server counters): 75.0%" in text
    assert "prefix-cache hit share (usage.cached_tokens): 75.0% (300 of 400" in text
    assert "prefix-cache queries (tokens) 400, prefix-cache hits (tokens) 300, preemptions 2" in text
    assert "Per-task server load, across 1 tasks" in text


def test_emulator_without_metrics_runs_on_with_a_note(tmp_path, capsys):
    out = tmp_path / "r"
    write(workload(), tmp_path / "w.jsonl")
    (tmp_path / "s.yaml").write_text("workload: {trace: w.jsonl}\nemulator: {ttft: 0.005, itl: 0.002}\n")
    assert main(["run", str(tmp_path / "s.yaml"), "-o", str(out), "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["calls"]["ok"] == summary["calls"]["planned"]
    server = summary["server"]
    assert server["scraped"] is False and server["timeline"] is None
    assert "built-in emulator" in server["note"] and "404" in server["note"]
    assert not (out / server_metrics.SERVER_METRICS_FILE).exists()
    # the per-task prefix-cache shares come from usage alone
    assert len(server_metrics.read_task_rows(out)) == 4
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "404" in printed and "prefix-cache hit share (usage.cached_tokens)" in printed


async def test_metrics_false_turns_the_probe_off(tmp_path):
    emulator = MeteredEmulator(EmulatorSettings(ttft=0.005, itl=0.002))
    url = await emulator.start()
    try:
        scenario = scenario_at(tmp_path, url, "target.metrics=false")
        summary, _ = await run_scenario(scenario, sc.load_workload(scenario), tmp_path / "r", handle_sigint=False)
    finally:
        await emulator.stop()
    assert summary.server["scraped"] is False
    assert summary.server["note"] == "server metrics off (target.metrics: false)"
    assert summary.calls.ok == summary.calls.planned


def test_task_rows_without_usage_or_timeline_are_empty_values():
    task = TaskRecord("a", "c", 0.0, 1.0, True, 1, 1, 0.5, 0.0, 0.0)
    call = CallRecord("a", "c", 0, 0, 0.0, 0.0, 1.0, True, input_tokens=10)
    [row] = server_metrics.task_rows([task], [call])
    assert row["cache_hit_share"] is None and row["kv_cache_usage_mean"] is None
    assert server_metrics.distribution([None, None]) is None
    d = server_metrics.distribution([1.0, 2.0, 3.0, 4.0])
    assert d["count"] == 4 and d["mean"] == 2.5 and d["max"] == 4.0 and d["p50"] == 2.5


@pytest.mark.parametrize("name", ["claude-code", "azure-bursty", "subagents"])
def test_shipped_vllm_scenarios_fit_the_tiny_models_context(name):
    root = Path(__file__).resolve().parents[1]
    scenario = sc.load(root / "scenarios" / "vllm" / f"{name}.yaml")
    assert scenario.target is not None and scenario.target.vocab_size == 1024 and scenario.target.metrics
    trace_paths = [(scenario.base_dir() / p).resolve() for p in scenario.workload.trace_paths()]
    assert all(p.is_relative_to(root) and p.exists() for p in trace_paths)
    workload = sc.load_workload(scenario)
    calls = list(workload.all_calls())
    assert calls and all(0 < c.input_tokens and c.input_tokens + c.output_tokens <= 3800 for c in calls)


async def test_gpu_sampling_adds_gpu_series_or_a_note_and_the_run_goes_on(tmp_path):
    emulator = MeteredEmulator(EmulatorSettings(ttft=0.005, itl=0.002))
    url = await emulator.start()
    try:
        scenario = scenario_at(tmp_path, url, "target.gpu_metrics=true")
        summary, _ = await run_scenario(scenario, sc.load_workload(scenario), tmp_path / "r", handle_sigint=False)
    finally:
        await emulator.stop()
    server = summary.server
    assert server["scraped"] is True and summary.calls.ok == summary.calls.planned
    if server.get("note"):  # no nvidia-ml-py, no driver or no GPU here
        assert server["note"].startswith("GPU sampl")
    else:
        assert "gpu0_util_perc" in server["timeline"]
