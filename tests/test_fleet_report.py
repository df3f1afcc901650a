"""A fleet's result folder shown: the run report's Fleet section (the replicas over time from their own
/metrics files, the replica table with the cells summary.json holds, the fleet line), replicas.csv, the
comparison's fleet rows and what "served by" says. On the twin's fleet, which writes the folder a live
fleet writes (tests/test_fleet_live.py runs the live one)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.report.compare import comparison
from simulator.report.csv_export import write_run
from simulator.report.folder_data import load_folder
from simulator.report.run_report import build_run_report

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "fleet" / "claude-code.yaml"


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """The shipped fleet scenario simulated with two policies."""
    out = tmp_path_factory.mktemp("fleet-report")
    found = {}
    for policy in ("round_robin", "manual"):
        folder = out / policy
        assert main(["simulate", str(SCENARIO), "-o", str(folder), "--set", f"fleet.router.policy={policy}"]) == 0
        found[policy] = folder
    return found


def test_the_run_report_has_a_fleet_section_built_from_the_replicas_files(folders):
    run = load_folder(folders["manual"])
    report = build_run_report(run)
    fleet = next(s for s in report.sections if s.title == "Fleet")
    assert [c.name for c in fleet.charts] == ["fleet-timeline"]
    (table,) = fleet.tables
    summary = json.loads((folders["manual"] / "summary.json").read_text())
    replicas = summary["fleet"]["replicas"]
    assert [row[0].text for row in table.rows] == [r["name"] for r in replicas]
    shares = [row[table.columns.index("share")].text for row in table.rows]
    assert shares == [f"{100 * r['call_share']:.1f}%" for r in replicas]
    assert any("all accounted" in note for note in fleet.notes)
    # the calls' replica column, which the chart draws per replica
    assert set(run.calls.replica) == {r["name"] for r in replicas}


def test_a_run_without_a_fleet_has_no_fleet_section_nor_replica_column(tmp_path):
    folder = tmp_path / "single"
    assert main(["simulate", str(SCENARIO), "-o", str(folder), "--set", "fleet=null",
                 "-p", str(ROOT / "scenarios" / "fleet" / "replica.yaml")]) == 0
    run = load_folder(folder)
    assert run.calls.replica is None
    assert all(s.title != "Fleet" for s in build_run_report(run).sections)
    assert "replica" not in (folder / "calls.jsonl").read_text()


def test_replicas_csv_holds_the_summary_figures(folders, tmp_path):
    write_run(folders["round_robin"], tmp_path)
    rows = list(csv.DictReader(open(tmp_path / "replicas.csv")))
    summary = json.loads((folders["round_robin"] / "summary.json").read_text())
    assert [r["name"] for r in rows] == [r["name"] for r in summary["fleet"]["replicas"]]
    assert [int(r["served"]) for r in rows] == [r["served"] for r in summary["fleet"]["replicas"]]


def test_the_comparison_has_the_fleet_rows_and_served_by_names_the_fleet(folders, capsys):
    data = comparison([folders["round_robin"], folders["manual"]])
    rows = {row["figure"]: row for row in data["rows"] if row["section"] == "fleet"}
    hit = rows["prefix-hit share (replicas' /metrics)"]
    summaries = [json.loads((folders[p] / "summary.json").read_text()) for p in ("round_robin", "manual")]
    assert hit["values"] == [s["fleet"]["prefix_hit_share"] for s in summaries]
    assert summaries[1]["fleet"]["prefix_hit_share"] > summaries[0]["fleet"]["prefix_hit_share"]
    assert main(["report", str(folders["manual"])]) == 0
    assert "served by: a fleet of 3 replicas behind the router model (manual): simulated on the twin of fleet-replica" \
        in capsys.readouterr().out
