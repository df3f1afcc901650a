"""The report of several result folders side by side: which folders, whether they replayed the same
workload, every compared figure with its ratio to the first folder's, and the CDFs, breakdowns and
timelines overlaid."""

from __future__ import annotations

from itertools import groupby
from typing import Any, Sequence

from . import run_figures, timeline
from .cells import figure, ratio, started
from .compare import compare_many, letters, workload_warnings
from .folder_data import RunData
from .page import Report, Section, Table


def folders_table(runs: Sequence[RunData]) -> Table:
    """Which folder is which: its letter, scenario, what served it, when, and its workload."""
    table = Table("The folders", ("", "folder", "scenario", "served by", "started at", "workload", "fingerprint"),
                  numeric_from=99)
    for name, run in zip(letters(len(runs)), runs):
        planned = run.info.get("planned") or {}
        workload = (f"{planned.get('tasks', 0):,} tasks, {planned.get('calls', 0):,} calls" if planned else "-")
        digest = str((run.info.get("fingerprint") or {}).get("workload") or "-")
        table.rows.append([name, str(run.folder), run.scenario, run.target() or "-",
                           started(run.info.get("started_at")), workload,
                           digest.removeprefix("sha256:")[:12]])
    return table


def figure_tables(runs: Sequence[RunData]) -> list[Table]:
    """One table per section of compared figures: each folder's value and its ratio to the first's,
    toned when it is more than 5% better or worse."""
    names = letters(len(runs))
    columns = ("figure", *names, *(f"{n}/{names[0]}" for n in names[1:]))
    tables = []
    rows = compare_many([run.summary for run in runs])
    for section, group in groupby(rows, key=lambda r: r["section"]):
        table = Table(section[0].upper() + section[1:], columns)
        for row in group:
            path = tuple(row["path"])
            values: list[Any] = [figure(run.summary_json, path, folder=i) for i, run in enumerate(runs)]
            ratios: list[Any] = [ratio(v, row["values"][0], row["higher_is_better"]) for v in row["values"][1:]]
            table.rows.append([row["figure"], *values, *ratios])
        tables.append(table)
    return tables


def build_compare_report(runs: Sequence[RunData]) -> Report:
    """The whole report of several folders (the first is the reference of every ratio)."""
    labels = [run.label for run in runs]
    names = letters(len(runs))
    report = Report("comparison", f"agentload comparison of {len(runs)} result folders",
                    subtitle=[f"{n}: {label}" for n, label in zip(names, labels)])
    report.warnings = workload_warnings([run.info for run in runs], labels)
    for run, name in zip(runs, names):
        if run.summary.partial:
            report.warnings.append(f"{name} ({run.label}) holds partial results: {run.summary.stop_reason}.")
    overview = Section("Folders", anchor="folders", tables=[folders_table(runs)])
    overview.notes.append(f"Ratios are to {names[0]} ({labels[0]}); green is more than 5% better, red more than "
                          "5% worse (lower is better for times, errors; higher for throughput).")
    figures = Section("Figures side by side", anchor="figures", tables=figure_tables(runs))
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

