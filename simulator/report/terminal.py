"""The terminal summary of a run (from its `Summary`, as written to summary.json)."""

from __future__ import annotations

from typing import Any, Optional

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from ..metrics.summary import Summary, TaskClassFigures, TaskFigures
from .server import render_server

WIDE = 10_000
"""Columns of a console that is no terminal: wide enough that no table is ever narrowed."""

PCTS = {"p50": "p50", "p90": "p90", "p95": "p95", "p99": "p99", "p99.9": "p99_9"}
"""Column label: field of the figures (`CallLatency`, `TimeStats`)."""


def _ms(value: Optional[float]) -> str:
    if value is None:
        return "-"
    return f"{value:,.1f}" if value < 1000 else f"{value:,.0f}"


def _s(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:,.2f}"


def call_table(summary: Summary) -> Table:
    """Per-call latencies (ms) at the standard percentiles."""
    table = Table(title="Per call (ms)", title_justify="left")
    table.add_column("metric")
    for col in ("mean", *PCTS):
        table.add_column(col, justify="right")
    for metric, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "e2e latency")):
        latency = getattr(summary, metric)
        table.add_row(label, _ms(latency.mean), *(_ms(getattr(latency, field)) for field in PCTS.values()))
    return table


def task_table(tasks: TaskFigures) -> Table:
    """Task completion time (s), overall and per task class."""
    table = Table(title="Per task: completion time (s)", title_justify="left")
    for col, just in (("class", "left"), ("done", "right"), ("failed", "right"), ("mean", "right")):
        table.add_column(col, justify=just)
    for p in PCTS:
        table.add_column(p, justify="right")
    table.add_column("tasks/h", justify="right")

    def row(name: str, entry: TaskFigures | TaskClassFigures, failed: int) -> list[str]:
        ct = entry.completion_time_s
        return [name, str(entry.completed), str(failed), _s(ct.mean),
                *(_s(getattr(ct, field)) for field in PCTS.values()), f"{entry.throughput_per_hour:,.0f}"]

    table.add_row(*row("all", tasks, tasks.failed + tasks.cancelled), style="bold")
    if len(tasks.by_class) > 1:
        for name, entry in tasks.by_class.items():
            table.add_row(*row(name, entry, entry.failed))
    return table


def breakdown_table(tasks: TaskFigures) -> Table:
    """Where a completed task's time goes, mean seconds and share."""
    b = tasks.breakdown_s
    total = b.total
    table = Table(title="Task time breakdown (mean per completed task)", title_justify="left")
    table.add_column("part")
    table.add_column("seconds", justify="right")
    table.add_column("share", justify="right")
    for key, label in (("ttft", "in calls: queueing + prefill (TTFT)"), ("decode", "in calls: decode"),
                       ("gaps", "in gaps (tool / think time)"), ("client_lag", "client lag"),
                       ("other", "other (waiting for sub-agents)")):
        value = getattr(b, key)
        table.add_row(label, _s(value), f"{100 * value / total:.1f}%" if total else "-")
    table.add_row("total", _s(total), "", style="bold")
    return table


def headline(summary: Summary) -> Text:
    """Throughput, goodput, lag, errors and accounting in a few lines."""
    tasks, slo, calls = summary.tasks, summary.slo, summary.calls
    lines = [
        f"duration {summary.duration:.1f} s   calls/s {summary.request_throughput:.2f}   "
        f"output tokens/s {summary.output_throughput:,.1f}   total tokens/s "
        f"{summary.total_token_throughput:,.1f}   tasks/hour {tasks.throughput_per_hour:,.1f}",
    ]
    good = []
    if tasks.goodput_per_hour is not None:
        good.append(f"goodput {tasks.goodput_per_hour:,.1f} tasks/hour within the task SLO "
                    f"({100 * (tasks.slo_met_share or 0):.1f}% of tasks)")
    if slo.calls_meeting_ttft is not None:
        good.append(f"{100 * slo.calls_meeting_ttft:.1f}% of calls meet TTFT")
    if slo.calls_meeting_tpot is not None:
        good.append(f"{100 * slo.calls_meeting_tpot:.1f}% meet TPOT")
    if good:
        lines.append("   ".join(good))
    for name in ("ttft_ms", "tpot_ms", "task_s"):
        target = getattr(slo, name)
        if target is not None:
            parts = [f"{k} {_ms(v.measured)}/{v.bound:g} {'ok' if v.met else 'MISSED'}"
                     for k, v in target.percentiles.items()]
            lines.append(f"SLO {name}: " + ", ".join(parts))
    lag = summary.client_lag_ms
    lines.append(f"client lag p50 {_ms(lag.p50)} ms, p99 {_ms(lag.p99)} ms, max {_ms(lag.max)} ms")
    errors = summary.errors
    lines.append("errors: " + (", ".join(f"{k} {v}" for k, v in errors.items()) if errors else "none"))
    acct = [f"{calls.ok} calls done"]
    if calls.planned is not None:
        acct.append(f"of {calls.planned} planned ({calls.not_done or 0} not done)")
    acct.append(f"{calls.attempts} attempts, {calls.excluded_by_window} outside the window")
    if tasks.planned is not None:
        interrupted = f", {tasks.interrupted} started and interrupted" if tasks.interrupted else ""
        acct.append(f"tasks: {tasks.finished_all} of {tasks.planned} ended "
                    f"({tasks.completed} completed){interrupted}, {tasks.not_started or 0} not started")
    lines.append("; ".join(acct))
    return Text("\n".join(lines))


def error_table(summary: Summary) -> Optional[Table]:
    """The most frequent error messages of failed attempts (None when none failed): what a wrong model
    name or a refused key said, not only its class."""
    if not summary.error_messages:
        return None
    table = Table(title="Most frequent errors", title_justify="left")
    table.add_column("attempts", justify="right")
    table.add_column("class")
    table.add_column("message", overflow="fold")
    for entry in summary.error_messages:
        table.add_row(str(entry.count), entry.error_class, Text(entry.message))
    return table


def render(summary: Summary) -> Group:
    """The whole terminal summary."""
    parts: list[Any] = []
    if summary.partial:
        parts.append(Text(f"PARTIAL RESULTS: {summary.stop_reason}", style="bold yellow"))
    parts += [call_table(summary), task_table(summary.tasks), breakdown_table(summary.tasks)]
    server = render_server(summary.server)
    if server is not None:
        parts.append(server)
    errors = error_table(summary)
    if errors is not None:
        parts.append(errors)
    parts.append(headline(summary))
    return Group(*parts)


def output_console(stderr: bool = False) -> Console:
    """A console to print tables on: rich's own on a terminal; elsewhere (CI logs, pipes, files) one so
    wide that tables keep their natural width, so no cell is folded or cut short with an ellipsis."""
    console = Console(stderr=stderr)
    if console.is_terminal:
        return console
    return Console(stderr=stderr, width=WIDE)


def print_summary(summary: Summary, console: Optional[Console] = None) -> None:
    """Print the summary and where the result folder is."""
    console = console or output_console()
    console.print(render(summary))
    if summary.result_dir:
        console.print(f"results: {summary.result_dir}")
