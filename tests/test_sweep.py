"""`agentload sweep`: from light load to saturation without a study file, on the twin (the anchors one
task at a time and all at once, the rates evenly between their throughputs, each point judged per task),
and resumed by the same command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.errors import InputError
from simulator.study.sweep import rates_between

ROOT = Path(__file__).resolve().parents[1]


def test_rates_run_evenly_from_one_anchor_to_the_other():
    assert rates_between(360.0, 720.0, 3) == pytest.approx([0.1, 0.15, 0.2])
    with pytest.raises(InputError, match="no load range"):
        rates_between(500.0, 400.0, 3)


def test_a_sweep_of_a_trace_on_the_twin(tmp_path, capsys):
    out = tmp_path / "sweep"
    args = ["sweep", "--trace", str(ROOT / "traces" / "claude-code"), "--token-scale", "0.04", "--context-cap", "4096",
            "--gap-cap", "1", "--slo", "task_s.p90=30", "-p", "tiny-vllm-cpu", "--points", "3", "-o", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr()
    anchors = json.loads((out / "anchors" / "study.json").read_text())
    one, many = (row["throughput_tasks_per_hour"] for row in anchors["configs"][0]["sweep"])
    assert 0 < one < many  # all seven sessions at once complete more an hour than one at a time
    study = json.loads((out / "rates" / "study.json").read_text())
    points = [p for p in study["configs"][0]["points"] if p["source"] == "sweep"]
    offered = sorted(p["offered_rate_per_s"] * 3600 for p in points)
    assert offered == pytest.approx([one, (one + many) / 2, many], rel=1e-6)
    assert all(p["verdict"] in ("held", "missed", "untestable") for p in points)
    assert "every point" in printed.out and "one task at a time" in printed.out
    assert "highest rate that held every SLO target" in printed.out or "no rate held" in printed.out
    # the scenario it ran is kept, and the same command on the same folder runs nothing again
    assert (out / "scenario.yaml").read_text().startswith("#")
    assert main(args) == 0
    again = json.loads((out / "rates" / "study.json").read_text())["configs"][0]["points"]
    assert [(p["folder"], p["throughput_tasks_per_hour"]) for p in again] == \
        [(p["folder"], p["throughput_tasks_per_hour"]) for p in study["configs"][0]["points"]]
    assert not any((out / "rates" / "points" / "twin").glob("*/r0.*"))  # no point set aside to run again
