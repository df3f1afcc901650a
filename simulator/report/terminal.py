"""The terminal summary of a run (from its `Summary`, as written to summary.json): every figure as the
summary holds it (no sums of its own), in tables split to fit the console's width, numbers whole."""

from __future__ import annotations

from typing import Any, Optional

from rich.console import Console
from rich.text import Text

from ..errors import InputError
from ..metrics.summary import BANDED_FIGURES, BandRange, SimulationBand, Summary, TargetCheck, TaskFigures
from .cells import band_offsets, number
from .energy import energy_parts
from .fit import Grid
from .partial import partial_state
from .server import server_parts

WIDE = 10_000
"""Columns of a console that is no terminal: wide enough that no table is ever split."""

PCTS = {"p50": "p50", "p90": "p90", "p95": "p95", "p99": "p99", "p99.9": "p99_9"}
"""Column label: field of the figures (`CallLatency`, `TimeStats`)."""
SLO_LABELS = {"ttft_ms": "TTFT (ms)", "tpot_ms": "TPOT (ms)", "task_s": "task time (s)"}


def _count(value: Optional[int]) -> str:
    return "-" if value is None else f"{value:,}"


def call_grid(summary: Summary) -> Grid:
    """Per-call latencies (ms) at the standard percentiles."""
    grid = Grid("Per call (ms)", [("metric", "left"), *((col, "right") for col in ("mean", *PCTS))])
    for metric, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "e2e latency")):
        latency = getattr(summary, metric)
        grid.add(label, number(latency.mean), *(number(getattr(latency, field)) for field in PCTS.values()))
    return grid


def task_count_grid(tasks: TaskFigures) -> Grid:
    """Where each judged task ended, overall and per task class, with throughput and goodput per hour."""
    interrupted = bool(tasks.interrupted)
    columns = [("class", "left"), ("judged", "right"), ("done", "right"), ("failed", "right"),
               ("cancelled", "right"), *([("interrupted", "right")] if interrupted else []),
               ("unstarted", "right"), ("tasks/h", "right"), ("in SLO/h", "right")]
    grid = Grid("Per task: how the judged tasks ended", columns)

    def row(name: str, entry: Any) -> list[str]:
        return [name, _count(entry.judged), _count(entry.completed), _count(entry.failed), _count(entry.cancelled),
                *([_count(getattr(entry, "interrupted", None))] if interrupted else []), _count(entry.not_started),
                number(entry.throughput_per_hour), number(entry.goodput_per_hour)]

    grid.add(*row("all", tasks), style="bold")
    if len(tasks.by_class) > 1:
        for name, entry in tasks.by_class.items():
            grid.add(*row(name, entry))
    return grid


def task_time_grid(tasks: TaskFigures) -> Grid:
    """Completion time (s) of the completed tasks, overall and per task class."""
    grid = Grid("Per task: completion time (s), done tasks", [("class", "left"), ("mean", "right"),
                                                                *((p, "right") for p in PCTS)])
    entries = [("all", tasks)] + (list(tasks.by_class.items()) if len(tasks.by_class) > 1 else [])
    for i, (name, entry) in enumerate(entries):
        ct = entry.completion_time_s
        grid.add(name, number(ct.mean), *(number(getattr(ct, field)) for field in PCTS.values()),
                 style="bold" if i == 0 else "")
    return grid


def breakdown_grid(tasks: TaskFigures) -> Grid:
    """Where a completed task's time goes, mean seconds and share."""
    b = tasks.breakdown_s
    total = b.total
    grid = Grid("Task time breakdown (mean per completed task)", [("part", "left"), ("seconds", "right"),
                                                                    ("share", "right")])
    for key, label in (("ttft", "in calls: queueing + prefill (TTFT)"), ("decode", "in calls: decode"),
                       ("gaps", "in gaps (tool / think time)"), ("client_lag", "client lag"),
                       ("other", "other (waiting for sub-agents)")):
        value = getattr(b, key)
        grid.add(label, number(value), f"{100 * value / total:.1f}%" if total else "-")
    grid.add("total", number(total), "", style="bold")
    return grid


def slo_lines(summary: Summary) -> list[str]:
    """Each SLO target's percentiles against their bounds, one line a target."""
    lines = []
    for name in ("ttft_ms", "tpot_ms", "task_s"):
        target: Optional[TargetCheck] = getattr(summary.slo, name)
        if target is not None:
            lines.append(f"SLO {name}: " + ", ".join(check_text(key, target) for key in target.percentiles))
    return lines


def band_text(figure: BandRange, unit: str = "") -> str:
    """'2.41 s  (band 2.18–2.73 s, -10%/+13%)': a figure, its band and how far each end is from it."""
    suffix = f" {unit}" if unit else ""
    value, low, high = figure.value, figure.low, figure.high
    spread = ", {}/{}".format(*band_offsets(value, low, high)) if value else ""
    return f"{number(value)}{suffix}  (band {number(low)}–{number(high)}{suffix}{spread})"


def band_lines(band: Optional[SimulationBand]) -> list[str]:
    """The band of a simulation: what it is, then one line per banded figure; or why there is none."""
    if band is None:
        return []
    if not band.figures:
        return [band.note or "no band"]
    lines = [f"band: {band.method}"]
    for banded in BANDED_FIGURES:
        figure = band.figures.get(banded.key)
        if figure is not None:
            lines.append(f"  {banded.label:18s} {band_text(figure, banded.unit)}")
    return lines


def check_text(key: str, target: TargetCheck) -> str:
    """'p90 14.4/90 ok', or for a task percentile that fell among tasks that did not complete
    'p90 not reached (6 of 17 tasks did not complete)/60 MISSED'."""
    check = target.percentiles[key]
    if check.measured is not None:
        measured = number(check.measured)
    elif target.not_completed:
        measured = f"not reached ({target.not_completed:,} of {target.judged:,} tasks did not complete)"
    else:
        measured = "none measured"
    return f"{key} {measured}/{check.bound:g} {'ok' if check.met else 'MISSED'}"


def task_accounting(tasks: TaskFigures) -> str:
    """The judged tasks in one line: how each ended."""
    if tasks.judged is None:
        return (f"tasks: {tasks.completed:,} completed, {tasks.failed:,} failed, {tasks.cancelled:,} cancelled "
                f"(arriving in the window)")
    parts = [f"{tasks.completed:,} completed", f"{tasks.failed:,} failed", f"{tasks.cancelled:,} cancelled"]
    if tasks.interrupted:
        parts.append(f"{tasks.interrupted:,} interrupted")
    parts.append(f"{tasks.not_started or 0:,} not started")
    return f"tasks: {tasks.judged:,} judged (arriving in the window): " + ", ".join(parts)


def headline(summary: Summary) -> Text:
    """Throughput, goodput, SLO, lag, errors and accounting in a few lines."""
    tasks, slo, calls = summary.tasks, summary.slo, summary.calls
    lines = [
        f"duration {number(summary.duration)} s   calls/s {number(summary.request_throughput)}   "
        f"output tokens/s {number(summary.output_throughput)}   total tokens/s "
        f"{number(summary.total_token_throughput)}   tasks/hour {number(tasks.throughput_per_hour)}",
    ]
    good = []
    if tasks.goodput_per_hour is not None:
        good.append(f"goodput {number(tasks.goodput_per_hour)} tasks/hour within the task SLO "
                    f"({100 * (tasks.slo_met_share or 0):.1f}% of judged tasks)")
    if slo.calls_meeting_ttft is not None:
        good.append(f"{100 * slo.calls_meeting_ttft:.1f}% of calls meet TTFT")
    if slo.calls_meeting_tpot is not None:
        good.append(f"{100 * slo.calls_meeting_tpot:.1f}% meet TPOT")
    if good:
        lines.append("   ".join(good))
    lines += slo_lines(summary)
    lag = summary.client_lag_ms
    lines.append(f"client lag p50 {number(lag.p50)} ms, p99 {number(lag.p99)} ms, max {number(lag.max)} ms")
    errors = summary.errors
    lines.append("failed call attempts: " + (", ".join(f"{k} {v:,}" for k, v in errors.items()) if errors else "none"))
    acct = [f"calls: {calls.ok:,} done"]
    if calls.planned is not None:
        acct.append(f"of {calls.planned:,} planned ({calls.not_done or 0:,} not done)")
    acct.append(f"{calls.attempts:,} attempts, {calls.excluded_by_window:,} outside the window")
    lines.append(" ".join(acct[:2]) + "; " + acct[-1])
    lines.append(task_accounting(tasks))
    return Text("\n".join(lines))


def error_grid(summary: Summary) -> Optional[Grid]:
    """The most frequent error messages of failed attempts (None when none failed): what a wrong model
    name or a refused key said, not only its class."""
    if not summary.error_messages:
        return None
    grid = Grid("Most frequent errors", [("attempts", "right"), ("class", "left"), ("message", "left")],
                keep=2, text_columns=(2,))
    for entry in summary.error_messages:
        grid.add(f"{entry.count:,}", entry.error_class, Text(entry.message))
    return grid


def render(summary: Summary, width: int = WIDE) -> list[Any]:
    """The whole terminal summary, its tables fitted to `width` columns."""
    parts: list[Any] = []
    state = partial_state(summary)
    if state:
        parts.append(Text(state, style="bold yellow"))
    for grid in (call_grid(summary), task_count_grid(summary.tasks), task_time_grid(summary.tasks),
                 breakdown_grid(summary.tasks)):
        parts += grid.tables(width)
    parts += server_parts(summary.server, width)
    parts += energy_parts(summary, width)
    errors = error_grid(summary)
    if errors is not None:
        parts += errors.tables(width)
    parts.append(headline(summary))
    return parts


def output_console(stderr: bool = False) -> Console:
    """A console to print tables on: rich's own on a terminal (tables split to fit its width); elsewhere
    (CI logs, pipes, files) one so wide that tables keep their natural width, whole."""
    console = Console(stderr=stderr)
    if console.is_terminal:
        return console
    return Console(stderr=stderr, width=WIDE)


def print_summary(summary: Summary, console: Optional[Console] = None) -> None:
    """Print the summary and where the result folder is."""
    console = console or output_console()
    for part in render(summary, console.width):
        console.print(part)
    if summary.result_dir:
        from ..metrics import results  # noqa: PLC0415
        from .folder_data import served_by  # noqa: PLC0415

        try:
            info = results.read_json(summary.result_dir, results.RUN_FILE)
        except InputError:  # a damaged run.json: the summary is still printed
            info = None
        served = served_by(info if isinstance(info, dict) else {}, summary)
        if served:
            console.print(f"served by: {served}", soft_wrap=True, highlight=False, markup=False)
        console.print(f"results: {summary.result_dir}", soft_wrap=True)
