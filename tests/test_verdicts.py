"""Honest verdicts end to end: tasks a run meant to run but did not complete (cut off by run.drain, never
started) count against a task SLO, the exit code says so with --fail-on-slo, and the terminal shows the
counts summary.json holds."""

from __future__ import annotations

import json
import re
from pathlib import Path

from simulator.cli import main
from simulator.traces.native import write
from simulator.workload import Call, Task, Workload


def drained_workload() -> Workload:
    """Six tasks: two quick ones, four whose second call comes after a minute of tool time, which a short
    run.drain cuts off."""
    tasks = []
    for i in range(6):
        slow = i % 3 != 0
        calls = (Call(input_tokens=64, output_tokens=4),
                 Call(input_tokens=96, output_tokens=4, gap=60.0 if slow else 0.01))
        tasks.append(Task(f"t{i}", calls, arrival=0.01 * i))
    return Workload(tuple(tasks))


def scenario(tmp_path: Path) -> Path:
    write(drained_workload(), tmp_path / "drained.jsonl")
    path = tmp_path / "drained.yaml"
    path.write_text("workload: {trace: drained.jsonl}\n"
                    "emulator: {ttft: 0.002, itl: 0.001}\n"
                    "run: {drain: 0.5}\n"
                    "slo: {task_s: {p50: 30}}\n")
    return path


def test_a_run_whose_tasks_the_drain_cut_off_misses_its_task_slo(tmp_path, capsys):
    out = tmp_path / "result"
    code = main(["run", str(scenario(tmp_path)), "-o", str(out), "--no-progress", "--fail-on-slo"])
    summary = json.loads((out / "summary.json").read_text())
    tasks = summary["tasks"]
    assert (tasks["judged"], tasks["completed"], tasks["failed"], tasks["cancelled"], tasks["not_started"]) == (6, 2, 0, 4, 0)
    # the completed ones were all quick: only the four cut off make the p50 of 6 (the 3rd) miss
    check = summary["slo"]["task_s"]
    assert check["met"] is False and check["percentiles"]["p50"]["measured"] is None and check["not_completed"] == 4
    assert code == 4
    printed = capsys.readouterr()
    text = printed.out + printed.err
    assert "p50 not reached (4 of 6 tasks did not complete)/30 MISSED" in text
    assert "6 judged (arriving in the window): 2 completed, 0 failed, 4 cancelled, 0 not started" in text
    row = next(line for line in printed.out.splitlines() if line.startswith("│ all "))
    assert re.findall(r"[\d,.-]+", row)[:5] == ["6", "2", "0", "4", "0"], row
