"""An 80-column terminal: every table of a run's summary and of a study fits, split where it must, and
every number stays whole (no ellipsis, no number folded across lines)."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from rich.console import Console

import report_folders as rf
from simulator.metrics.summary import Summary
from simulator.report.cells import number
from simulator.report.study_terminal import print_study
from simulator.report.terminal import print_summary
from simulator.study.model import load_study

WIDTH = 80


def terminal(width: int = WIDTH) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=width, force_terminal=True, color_system=None), out


def long_summary() -> Summary:
    """A long run's summary: big counts, slow calls, several task classes with long names."""
    pcts = ("mean", "p50", "p90", "p95", "p99", "p99.9")
    return Summary.model_validate({
        "duration": 98765.4321, "request_throughput": 1234.5678, "output_throughput": 987654.321,
        "total_token_throughput": 12345678.9,
        **{f"{stat}_{metric}_ms": 1234567.891 * (i + 1) for i, stat in enumerate(pcts)
           for metric in ("ttft", "tpot", "itl", "e2el")},
        "calls": {"attempts": 123456789, "ok": 123456000, "failed_attempts": 789, "planned": 123456789},
        "tasks": {"judged": 9876600, "completed": 9876543, "failed": 40, "cancelled": 17, "not_started": 0,
                  "throughput_per_hour": 4567890.12, "goodput_per_hour": 4000000.5,
                  "completion_time_s": {p: 87654.321 for p in pcts},
                  "by_class": {name: {"judged": 4938300, "completed": 4938271, "failed": 20, "cancelled": 9,
                                      "not_started": 0, "throughput_per_hour": 2283945.06,
                                      "completion_time_s": {"p50": 76543.21}}
                               for name in ("claude-code-subagent", "tracelab-coding-round")}},
        "errors": {"http_5xx": 789},
        "slo": {"task_s": {"percentiles": {"p90": {"bound": 600.0, "measured": None, "met": False}},
                           "item_bound": 600.0, "met": False, "judged": 9876600, "not_completed": 57}},
    })


def lines_of(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines()]


def whole(value: float, text: str) -> bool:
    """Whether `value`, as the report formats it, stands in `text` as one token."""
    return re.search(rf"(?<![\d.,]){re.escape(number(value))}(?![\d,])", text) is not None


def test_a_run_summary_fits_80_columns_with_every_number_whole():
    console, out = terminal()
    summary = long_summary()
    print_summary(summary, console)
    text = out.getvalue()
    assert max(len(line) for line in lines_of(text)) <= WIDTH
    assert "…" not in text
    for value in (summary.ttft.p99_9, summary.e2el.mean, summary.tasks.throughput_per_hour,
                  summary.tasks.goodput_per_hour, summary.tasks.completion_time_s.p99_9,
                  summary.tasks.by_class["claude-code-subagent"].throughput_per_hour):
        assert whole(value, text), number(value)
    for count in ("9,876,600", "9,876,543", "4,938,300", "123,456,000"):
        assert count in text
    # a table too wide for the screen was split, its label column repeated
    assert "(cont.)" in text and text.count("claude-code-subagent") >= 2


def test_a_study_fits_80_columns_with_every_number_whole():
    console, out = terminal()
    study, _ = load_study(rf.STUDY_FIXTURE)
    print_study(study, console)
    text = out.getvalue()
    assert max(len(line) for line in lines_of(text)) <= WIDTH
    assert "…" not in text and "e+" not in text and "e-0" not in text
    for c in study.configs:
        for value in (c.objective.value, c.task_p95_s, c.ttft_p95_ms):
            if value is not None:
                assert whole(value, text), (c.name, value)
        if c.cost and c.cost.self_hosted_per_task:
            assert f"${number(c.cost.self_hosted_per_task)}" in text
        assert c.name in text


def test_the_cli_on_an_80_column_terminal_cuts_nothing(tmp_path):
    # rich takes the width from COLUMNS and treats the output as a terminal with TTY_COMPATIBLE
    folder = tmp_path / "long"
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps(long_summary().to_dict()))
    env = {**os.environ, "COLUMNS": str(WIDTH), "TTY_COMPATIBLE": "1", "NO_COLOR": "1"}
    done = subprocess.run([sys.executable, "-m", "simulator", "report", str(folder)], capture_output=True, text=True,
                          env=env, cwd=Path(__file__).resolve().parents[1], check=True)
    text = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout)
    assert max(len(line) for line in lines_of(text)) <= WIDTH and "…" not in text
    assert "87,654" in text and "4,567,890" in text
