"""The tables of a run's page, each cell pointing at the figure of summary.json it shows."""

from __future__ import annotations

from typing import Any, Optional

from .cells import figure, number
from .folder_data import RunData
from .page import Cell, KeyFigure, Table

PCTS = ("p50", "p90", "p95", "p99", "p99.9")
CALL_METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "end to end"))
BREAKDOWN_ROWS = (("ttft", "in calls: queueing + prefill (TTFT)"), ("decode", "in calls: decode"),
                  ("gaps", "in gaps (tool / think time)"), ("client_lag", "client lag"),
                  ("other", "other (waiting for sub-agents)"))
GAUGES = (("num_requests_running", "requests running", 1.0, ""), ("num_requests_waiting", "requests waiting", 1.0, ""),
          ("kv_cache_usage_perc", "KV-cache usage", 100.0, "%"))
MESSAGE_CHARS = 300


def key_figures(run: RunData) -> list[KeyFigure]:
    """The headline: task throughput and goodput, task time, TTFT, output throughput, failures."""
    s = run.summary_json
    out = [
        KeyFigure("tasks / hour", figure(s, ("tasks", "throughput_per_hour"))),
        KeyFigure("goodput: tasks / hour within the task SLO", figure(s, ("tasks", "goodput_per_hour")),
                  "no task SLO" if run.summary.tasks.goodput_per_hour is None else ""),
        KeyFigure("task time p50", figure(s, ("tasks", "completion_time_s", "p50"), unit="s")),
        KeyFigure("task time p95", figure(s, ("tasks", "completion_time_s", "p95"), unit="s")),
        KeyFigure("TTFT p99", figure(s, ("p99_ttft_ms",), unit="ms")),
        KeyFigure("output tokens / s", figure(s, ("output_throughput",))),
        KeyFigure("failed call attempts", figure(s, ("calls", "failed_attempts"),
                                                 tone="bad" if run.summary.calls.failed_attempts else "")),
    ]
    return [k for k in out if k.cell.value is not None or k.hint]


def call_table(run: RunData) -> Table:
    """Per-call latencies (ms) at the standard percentiles."""
    s = run.summary_json
    table = Table("Per call (ms)", ("metric", "mean", *PCTS))
    for key, label in CALL_METRICS:
        table.rows.append([label, figure(s, (f"mean_{key}_ms",)), *(figure(s, (f"{p}_{key}_ms",)) for p in PCTS)])
    return table


def lag_table(run: RunData) -> Table:
    """Client lag (ms): how late calls went out against their intended send time."""
    s = run.summary_json
    return Table("Client lag (ms): actual minus intended send", ("mean", "p50", "p99", "max"), numeric_from=0,
                 rows=[[figure(s, ("client_lag_ms", key)) for key in ("mean", "p50", "p99", "max")]])


def task_table(run: RunData) -> Table:
    """Task completion time (s), overall and per class, with throughput and goodput."""
    s = run.summary_json
    table = Table("Per task: completion time (s)", ("class", "completed", "failed", "mean", *PCTS, "tasks/h",
                                                      "within SLO /h"), numeric_from=1, bold_rows=(0,))

    def row(name: str, base: tuple[str, ...], failed: Cell) -> list[Any]:
        ct = (*base, "completion_time_s")
        return [name, figure(s, (*base, "completed")), failed, figure(s, (*ct, "mean")),
                *(figure(s, (*ct, p)) for p in PCTS), figure(s, (*base, "throughput_per_hour")),
                figure(s, (*base, "goodput_per_hour"))]

    table.rows.append(row("all", ("tasks",), figure(s, ("tasks", "failed"))))
    if len(run.summary.tasks.by_class) > 1:
        for name in run.summary.tasks.by_class:
            base = ("tasks", "by_class", name)
            table.rows.append(row(name, base, figure(s, (*base, "failed"))))
    return table


def breakdown_table(run: RunData) -> Table:
    """Mean seconds per completed task in each part, with its share."""
    s = run.summary_json
    total = run.summary.tasks.breakdown_s.total
    table = Table("Task time breakdown (mean per completed task)", ("part", "seconds", "share"), bold_rows=(5,))
    for key, label in BREAKDOWN_ROWS:
        value = getattr(run.summary.tasks.breakdown_s, key)
        table.rows.append([label, figure(s, ("tasks", "breakdown_s", key)),
                           f"{100 * value / total:.1f}%" if total else "-"])
    table.rows.append(["total", figure(s, ("tasks", "breakdown_s", "total")), ""])
    return table


def slo_table(run: RunData) -> Table:
    """Each SLO percentile against its bound, and the shares of calls and tasks within bounds."""
    s = run.summary_json
    table = Table("SLO", ("target", "percentile", "bound", "measured", "met"), numeric_from=2)
    for name, label in (("ttft_ms", "TTFT (ms)"), ("tpot_ms", "TPOT (ms)"), ("task_s", "task time (s)")):
        check = getattr(run.summary.slo, name)
        if check is None:
            continue
        for key, item in check.percentiles.items():
            base = ("slo", name, "percentiles", key)
            table.rows.append([label, key, figure(s, (*base, "bound")),
                               figure(s, (*base, "measured"), tone="good" if item.met else "bad"),
                               Cell("yes" if item.met else "MISSED", tone="good" if item.met else "bad")])
    for path, label in ((("slo", "calls_meeting_ttft"), "calls within the TTFT bound"),
                        (("slo", "calls_meeting_tpot"), "calls within the TPOT bound"),
                        (("slo", "calls_meeting_all"), "calls within every call bound"),
                        (("tasks", "slo_met_share"), "tasks within the task bound")):
        cell = figure(s, path, unit="%", scale=100.0)
        if cell.value is not None:
            table.rows.append([label, "share", "", cell, ""])
    if not table.rows:
        table.note = "The scenario sets no SLO."
    return table


def errors_table(run: RunData) -> Table:
    """Failed attempts by error class: count, HTTP statuses, when the first came and what it said."""
    s = run.summary_json
    first, statuses = run.calls.first_failure, run.calls.statuses
    table = Table("Failed call attempts", ("error class", "attempts", "HTTP status", "first at (s)", "first message"),
                  numeric_from=1, text_columns=(4,))
    for name in run.summary.errors:
        call = first.get(name)
        message = (call.error_message or "") if call else ""
        if len(message) > MESSAGE_CHARS:
            message = message[:MESSAGE_CHARS] + " [...]"
        table.rows.append([name, figure(s, ("errors", name), tone="bad"),
                           ", ".join(str(x) for x in sorted(statuses.get(name, ()))) or "-",
                           number(call.end) if call else "-", message])
    if not table.rows:
        table.note = "No call failed."
    return table


def messages_table(run: RunData) -> Optional[Table]:
    """The most frequent error messages the summary kept (None when it kept none)."""
    messages = getattr(run.summary, "error_messages", None)
    if not messages:
        return None
    s = run.summary_json
    return Table("Most frequent error messages", ("error class", "attempts", "message"), numeric_from=1,
                 text_columns=(2,),
                 rows=[[m.error_class, figure(s, ("error_messages", i, "count")), Cell(m.message)]
                       for i, m in enumerate(messages)])


def server_table(run: RunData) -> Table:
    """The server's /metrics over the run: gauges' mean and max, counters' increase, cache hit shares."""
    s = run.summary_json
    timeline = (run.summary.server or {}).get("timeline") or {}
    table = Table("Server /metrics over the run", ("metric", "mean", "max"))
    for key, label, scale, unit in GAUGES:
        if isinstance(timeline.get(key), dict):
            base = ("server", "timeline", key)
            table.rows.append([label, figure(s, (*base, "mean"), scale=scale, unit=unit),
                               figure(s, (*base, "max"), scale=scale, unit=unit)])
    for key, label in (("prefix_cache_hits_delta", "prefix-cache hits (tokens, increase)"),
                       ("prefix_cache_queries_delta", "prefix-cache queries (tokens, increase)"),
                       ("num_preemptions_delta", "preemptions (increase)")):
        if key in timeline:
            table.rows.append([label, figure(s, ("server", "timeline", key)), ""])
    for path, label in ((("server", "timeline", "prefix_cache_hit_share"), "prefix-cache hit share (counters)"),
                        (("server", "usage_cached_tokens", "hit_share"), "prefix-cache hit share (usage.cached_tokens)")):
        cell = figure(s, path, unit="%", scale=100.0)
        if cell.value is not None:
            table.rows.append([label, cell, ""])
    note = (run.summary.server or {}).get("note")
    if note:
        table.note = str(note)
    return table


def simulation_table(run: RunData) -> Table:
    """What the twin did in a simulated run."""
    s = run.summary_json
    table = Table("Simulation", ("figure", "value"))
    for key, label in (("simulated_seconds", "simulated seconds"), ("wall_seconds", "wall seconds"),
                       ("steps", "engine steps"), ("preemptions", "preemptions"),
                       ("cached_prompt_tokens", "cached prompt tokens"), ("kv_evicted_blocks", "KV blocks evicted"),
                       ("max_running", "most requests running"), ("busy_fraction", "busy share")):
        table.rows.append([label, figure(s, ("simulation", key), **({"unit": "%", "scale": 100.0}
                                                                     if key == "busy_fraction" else {}))])
    return table


def accounting_table(run: RunData) -> Table:
    """Where every planned call and task went."""
    s = run.summary_json
    table = Table("Accounting", ("item", "calls", "tasks"))
    for label, call_path, task_path in (
        ("planned", ("calls", "planned"), ("tasks", "planned")),
        ("done / completed", ("calls", "ok"), ("tasks", "completed")),
        ("failed", ("calls", "failed_attempts"), ("tasks", "failed")),
        ("cancelled", ("calls", "cancelled"), ("tasks", "cancelled")),
        ("outside the window", ("calls", "excluded_by_window"), ("tasks", "excluded_by_window")),
        ("not done / not started", ("calls", "not_done"), ("tasks", "not_started")),
    ):
        table.rows.append([label, figure(s, call_path), figure(s, task_path)])
    table.rows.append(["attempts / sub-agents finished", figure(s, ("calls", "attempts")),
                       figure(s, ("tasks", "sub_tasks_finished"))])
    return table
