"""The terminal summary of a run (from a summary dict, as written to summary.json)."""

from __future__ import annotations

from typing import Any, Optional

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from .server import render_server

PCTS = ("p50", "p90", "p95", "p99", "p99.9")


def _ms(value: Optional[float]) -> str:
    if value is None:
        return "-"
    return f"{value:,.1f}" if value < 1000 else f"{value:,.0f}"


def _s(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:,.2f}"


def call_table(summary: dict[str, Any]) -> Table:
    """Per-call latencies (ms) at the standard percentiles."""
    table = Table(title="Per call (ms)", title_justify="left")
    table.add_column("metric")
    for col in ("mean",) + PCTS:
        table.add_column(col, justify="right")
    for metric, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "e2e latency")):
        row = [_ms(summary.get(f"mean_{metric}_ms"))] + [_ms(summary.get(f"{p}_{metric}_ms")) for p in PCTS]
        table.add_row(label, *row)
    return table


def task_table(tasks: dict[str, Any]) -> Table:
    """Task completion time (s), overall and per task class."""
    table = Table(title="Per task: completion time (s)", title_justify="left")
    for col, just in (("class", "left"), ("done", "right"), ("failed", "right"), ("mean", "right")):
        table.add_column(col, justify=just)
    for p in PCTS:
        table.add_column(p, justify="right")
    table.add_column("tasks/h", justify="right")

    def row(name: str, entry: dict[str, Any], failed: int) -> list[str]:
        ct = entry.get("completion_time_s", {})
        return [name, str(entry.get("completed", 0)), str(failed), _s(ct.get("mean"))] + [
            _s(ct.get(p)) for p in PCTS] + [f"{entry.get('throughput_per_hour', 0):,.0f}"]

    table.add_row(*row("all", tasks, tasks.get("failed", 0) + tasks.get("cancelled", 0)), style="bold")
    by_class = tasks.get("by_class", {})
    if len(by_class) > 1:
        for name, entry in by_class.items():
            table.add_row(*row(name, entry, entry.get("failed", 0)))
    return table


def breakdown_table(tasks: dict[str, Any]) -> Table:
    """Where a completed task's time goes, mean seconds and share."""
    b = tasks.get("breakdown_s", {})
    total = b.get("total") or 0.0
    table = Table(title="Task time breakdown (mean per completed task)", title_justify="left")
    table.add_column("part")
    table.add_column("seconds", justify="right")
    table.add_column("share", justify="right")
    for key, label in (("ttft", "in calls: queueing + prefill (TTFT)"), ("decode", "in calls: decode"),
                       ("gaps", "in gaps (tool / think time)"), ("client_lag", "client lag"),
                       ("other", "other (waiting for sub-agents)")):
        value = b.get(key, 0.0)
        table.add_row(label, _s(value), f"{100 * value / total:.1f}%" if total else "-")
    table.add_row("total", _s(total), "", style="bold")
    return table


def headline(summary: dict[str, Any]) -> Text:
    """Throughput, goodput, lag, errors and accounting in a few lines."""
    tasks = summary.get("tasks", {})
    slo = summary.get("slo", {})
    calls = summary.get("calls", {})
    lines = [
        f"duration {summary.get('duration', 0):.1f} s   calls/s {summary.get('request_throughput', 0):.2f}   "
        f"output tokens/s {summary.get('output_throughput', 0):,.1f}   total tokens/s "
        f"{summary.get('total_token_throughput', 0):,.1f}   tasks/hour {tasks.get('throughput_per_hour', 0):,.1f}",
    ]
    good = []
    if "goodput_per_hour" in tasks:
        good.append(f"goodput {tasks['goodput_per_hour']:,.1f} tasks/hour within the task SLO "
                    f"({100 * tasks.get('slo_met_share', 0):.1f}% of tasks)")
    if "calls_meeting_ttft" in slo:
        good.append(f"{100 * slo['calls_meeting_ttft']:.1f}% of calls meet TTFT")
    if "calls_meeting_tpot" in slo:
        good.append(f"{100 * slo['calls_meeting_tpot']:.1f}% meet TPOT")
    if good:
        lines.append("   ".join(good))
    for name in ("ttft_ms", "tpot_ms", "task_s"):
        if name in slo:
            parts = [f"{k} {_ms(v['measured'])}/{v['bound']:g} {'ok' if v['met'] else 'MISSED'}"
                     for k, v in slo[name]["percentiles"].items()]
            lines.append(f"SLO {name}: " + ", ".join(parts))
    lag = summary.get("client_lag_ms", {})
    lines.append(f"client lag p50 {_ms(lag.get('p50'))} ms, p99 {_ms(lag.get('p99'))} ms, max {_ms(lag.get('max'))} ms")
    errors = summary.get("errors") or {}
    lines.append("errors: " + (", ".join(f"{k} {v}" for k, v in errors.items()) if errors else "none"))
    acct = [f"{calls.get('ok', 0)} calls done"]
    if "planned" in calls:
        acct.append(f"of {calls['planned']} planned ({calls.get('not_done', 0)} not done)")
    acct.append(f"{calls.get('attempts', 0)} attempts, {calls.get('excluded_by_window', 0)} outside the window")
    if "planned" in tasks:
        acct.append(f"tasks: {tasks.get('finished_all', 0)} of {tasks['planned']} ended "
                    f"({tasks.get('completed', 0)} completed), {tasks.get('not_started', 0)} not started")
    lines.append("; ".join(acct))
    return Text("\n".join(lines))


def render(summary: dict[str, Any]) -> Group:
    """The whole terminal summary."""
    parts: list[Any] = []
    if summary.get("partial"):
        parts.append(Text(f"PARTIAL RESULTS: {summary.get('stop_reason')}", style="bold yellow"))
    parts += [call_table(summary), task_table(summary.get("tasks", {})), breakdown_table(summary.get("tasks", {}))]
    server = render_server(summary.get("server"))
    if server is not None:
        parts.append(server)
    parts.append(headline(summary))
    return Group(*parts)


def print_summary(summary: dict[str, Any], console: Optional[Console] = None) -> None:
    """Print the summary and where the result folder is."""
    console = console or Console()
    console.print(render(summary))
    if summary.get("result_dir"):
        console.print(f"results: {summary['result_dir']}")
