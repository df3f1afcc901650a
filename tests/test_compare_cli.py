"""`agentload compare A B`: the figures of two result folders side by side with their ratio."""

import json

from simulator.cli import main
from simulator.metrics.summary import Summary
from simulator.report.compare import compare_summaries


def _summary(scale: float) -> dict:
    """A summary.json with a few figures only (as an older version, or a hand-written one, may hold)."""
    return {
        "output_throughput": 100.0 * scale,
        "p50_ttft_ms": 20.0 * scale, "p99_ttft_ms": 50.0 * scale,
        "tasks": {"throughput_per_hour": 360.0, "failed": 0,
                  "completion_time_s": {"p50": 2.0 * scale, "p95": 9.0},
                  "by_class": {"x": {"completion_time_s": {"p50": 1.0, "p95": 2.0 * scale}},
                               "y": {"completion_time_s": {"p50": 3.0, "p95": 4.0}}}},
    }


def test_rows_hold_both_values_and_the_ratio_b_over_a():
    a, b = (Summary.model_validate(_summary(scale)) for scale in (1.0, 1.5))
    rows = {r["figure"]: r for r in compare_summaries(a, b)}
    assert rows["output tokens/s"]["ratio"] == 1.5
    assert rows["TTFT p99"]["a"] == 50.0 and rows["TTFT p99"]["b"] == 75.0
    assert rows["completion p95"]["ratio"] == 1.0
    assert rows["x completion p95"]["ratio"] == 1.5
    assert rows["tasks failed"]["ratio"] is None  # 0 in A: no ratio
    assert "TPOT p50" not in rows  # in neither summary


def test_compare_command_reads_two_result_folders(tmp_path, capsys):
    for name, scale in (("real", 1.0), ("twin", 0.5)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(_summary(scale)))
    assert main(["compare", str(tmp_path / "real"), str(tmp_path / "twin"), "--json"]) == 0
    rows = {r["figure"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["TTFT p50"]["ratio"] == 0.5
    assert main(["compare", str(tmp_path / "real"), str(tmp_path / "twin")]) == 0
    assert "TTFT p50" in capsys.readouterr().out
    assert main(["compare", str(tmp_path / "real"), str(tmp_path / "missing")]) == 2
    assert "no such result folder" in capsys.readouterr().err
