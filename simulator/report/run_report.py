"""The report of one result folder (a live run or a simulation): headline figures, task and call
figures with their CDFs, the SLO, the run over time, errors, and what ran."""

from __future__ import annotations

from typing import Any

from . import coverage, energy, fleet, fleet_timeline, run_figures, run_tables, timeline
from .cells import figure, number, started
from .folder_data import RunData
from .page import KeyFigure, Report, Section, Table
from .partial import partial_state


def info_table(run: RunData) -> Table:
    """What ran: scenario, where, when, the window and the workload's fingerprint."""
    info: dict[str, Any] = run.info
    rows: list[list[Any]] = [["scenario", run.scenario]]
    settings = info.get("settings") or {}
    if settings.get("description"):
        rows.append(["description", str(settings["description"])])
    for key, label in (("scenario_file", "scenario file"), ("started_at", "started at")):
        if info.get(key):
            rows.append([label, str(info[key])])
    rows.append(["served by", run.target() or "-"])
    if run.summary.simulation is not None:
        rows.append([coverage.TITLE, ": ".join(coverage.coverage_parts(run.summary.simulation))])
    window = run.window
    rows.append(["measurement window", f"{number(window.start)} s to "
                 + (f"{number(window.end)} s" if window.end is not None else "the end") + " of the run"])
    planned = info.get("planned") or {}
    if planned:
        rows.append(["workload", f"{planned.get('tasks', 0):,} tasks, {planned.get('calls', 0):,} calls, "
                                 f"{planned.get('subtasks', 0):,} sub-agents"])
    for key, value in (info.get("fingerprint") or {}).items():
        rows.append([f"fingerprint of the {key}", str(value)])
    rows.append(["stopped", run.summary.stop_reason + (" (partial results)" if run.summary.partial else "")])
    rows.append(["result folder", str(run.folder)])
    return Table("What ran", ("item", "value"), rows=rows, numeric_from=2)


def build_run_report(run: RunData) -> Report:
    """The whole report of one folder."""
    summary = run.summary
    report = Report("run", f"agentload report: {run.scenario}",
                    subtitle=[part for part in (run.target(), started(run.info.get("started_at")),
                                                f"{number(summary.duration)} s measured") if part])
    state = partial_state(summary)
    if state:
        report.warnings.append(f"{state}. The figures count what the run measured before it stopped; every "
                               "judged task that did not complete counts against the task SLO.")
    if not len(run.calls):
        report.warnings.append("The folder holds no call records (calls.jsonl): figures over time and errors "
                               "are left out.")
    report.key_figures = run_tables.key_figures(run)
    tasks = Section("Tasks", anchor="tasks")
    tasks.charts += [c for c in (run_figures.task_cdfs([run]), run_figures.breakdown_chart([run])) if c]
    tasks.tables += [run_tables.task_counts_table(run), run_tables.task_table(run), run_tables.breakdown_table(run)]
    calls = Section("Calls", anchor="calls")
    calls.charts += [c for c in (run_figures.latency_cdfs([run]),) if c]
    calls.tables += [run_tables.call_table(run), run_tables.lag_table(run)]
    slo = Section("Service-level objectives", anchor="slo", tables=[run_tables.slo_table(run)])
    over_time = Section("Over time", anchor="time")
    over_time.charts += [c for c in (timeline.timeline(run),) if c]
    if summary.server:
        over_time.tables.append(run_tables.server_table(run))
    elif not run.samples:
        over_time.notes.append("No server /metrics in this folder (a server without them, or a simulation "
                               "whose twin was not sampled): requests and KV-cache usage are not shown.")
    energy_table = energy.energy_table(summary, run.summary_json)
    if energy_table is not None:
        over_time.tables.append(energy_table)
        key, label, unit = energy.ROWS[0]
        report.key_figures.append(KeyFigure(label, figure(run.summary_json, ("energy", key), unit=unit)))
    if summary.simulation is not None:
        over_time.tables.append(run_tables.simulation_table(run))
        band = run_tables.band_table(run)
        if band is not None:
            tasks.tables.append(band)
    replicas = Section("Fleet", anchor="fleet")
    if summary.fleet is not None:
        replicas.charts += [c for c in (fleet_timeline.replica_timeline(run),) if c]
        replicas.tables += [t for t in (fleet.replica_table(run.summary_json),) if t]
        replicas.notes += fleet.fleet_line(run.summary_json).splitlines()
    errors = Section("Errors", anchor="errors", tables=[t for t in (run_tables.errors_table(run),
                                                                     run_tables.messages_table(run)) if t])
    ran = Section("What ran", anchor="run", tables=[info_table(run), run_tables.accounting_table(run)])
    report.sections = [s for s in (slo, tasks, calls, over_time, replicas, errors, ran) if s.charts or s.tables or s.notes]
    return report
