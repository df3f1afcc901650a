"""The report of several result folders side by side: which folders, whether they replayed the same
workload and which hold partial results, every compared figure with its ratio to the first folder's
(differences highlighted, never judged), and the CDFs, breakdowns and timelines overlaid."""

from __future__ import annotations

from dataclasses import replace
from itertools import groupby
from typing import Any, Optional, Sequence

from . import run_figures, timeline
from .cells import band_range, figure, ratio, started
from .compare import (BAND_MARK, band_legend, better, compare_many, folder_states, folder_titles, letters,
                      partial_warnings, ratio_legend, workload_warnings)
from .folder_data import RunData
from .page import Cell, Report, Section, Table
from .partial import partial_state


def folders_table(runs: Sequence[RunData]) -> Table:
    """Which folder is which: its letter, whether it holds partial results, scenario, what served it,
    when, and its workload."""
    table = Table("The folders", ("", "folder", "status", "scenario", "served by", "started at",
                                  "workload (fingerprint)"), numeric_from=99, wrap_text=True)
    for name, run in zip(letters(len(runs)), runs):
        state = partial_state(run.summary)
        planned = run.info.get("planned") or {}
        workload = (f"{planned.get('tasks', 0):,} tasks, {planned.get('calls', 0):,} calls" if planned else "-")
        digest = str((run.info.get("fingerprint") or {}).get("workload") or "-")
        table.rows.append([name, str(run.folder), Cell(state, tone="warn") if state else "complete", run.scenario,
                           run.target() or "-", started(run.info.get("started_at")),
                           f"{workload} ({digest.removeprefix('sha256:')[:12]})"])
    return table


def figure_tables(runs: Sequence[RunData]) -> list[Table]:
    """One table per section of compared figures: each folder's value, its ratio to the first's
    (highlighted past `cells.DEVIATION`, in neither direction) and which way the figure is better."""
    names = letters(len(runs))
    columns = ("figure", *names, *(f"{n}/{names[0]}" for n in names[1:]), "better")
    tables = []
    rows = compare_many([run.summary for run in runs])
    for section, group in groupby(rows, key=lambda r: r["section"]):
        table = Table(section[0].upper() + section[1:], columns, text_columns=(len(columns) - 1,))
        for row in group:
            path = tuple(row["path"])
            values: list[Any] = [_banded(figure(run.summary_json, path, folder=i), band)
                                 for i, (run, band) in enumerate(zip(runs, row["bands"]))]
            ratios: list[Any] = [_within(ratio(v, row["values"][0]), within)
                                 for v, within in zip(row["values"][1:], row["within_band"][1:])]
            table.rows.append([row["figure"], *values, *ratios, better(row["higher_is_better"])])
        tables.append(table)
    return tables


def _banded(cell: Cell, band: Optional[dict[str, float]]) -> Cell:
    """A folder's figure with its band after it, where it has one (`compare.banded_number`)."""
    if band is None or cell.value is None:
        return cell
    return replace(cell, text=f"{cell.text} {band_range(band['low'], band['high'])}")


def _within(cell: Cell, within: Optional[bool]) -> Cell:
    """A ratio marked where the two figures are within the band (`compare.within_band`)."""
    return replace(cell, text=cell.text + BAND_MARK) if within else cell


def build_compare_report(runs: Sequence[RunData]) -> Report:
    """The whole report of several folders (the first is the reference of every ratio); a folder with
    partial results is marked in the subtitle, the warnings and the folders table."""
    labels = [run.label for run in runs]
    names = letters(len(runs))
    states = folder_states([run.summary for run in runs])
    report = Report("comparison", f"agentload comparison of {len(runs)} result folders",
                    subtitle=folder_titles(labels, states))
    report.warnings = partial_warnings(labels, states) + workload_warnings([run.info for run in runs], labels)
    overview = Section("Folders", anchor="folders", tables=[folders_table(runs)])
    overview.notes.append(f"Ratios are to {names[0]} ({labels[0]}).")
    figures = Section("Figures side by side", anchor="figures", tables=figure_tables(runs))
    figures.notes.append(ratio_legend())
    if any(b is not None for row in compare_many([run.summary for run in runs]) for b in row["bands"]):
        figures.notes.append(band_legend())
    tasks = Section("Tasks", anchor="tasks")
    tasks.charts += [c for c in (run_figures.task_cdfs(runs), run_figures.breakdown_chart(runs)) if c]
    calls = Section("Calls", anchor="calls")
    calls.charts += [c for c in (run_figures.latency_cdfs(runs),) if c]
    over_time = Section("Over time", anchor="time")
    over_time.charts += [c for c in (timeline.timeline_overlay(runs),) if c]
    missing = [run.label for run in runs if not run.histograms]
    if missing:
        tasks.notes.append("No histograms.json in " + ", ".join(missing) + ": left out of the CDFs.")
    report.sections = [s for s in (overview, figures, tasks, calls, over_time) if s.charts or s.tables or s.notes]
    return report
