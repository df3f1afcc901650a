"""`agentload run` and `agentload report` end to end against the built-in emulator."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from simulator import scenario as sc
from simulator.cli import main
from simulator.pipeline.live import run_scenario
from simulator.metrics import histograms as H
from simulator.metrics import results
from simulator.report.folder_data import load_folder
from simulator.traces.native import write
from simulator.workload import Call, SubTask, Task, Workload

ROOT = Path(__file__).resolve().parents[1]


def tiny_workload(n: int = 4, calls: int = 3, out: int = 6) -> Workload:
    tasks = []
    for i in range(n):
        chain = tuple(Call(input_tokens=64 * (j + 2), output_tokens=out, gap=0.01 if j else 0.0,
                           hash_ids=tuple(range(j + 2)), block_size=64) for j in range(calls))
        subs = (SubTask(0, Task(f"t{i}-sub", (Call(input_tokens=80, output_tokens=4),)), wait=i % 2 == 0),) if i < 2 else ()
        tasks.append(Task(f"t{i}", chain, arrival=0.02 * i, task_class="odd" if i % 2 else "even", subtasks=subs))
    return Workload(tuple(tasks))


def scenario_file(tmp_path: Path, extra: str = "", workload: Workload | None = None) -> Path:
    write(workload or tiny_workload(), tmp_path / "tiny.jsonl")
    path = tmp_path / "tiny.yaml"
    path.write_text(
        "workload:\n  trace: tiny.jsonl\n"
        "emulator: {ttft: 0.005, itl: 0.001}\n"
        "slo:\n  ttft_ms: {p99: 1000}\n  task_s: {p90: 30}\n" + extra
    )
    return path


def test_run_writes_results_with_every_call_accounted_for(tmp_path, capsys):
    out = tmp_path / "result"
    code = main(["run", str(scenario_file(tmp_path)), "-o", str(out), "--no-progress"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    workload = tiny_workload()
    _, planned_calls, _ = workload.counts()
    assert summary["partial"] is False and summary["stop_reason"] == "completed"
    assert summary["calls"]["planned"] == planned_calls == summary["calls"]["ok"] == summary["completed"]
    assert summary["calls"]["not_done"] == 0 and summary["errors"] == {}
    assert summary["tasks"]["completed"] == 4 and summary["tasks"]["sub_tasks_finished"] == 2
    assert set(summary["tasks"]["by_class"]) == {"odd", "even"}
    assert summary["total_output_tokens"] == sum(c.output_tokens for c in workload.all_calls())
    calls = results.read_calls(out)
    assert len(calls) == planned_calls and all(c.ok for c in calls)
    assert len(results.read_tasks(out)) == 6
    hist = H.load(out / "histograms.json")
    assert hist["ttft"].get_total_count() == planned_calls
    assert hist["itl"].get_total_count() == sum(c.itl_count for c in calls)
    assert summary["slo"]["ttft_ms"]["met"] in (True, False)
    captured = capsys.readouterr()
    assert "TTFT" in captured.out and str(out) in captured.out
    # what timing the emulator ran: in the banner, run.json and the report's "served by"
    assert "target: built-in emulator, fixed TTFT 5 ms, ITL 1 ms;" in captured.err
    info = json.loads((out / results.RUN_FILE).read_text())
    assert info["emulator"] is True
    assert info["emulator_timing"] == {"kind": "fixed", "text": "fixed TTFT 5 ms, ITL 1 ms", "ttft": 0.005,
                                       "itl": 0.001, "zero_latency": False}
    assert load_folder(out).target() == "built-in emulator, fixed TTFT 5 ms, ITL 1 ms"
    assert "served by: built-in emulator, fixed TTFT 5 ms, ITL 1 ms" in captured.out


def test_report_reprints_and_rebuilds_after_a_crash(tmp_path, capsys):
    out = tmp_path / "result"
    assert main(["run", str(scenario_file(tmp_path)), "-o", str(out), "--no-progress"]) == 0
    written = json.loads((out / "summary.json").read_text())
    capsys.readouterr()
    assert main(["report", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["p99_ttft_ms"] == written["p99_ttft_ms"]
    assert main(["report", str(out)]) == 0
    assert "Per task" in capsys.readouterr().out
    (out / "summary.json").unlink()
    assert main(["report", str(out), "--json"]) == 0
    rebuilt = json.loads(capsys.readouterr().out)
    assert rebuilt["partial"] is True and "rebuilt" in rebuilt["stop_reason"]
    for key in ("completed", "total_output_tokens", "p99_ttft_ms", "p99_itl_ms", "p50_e2el_ms"):
        assert rebuilt[key] == written[key], key
    assert rebuilt["tasks"]["completion_time_s"] == written["tasks"]["completion_time_s"]


def test_run_refuses_a_used_result_folder_and_bad_input(tmp_path, capsys):
    out = tmp_path / "result"
    scen = scenario_file(tmp_path)
    assert main(["run", str(scen), "-o", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["run", str(scen), "-o", str(out), "--no-progress"]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert main(["run", str(scen), "--set", "run.warmup=-1"]) == 2
    assert "run.warmup" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "nothing")]) == 2


def test_missing_api_key_variable_is_an_input_error(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("AGENTLOAD_TEST_KEY", raising=False)
    scen = scenario_file(tmp_path)
    text = scen.read_text().replace("emulator: {ttft: 0.005, itl: 0.001}\n", "")
    scen.write_text(text + "target: {base_url: 'http://127.0.0.1:9', api_key_env: AGENTLOAD_TEST_KEY}\n")
    assert main(["run", str(scen), "-o", str(tmp_path / "r"), "--no-progress"]) == 2
    assert "AGENTLOAD_TEST_KEY" in capsys.readouterr().err


async def test_sigint_ends_the_run_with_partial_results(tmp_path):
    # long calls (200 tokens at 5 ms) so the interruption lands while calls are in flight
    workload = tiny_workload(n=6, calls=4, out=200)
    scen = sc.load(scenario_file(tmp_path, workload=workload), ["emulator.itl=0.005"])
    out = tmp_path / "result"
    interrupted = False

    def on_progress(progress) -> None:
        nonlocal interrupted
        if not interrupted and progress.counters.calls_ok >= 2:
            interrupted = True
            os.kill(os.getpid(), signal.SIGINT)  # handled by the run's SIGINT handler

    summary, outcome = await run_scenario(scen, sc.load_workload(scen), out, on_progress=on_progress)
    assert interrupted and outcome.stop_reason == "interrupted"
    assert summary.partial is True and (out / "summary.json").exists()
    calls = results.read_calls(out)
    cancelled = [c for c in calls if c.error_class == "cancelled"]
    assert cancelled, "calls in flight at the interruption are recorded as cancelled"
    assert summary.calls.attempts == len(calls)
    assert summary.calls.ok == sum(1 for c in calls if c.ok) >= 2
    assert summary.calls.ok + summary.calls.not_done == workload.counts()[1]
    tasks = results.read_tasks(out)
    assert any(t.error_class == "cancelled" for t in tasks)
    assert summary.tasks.cancelled >= 1


def test_quickstart_runs_shortened(tmp_path, capsys):
    out = tmp_path / "quick"
    code = main(["run", str(ROOT / "scenarios" / "quickstart.yaml"), "-o", str(out), "--no-progress",
                 "--set", "run.max_tasks=2", "--set", "workload.stagger=0.1",
                 "--set", "workload.transforms.gap_cap=0.05"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["calls"]["planned"] == summary["calls"]["ok"] + summary["calls"]["not_done"]
    assert summary["calls"]["not_done"] == 0 and summary["tasks"]["planned"] == 2


def test_measurement_window_follows_warmup_and_cooldown(tmp_path):
    from simulator.errors import InputError
    from simulator.pipeline.plan import measurement_window

    path = scenario_file(tmp_path)
    workload = tiny_workload()  # last arrival 0.06 s
    assert measurement_window(sc.load(path), workload).end is None
    window = measurement_window(sc.load(path, ["run.warmup=0.01", "run.cooldown=0.02"]), workload)
    assert (window.start, window.end) == (0.01, pytest.approx(0.04))
    assert measurement_window(sc.load(path, ["run.duration=10", "run.cooldown=2"]), workload).end == 8
    with pytest.raises(InputError) as err:
        measurement_window(sc.load(path, ["run.warmup=1", "run.cooldown=0.05"]), workload)
    assert err.value.path == "run.cooldown"


def test_progress_view_and_partial_banner_render():
    from rich.console import Console

    from simulator.pipeline.live import Progress
    from simulator.metrics.results import LiveCounters
    from simulator.metrics.summary import Summary
    from simulator.report.progress import ProgressView
    from simulator.report.terminal import render

    view = ProgressView()
    counters = LiveCounters(tasks_done=3, calls_ok=10, calls_failed=1, output_tokens=500)
    counters.errors["http_5xx"] += 1
    view.update(Progress(1.0, 8, 5, 2, counters))
    counters.output_tokens = 1500
    view.update(Progress(3.0, 8, 5, 2, counters))
    console = Console(width=200, record=True)
    console.print(view)
    line = console.export_text()
    assert "tasks 3/8 done, 2 in flight, 3 to arrive" in line and "500 out tok/s" in line and "http_5xx 1" in line
    console.print(*render(Summary(partial=True, stop_reason="interrupted")))
    assert "PARTIAL (interrupted)" in console.export_text()
