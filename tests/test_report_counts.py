"""The task counts of a result folder as every report file shows them: the HTML page's headline tiles,
per-task table and accounting table, and the CSV export, against summary.json (judged, completed,
failed, cancelled, interrupted, not started, as the summary holds them, no arithmetic of the report's
own); the SLO table's verdict on a task percentile that falls among the tasks that did not complete.
Folders: a simulation cut off by its drain limit (cancelled tasks), and a run killed before its end
(interrupted tasks and tasks never started, the summary rebuilt from its records)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

import report_folders as rf
from simulator.cli import main
from simulator.metrics import results

COUNTS = ("judged", "completed", "failed", "cancelled", "interrupted", "not_started")
LABELS = {"judged": "judged", "completed": "completed", "failed": "failed", "cancelled": "cancelled",
          "interrupted": "interrupted", "not_started": "not started"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("report-counts")
    return {"drained": rf.drained(tmp), "killed": rf.killed(rf.simulation(tmp, "whole"), tmp / "killed")}


def summary_of(folder: Path) -> dict:
    return json.loads((folder / results.SUMMARY_FILE).read_text())


def page_of(folder: Path, out: Path) -> rf.Page:
    assert main(["report", str(folder), "--html", str(out)]) == 0
    return rf.Page(out.read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", ["drained", "killed"])
def test_page_shows_the_task_counts_of_summary_json(folders, tmp_path, name):
    summary = summary_of(folders[name])
    tasks = summary["tasks"]
    if name == "drained":  # what the folders hold: cancelled tasks; interrupted and never started ones
        assert tasks["cancelled"] > 0 and tasks["judged"] == 6 and tasks["not_started"] == 0
    else:
        assert tasks["interrupted"] > 0 and tasks["not_started"] > 0 and tasks["judged"] == 6 and summary["partial"]
    page = page_of(folders[name], tmp_path / "run.html")
    rf.check_cells(page.cells, [summary])  # every figure cell holds and shows its figure of summary.json
    shown = {(c["where"], tuple(json.loads(c["source"]))): c for c in page.cells}
    kept = [key for key in COUNTS if tasks.get(key) is not None]
    assert "interrupted" in kept if name == "killed" else "interrupted" not in kept

    # the per-task table: one row per class and 'all', a column per way a judged task ended
    table = "Per task: how the judged tasks ended"
    assert page.tables[table][0] == ["class", *(LABELS[key] for key in kept)]
    rows = {row[0]: row[1:] for row in page.tables[table][1:]}
    assert rows["all"] == [f"{tasks[key]:,}" for key in kept]
    for key in kept:
        assert (table, ("tasks", key)) in shown, key
    for cls, entry in tasks["by_class"].items():
        for key in ("judged", "completed", "failed", "cancelled", "not_started"):
            assert shown[(table, ("tasks", "by_class", cls, key))]["text"] == f"{entry[key]:,}", (cls, key)
    assert sum(tasks[key] for key in kept if key != "judged") == tasks["judged"]

    # the headline: a tile for each way of not completing, toned bad when there were any
    for key in ("completed", "failed", "cancelled", "not_started") + (("interrupted",) if name == "killed" else ()):
        tile = shown[("key figures", ("tasks", key))]
        assert tile["text"] == f"{tasks[key]:,}"
        if key != "completed":
            assert tile["tone"] == ("bad" if tasks[key] else ""), key

    # the accounting table
    for key in kept:
        assert shown[("Accounting", ("tasks", key))]["text"] == f"{tasks[key]:,}", key


def test_a_task_percentile_among_the_tasks_that_did_not_complete_is_not_reached(folders, tmp_path):
    summary = summary_of(folders["drained"])
    check = summary["slo"]["task_s"]
    assert check["percentiles"]["p90"]["measured"] is None and not check["met"]
    page = page_of(folders["drained"], tmp_path / "run.html")
    row = next(r for r in page.tables["SLO"] if r[0] == "task time (s)")
    assert row[1:] == ["p90", "3", f"not reached: {check['not_completed']} of {check['judged']} tasks did not "
                       "complete", "MISSED"]
    words = " ".join(page.text)
    assert "PARTIAL (drain_timeout): 3 of 6 tasks cancelled" in words


def test_csv_holds_the_task_counts_of_summary_json(folders, tmp_path):
    for name, folder in folders.items():
        out = tmp_path / name
        assert main(["report", str(folder), "--csv", str(out)]) == 0
        tasks = summary_of(folder)["tasks"]
        with open(out / "task_counts.csv", newline="") as fh:
            rows = {row["class"]: row for row in csv.DictReader(fh)}
        assert set(rows) == {"all", *tasks["by_class"]}
        for cls, entry in [("all", tasks), *tasks["by_class"].items()]:
            for key in COUNTS:
                expected = entry.get(key)
                assert rows[cls][key] == ("" if expected is None else str(expected)), (name, cls, key)
        with open(out / "summary.csv", newline="") as fh:
            flat = dict(csv.reader(fh))
        for key in COUNTS:
            if tasks.get(key) is not None:
                assert flat[f"tasks.{key}"] == str(tasks[key])
