"""Tables for CI logs and pipes: printed where no terminal is, every cell stays whole however narrow
the environment says the screen is; comparisons of several folders in the terminal."""

from __future__ import annotations

import json
import re

import report_folders as rf
from simulator.cli import main


def big_summary() -> dict:
    """A summary.json whose figures are long numbers (a long run's counts, slow calls)."""
    return {
        "duration": 98765.4321, "request_throughput": 1234.5678, "output_throughput": 987654.321,
        "total_token_throughput": 12345678.9,
        **{f"{stat}_{metric}_ms": 1234567.891 * (i + 1) for i, stat in enumerate(("mean", "p50", "p90", "p95", "p99", "p99.9"))
           for metric in ("ttft", "tpot", "itl", "e2el")},
        "calls": {"attempts": 123456789, "ok": 123456000, "failed_attempts": 789},
        "tasks": {"completed": 9876543, "throughput_per_hour": 4567890.12,
                  "completion_time_s": {p: 87654.321 for p in ("mean", "p50", "p90", "p95", "p99", "p99.9")},
                  "by_class": {name: {"completed": 4938271, "completion_time_s": {"p50": 76543.21}}
                               for name in ("a-very-long-agent-class-name", "another-long-class-name")}},
        "errors": {"http_5xx": 789},
    }


def test_no_cell_is_cut_when_output_is_not_a_terminal(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    folder = tmp_path / "big"
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps(big_summary()))
    assert main(["report", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "…" not in out
    for number in ("1,234,568", "7,407,407", "87,654", "4,567,890", "9,876,543", "a-very-long-agent-class-name"):
        assert number in out, number
    assert max(len(line) for line in out.splitlines()) > 40  # wider than the 'screen': nothing folded


def test_compare_of_three_folders_prints_each_and_the_ratios_to_the_first(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "60")
    folders = []
    for name, scale in (("base", 1.0), ("faster", 0.5), ("slower", 2.0)):
        folder = tmp_path / name
        folder.mkdir()
        summary = big_summary()
        summary["p99_ttft_ms"] = 1000.0 * scale
        (folder / "summary.json").write_text(json.dumps(summary))
        folders.append(str(folder))
    assert main(["compare", *folders]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "TTFT p99 " in line)
    assert re.search(r"1,000\s+500\s+2,000\s+0\.500 \*\s+2\.000 \*", row), row  # both past 10%: marked
    assert "B/A" in out and "C/A" in out and "…" not in out
    assert out.count("no workload fingerprint") == 3  # summaries alone: nothing to check the workload with


def test_study_folder_prints_its_ranking(capsys):
    assert main(["report", str(rf.STUDY_FIXTURE)]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "bfloat16" in line]
    assert lines and "140,400" in lines[0] and "126,000 – 154,800" in lines[0] and "CHANGED" in lines[0]
    assert "1 point(s) failed" in out
