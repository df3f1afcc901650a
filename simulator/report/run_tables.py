"""The tables of a run's page, each cell pointing at the figure of summary.json it shows."""

from __future__ import annotations

from typing import Any, Callable, Optional

from ..metrics.summary import BANDED_FIGURES, TargetCheck
from .cells import band_offsets, figure, lookup, number
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


TASK_ENDS = (("judged", "judged"), ("completed", "completed"), ("failed", "failed"), ("cancelled", "cancelled"),
             ("interrupted", "interrupted"), ("not_started", "not started"))
"""How the judged tasks ended: the summary's `TaskFigures` fields, with their column labels."""


def _count_tone(value: Optional[int]) -> str:
    return "bad" if value else ""


def key_figures(run: RunData) -> list[KeyFigure]:
    """The headline: task throughput and goodput, task time, TTFT, output throughput, failures, and the
    judged tasks that did not complete (failed, cancelled, interrupted, never started)."""
    s = run.summary_json
    tasks = run.summary.tasks
    judged = f"of {tasks.judged:,} judged" if tasks.judged is not None else ""
    # task times are of the completed tasks: said where some judged tasks did not complete
    of_completed = f"of the {tasks.completed:,} completed" if tasks.not_completed else ""
    band = band_hint(run)
    out = [
        KeyFigure("tasks / hour", figure(s, ("tasks", "throughput_per_hour"))),
        KeyFigure("goodput: tasks / hour within the task SLO", figure(s, ("tasks", "goodput_per_hour")),
                  "no task SLO" if tasks.goodput_per_hour is None else band(("tasks", "goodput_per_hour"))),
        KeyFigure("task time p50", figure(s, ("tasks", "completion_time_s", "p50"), unit="s"),
                  band(("tasks", "completion_time_s", "p50"), of_completed)),
        KeyFigure("task time p95", figure(s, ("tasks", "completion_time_s", "p95"), unit="s"),
                  band(("tasks", "completion_time_s", "p95"), of_completed)),
        KeyFigure("TTFT p99", figure(s, ("p99_ttft_ms",), unit="ms")),
        KeyFigure("output tokens / s", figure(s, ("output_throughput",)), band(("output_throughput",))),
        KeyFigure("failed call attempts", figure(s, ("calls", "failed_attempts"),
                                                 tone="bad" if run.summary.calls.failed_attempts else "")),
        KeyFigure("tasks completed", figure(s, ("tasks", "completed")), judged),
    ]
    for key, label in (("failed", "tasks failed"), ("cancelled", "tasks cancelled"),
                       ("interrupted", "tasks interrupted"), ("not_started", "tasks not started")):
        value = getattr(tasks, key)
        if key == "interrupted" and not value:
            continue  # only a killed run's rebuilt summary has them
        out.append(KeyFigure(label, figure(s, ("tasks", key), tone=_count_tone(value)), judged))
    return [k for k in out if k.cell.value is not None or k.hint]


def band_hint(run: RunData) -> Callable[..., str]:
    """A function giving a headline figure's hint: its band ('band 2.18–2.73'), after `other` hints,
    where the run is a simulation with a band of that figure."""
    sim = run.summary.simulation
    band = sim.band if sim is not None else None

    def hint(path: tuple[str, ...], other: str = "") -> str:
        figure_band = band.figures.get(".".join(path)) if band is not None else None
        if figure_band is None:
            return other
        text = f"band {number(figure_band.low)}–{number(figure_band.high)} (range of 1 + {band.draws} simulations)"
        return f"{other}; {text}" if other else text

    return hint


def band_table(run: RunData) -> Optional[Table]:
    """A simulation's band on its task-level figures: each figure, its band and how far each end lies
    from it (None: a live run, or a simulation without a band section)."""
    sim = run.summary.simulation
    band = sim.band if sim is not None else None
    if band is None:
        return None
    s = run.summary_json
    table = Table("Band on the prediction", ("figure", "value", "band low", "band high", "low", "high"))
    for banded in BANDED_FIGURES:
        entry = band.figures.get(banded.key)
        if entry is None:
            continue
        base = ("simulation", "band", "figures", banded.key)
        unit = f" ({banded.unit})" if banded.unit else ""
        table.rows.append([banded.label + unit, figure(s, (*base, "value")), figure(s, (*base, "low")),
                           figure(s, (*base, "high")), *band_offsets(entry.value, entry.low, entry.high)])
    table.note = (f"The band: {band.method}. It shows how far the prediction moves with the calibration's own "
                  "uncertainty: a range of simulations, not a confidence interval." if band.figures
                  else (band.note or "no band"))
    return table


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


def task_counts_table(run: RunData) -> Table:
    """How the judged tasks ended (the tasks the run meant to start that arrived in the measurement
    window), overall and per class, each count as the summary holds it."""
    s = run.summary_json
    tasks = run.summary.tasks
    ends = [(key, label) for key, label in TASK_ENDS if key != "interrupted" or tasks.interrupted is not None]
    table = Table("Per task: how the judged tasks ended", ("class", *(label for _, label in ends)), bold_rows=(0,))

    def row(name: str, base: tuple[str, ...]) -> list[Any]:
        cells: list[Any] = [name]
        for key, _ in ends:
            tone = _count_tone(lookup(s, (*base, key))) if key not in ("judged", "completed") else ""
            cells.append(figure(s, (*base, key), tone=tone))
        return cells

    table.rows.append(row("all", ("tasks",)))
    if len(tasks.by_class) > 1:
        for name in tasks.by_class:
            table.rows.append(row(name, ("tasks", "by_class", name)))
    table.note = ("Judged: the tasks the run meant to start whose arrival is in the measurement window; each "
                  "completed, failed (a call failed after its retries), was cancelled (cut off by run.drain or a "
                  "stop), was interrupted (started, never ended: a killed run) or never started. Every judged task "
                  "that did not complete counts against the task SLO.")
    return table


def task_table(run: RunData) -> Table:
    """Task completion time (s) of the completed tasks, overall and per class, with throughput and
    goodput."""
    s = run.summary_json
    table = Table("Per task: completion time of the completed tasks (s)",
                  ("class", "completed", "mean", *PCTS, "tasks/h", "within SLO /h"), numeric_from=1, bold_rows=(0,))

    def row(name: str, base: tuple[str, ...]) -> list[Any]:
        ct = (*base, "completion_time_s")
        return [name, figure(s, (*base, "completed")), figure(s, (*ct, "mean")),
                *(figure(s, (*ct, p)) for p in PCTS), figure(s, (*base, "throughput_per_hour")),
                figure(s, (*base, "goodput_per_hour"))]

    table.rows.append(row("all", ("tasks",)))
    if len(run.summary.tasks.by_class) > 1:
        for name in run.summary.tasks.by_class:
            table.rows.append(row(name, ("tasks", "by_class", name)))
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


def not_reached(check: TargetCheck) -> str:
    """What a task percentile that fell among the tasks that did not complete shows instead of a time."""
    return f"not reached: {check.not_completed or 0:,} of {check.judged or 0:,} tasks did not complete"


def slo_table(run: RunData) -> Table:
    """Each SLO percentile against its bound, and the shares of calls and tasks within bounds. A task
    percentile that falls among the judged tasks that did not complete (which count as slower than any
    bound) is not reached, and missed."""
    s = run.summary_json
    table = Table("SLO", ("target", "percentile", "bound", "measured", "met"), numeric_from=2)
    for name, label in (("ttft_ms", "TTFT (ms)"), ("tpot_ms", "TPOT (ms)"), ("task_s", "task time (s)")):
        check = getattr(run.summary.slo, name)
        if check is None:
            continue
        for key, item in check.percentiles.items():
            base = ("slo", name, "percentiles", key)
            tone = "good" if item.met else "bad"
            if item.measured is None and check.not_completed:
                measured: Cell = Cell(not_reached(check), tone="bad")
            else:
                measured = figure(s, (*base, "measured"), tone=tone)
            table.rows.append([label, key, figure(s, (*base, "bound")), measured,
                               Cell("yes" if item.met else "MISSED", tone=tone)])
    for path, label in ((("slo", "calls_meeting_ttft"), "calls within the TTFT bound"),
                        (("slo", "calls_meeting_tpot"), "calls within the TPOT bound"),
                        (("slo", "calls_meeting_all"), "calls within every call bound"),
                        (("tasks", "slo_met_share"), "judged tasks within the task bound")):
        cell = figure(s, path, unit="%", scale=100.0)
        if cell.value is not None:
            table.rows.append([label, "share", "", cell, ""])
    task = run.summary.slo.task_s
    if task is not None and task.not_completed:
        table.note = (f"Task time is judged over the {task.judged or 0:,} judged tasks: the {task.not_completed:,} "
                      "that did not complete (failed, cancelled, interrupted or never started) count as slower "
                      "than any bound.")
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
    """Where every planned call and task went (tasks: the judged ones, and those outside the window)."""
    s = run.summary_json
    table = Table("Accounting", ("item", "calls", "tasks"))
    for label, call_path, task_path in (
        ("planned", ("calls", "planned"), ("tasks", "planned")),
        ("judged (arrived in the window)", None, ("tasks", "judged")),
        ("done / completed", ("calls", "ok"), ("tasks", "completed")),
        ("failed", ("calls", "failed_attempts"), ("tasks", "failed")),
        ("cancelled", ("calls", "cancelled"), ("tasks", "cancelled")),
        ("interrupted", None, ("tasks", "interrupted")),
        ("not done / not started", ("calls", "not_done"), ("tasks", "not_started")),
        ("outside the window", ("calls", "excluded_by_window"), ("tasks", "excluded_by_window")),
    ):
        if task_path[-1] == "interrupted" and run.summary.tasks.interrupted is None:
            continue
        table.rows.append([label, figure(s, call_path) if call_path else "", figure(s, task_path)])
    table.rows.append(["attempts / sub-agents finished", figure(s, ("calls", "attempts")),
                       figure(s, ("tasks", "sub_tasks_finished"))])
    table.note = ("Calls failed: failed attempts (a retried call counts each). Tasks: each judged task ended one "
                  "way: judged = completed + failed + cancelled + interrupted + not started.")
    return table
