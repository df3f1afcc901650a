"""The run report's figure over time, on simulations with a measurement window and a drain limit:
an arrivals panel (tasks arriving and calls sent per bin), lines with a legend for the end of arrivals,
the drain limit and the window's bounds, KV-cache usage on its own scale apart from the prefix-cache
hit share, and the task CDF stopping at the share of judged tasks that completed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import report_folders as rf
from simulator.cli import main
from simulator.report import run_figures, series, timeline
from simulator.report.cells import number
from simulator.report.folder_data import load_folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("report-timeline")
    return {"windowed": rf.drained(tmp, "windowed", 0.3, "--set", "run.warmup=0.3", "--set", "run.cooldown=0.3"),
            "long-drain": rf.simulation(tmp, "long-drain", 0, "--set", "run.drain=5")}


def drawn_text(folder: Path, out: Path) -> tuple[str, str]:
    """(the text inside the page's figures, the whole page's text)."""
    assert main(["report", str(folder), "--html", str(out)]) == 0
    page = rf.Page(out.read_text(encoding="utf-8"))
    return " ".join(page.svg_text), " ".join(page.text)


def test_the_timeline_has_an_arrivals_panel_and_run_markers_with_a_legend(folders, tmp_path):
    drawn, _ = drawn_text(folders["windowed"], tmp_path / "w.html")
    width = series.time_edges(0.0, 1.6, timeline.time_bins(load_folder(folders["windowed"])))
    per = f"per {number(width[1] - width[0])} s"
    for label in (f"tasks arriving {per} (left)", f"calls sent {per} (right)",
                  "end of arrivals (1.25 s)", "drain limit (1.55 s: last arrival + 0.3 s)",
                  "warm-up ends: window starts (0.3 s)", "cool-down starts: window ends (0.95 s)",
                  "outside the measurement window", "tasks in flight", "requests running",
                  "KV-cache usage (% of the pool, own scale)", "prefix-cache hits (share of queried tokens)"):
        assert label in drawn, label


def test_arrivals_are_counted_per_bin_where_they_happened(folders):
    run = load_folder(folders["windowed"])
    chart = timeline.timeline(run)
    arrivals = chart.figure.axes[0]
    (bars,) = [a for a in arrivals.patches if a.get_label().startswith("tasks arriving")]
    heights = bars.get_data()[0]
    assert heights.sum() == run.tasks.top.sum() == 6  # every top-level task, once
    drain = [line for line in arrivals.get_lines() if line.get_linestyle() == "-."]
    assert [line.get_xdata()[0] for line in drain] == [pytest.approx(1.55)]  # the drain limit's line
    legend = [t.get_text() for t in chart.figure.legends[0].get_texts()]
    assert legend[:2] == ["warm-up ends: window starts (0.3 s)", "cool-down starts: window ends (0.95 s)"]
    assert "drain limit (1.55 s: last arrival + 0.3 s)" in legend


def test_kv_cache_usage_has_its_own_scale(folders):
    run = load_folder(folders["windowed"])
    chart = timeline.timeline(run)
    owner = {line.get_label(): ax for ax in chart.figure.axes for line in ax.get_lines()}
    kv = owner["KV-cache usage (% of the pool, own scale)"]
    hits = owner["prefix-cache hits (share of queried tokens)"]
    assert kv is not hits
    peak = 100 * np.nanmax(run.samples.values["kv_cache_usage_perc"])
    assert peak < 5  # a small usage ...
    assert kv.get_ylim()[1] <= 1.25 * peak  # ... fills its panel
    assert hits.get_ylim() == (0, 105)


def test_a_drain_limit_the_run_never_reached_is_said_not_drawn(folders, tmp_path):
    drawn, words = drawn_text(folders["long-drain"], tmp_path / "l.html")
    assert "end of arrivals (1.25 s)" in drawn and "drain limit" not in drawn
    assert "The drain limit (6.25 s) lies past the run's end." in words


def test_task_cdf_stops_at_the_share_of_judged_tasks_that_completed(folders):
    run = load_folder(folders["windowed"])
    tasks = run.summary.tasks
    assert tasks.judged and tasks.completed < tasks.judged
    chart = run_figures.task_cdfs([run])
    (curve,) = [line for line in chart.figure.axes[0].get_lines() if line.get_label().startswith("all (")]
    assert curve.get_label() == f"all ({tasks.completed} of {tasks.judged} judged tasks completed)"
    assert max(curve.get_ydata()) == pytest.approx(tasks.completed / tasks.judged)
