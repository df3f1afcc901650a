"""A study in the terminal, from its typed study.json (`simulator.study.model.Study`): the ranking table
(the same rows as the HTML page's), then its verdicts, notes and what the figures mean. `agentload
study` prints it when the study ends and `agentload report STUDY_DIR` prints it again."""

from __future__ import annotations

from typing import Optional

from rich.console import Console

from ..study.model import MIN_REPEATS_FOR_CI, OBJECTIVE_LABELS, CapacityResult, ConfigResult, Pair, Study, TwinBand
from . import study_fleet, study_holdout, study_space
from .cells import band_range as bracketed
from .cells import BOUND_SIGNS, number
from .fit import Grid


def money(value: Optional[float]) -> str:
    """Dollars with the digits a small amount needs, never in exponent form."""
    return "-" if value is None else f"${number(value)}"


def interval(pair: Pair, scale: float = 1.0, money_: bool = False) -> str:
    """'low – high', or '-' without an interval (or with an open end)."""
    if not pair or any(v is None for v in pair):
        return "-"
    show = money if money_ else number
    return f"{show(pair[0] * scale)} – {show(pair[1] * scale)}"


def capacity_text(cap: Optional[CapacityResult]) -> str:
    """A capacity in tasks per hour; past the search's range at least its highest rate held; below it,
    less than the lowest rate probed."""
    if cap is None:
        return "-"
    if cap.per_hour is not None:
        return number(cap.per_hour)
    if cap.status == "above_range" and cap.at_least_per_s:
        return f"≥ {number(cap.at_least_per_s * 3600)}"
    if cap.status == "below_range" and cap.at_most_per_s:
        return f"< {number(cap.at_most_per_s * 3600)}"
    return (cap.status or "-").replace("_", " ")


def quality_text(c: ConfigResult) -> str:
    q = c.quality
    if q is None or not q.status:
        return "-"
    if q.flagged:
        moved = f" dlogprob {number(q.mean_abs_logprob_delta)}" if q.reason == "logprobs" else ""
        return f"CHANGED{moved}"
    return q.status


def gpu_text(c: ConfigResult) -> str:
    g = c.gpu
    if g is None or not g.available:
        on_twin = c.kind == "twin" or (g is not None and (g.note or "").startswith("twin"))  # a fleet's twin too
        return "-" if on_twin else "absent"
    per_task = f", {number(g.joules_per_task)} J/task" if g.joules_per_task is not None else ""
    return f"{number((g.memory_used_max_bytes or 0) / 2**30)} GiB, {number(g.utilisation_mean_perc)}%{per_task}"


def study_grid(study: Study) -> Grid:
    """One row per config, best first."""
    unit = study.ranking.unit if study.ranking and study.ranking.unit else ""
    at = _at_load(study)
    grid = Grid(f"Study {study.name}: ranked by {OBJECTIVE_LABELS.get(study.objective, study.objective)}",
                [("rank", "right"), ("config", "left"), (f"objective {unit}".strip(), "right"), ("its CI", "right"),
                 ("capacity tasks/h", "right"), (f"goodput/h{at}", "right"), (f"task p50 s{at}", "right"),
                 (f"task p95 s{at}", "right"), (f"TTFT p95 ms{at}", "right"), ("$/task self", "right"),
                 ("$/task API", "right"), *([("J/task", "right")] if with_energy(study) else []),
                 ("quality", "left"), ("GPU", "left"), ("ref. tok/s", "right"),
                 *([("twin band", "right")] if banded(study) else [])], keep=2)
    for c in study.ranked():
        obj = c.objective
        value = "-" if obj.value is None else BOUND_SIGNS.get(obj.bound, "") + (
            money(obj.value) if study.objective == "cost" else number(obj.value))
        grid.add("-" if c.rank is None else str(c.rank), c.name + (" (base)" if c.is_base else ""), value,
                 interval(obj.ci, money_=study.objective == "cost"), capacity_text(c.capacity),
                 number(c.goodput_tasks_per_hour), number(c.task_p50_s), number(c.task_p95_s), number(c.ttft_p95_ms),
                 money(c.cost.self_hosted_per_task if c.cost else None), money(c.cost.api_per_task if c.cost else None),
                 *([number(c.cost.joules_per_task if c.cost else None)] if with_energy(study) else []),
                 quality_text(c), gpu_text(c),
                 number((c.reference or {}).get("output_tokens_per_s")),
                 *([band_range(c.twin_band)] if banded(study) else []))
    return grid


def energy_lines(study: Study) -> list[str]:
    """What J/task is, once, with where each config's joules come from and its joules per output token."""
    if not with_energy(study):
        return []
    per_config = "; ".join(f"{c.name} {number(c.cost.joules_per_output_token)} J per output token "
                           f"({c.cost.energy_source or 'source not recorded'})"
                           for c in study.configs if c.cost is not None and c.cost.joules_per_task is not None)
    return ["J/task: the GPUs' joules per completed task at the points of the $/task (each repeat's highest "
            "capacity probe that held, else the ranking load), over each run's measurement window, their mean: "
            + per_config]


def with_energy(study: Study) -> bool:
    """Whether any config of the study has joules per task (`Cost.joules_per_task`): only then do the
    tables show them."""
    return any(c.cost is not None and c.cost.joules_per_task is not None for c in study.configs)


def banded(study: Study) -> bool:
    """Whether any config of the study has a twin band (`ConfigResult.twin_band`)."""
    return any(c.twin_band is not None and c.twin_band.banded for c in study.configs)


def band_range(band: Optional[TwinBand]) -> str:
    """A config's twin band as a cell: '4.41 [3.48–5.11]' (its points' own figure, then the band), or '-'
    without one."""
    if band is None or not band.banded:
        return "-"
    return f"{number(band.value)} {bracketed(band.low, band.high)}"


def band_lines(study: Study) -> list[str]:
    """What the twin bands are, once (the figure, the points, the draws), and why a config has none."""
    lines = []
    with_band = [c for c in study.configs if c.twin_band is not None and c.twin_band.banded]
    if with_band:
        figures = ", ".join(dict.fromkeys(f"{c.twin_band.label}{f' ({c.twin_band.unit})' if c.twin_band.unit else ''} "
                                          f"{c.twin_band.where}" for c in with_band))
        draws = ", ".join(dict.fromkeys(str(c.twin_band.draws) for c in with_band))
        lines.append(f"twin band: the range of the figure a config's rank rests on ({figures}) over each of those "
                     f"points simulated again on {draws} profiles drawn from the calibration's fit (not a confidence "
                     "interval), beside the mean of the points' own figures (each run's summary: a pooled percentile "
                     "objective may differ); two configs whose bands of the same figure at the same kind of points "
                     "overlap are within the twin's band: its own uncertainty could swap them")
    reasons = dict.fromkeys(c.twin_band.note for c in study.configs
                            if c.twin_band is not None and not c.twin_band.banded and c.twin_band.note)
    lines += [f"twin band: {reason}" for reason in reasons]
    return lines


VERDICTS = {"held": "held", "missed": "MISSED", "untestable": "burst"}
"""A point's verdict in a table cell ('burst': held, but too short to test its rate)."""


def points_grid(study: Study, sources: tuple[str, ...] = ("sweep",)) -> Grid:
    """The points of each config's sweep, in load order: what each load delivered, per task."""
    grid = Grid(f"Study {study.name}: every point", [
        ("config", "left"), ("load", "right"), ("r", "right"), ("offered/h", "right"), ("done/h", "right"),
        ("goodput/h", "right"), ("task p50 s", "right"), ("task p95 s", "right"), ("TTFT p95 ms", "right"),
        ("tok/s", "right"), ("SLO", "left")], keep=3)
    for c in study.configs:
        for p in sorted((p for p in c.points if p.source in sources), key=lambda p: (p.load or 0.0, p.repeat)):
            if p.status != "ok":
                grid.add(c.name, number(p.load), str(p.repeat), "-", "-", "-", "-", "-", "-", "-", "FAILED")
                continue
            grid.add(c.name, number(p.load), str(p.repeat), number(p.offered_per_hour),
                     number(p.throughput_tasks_per_hour), number(p.goodput_tasks_per_hour), number(p.task_p50_s),
                     number(p.task_p95_s), number(p.ttft_p95_ms), number(p.output_tokens_per_s),
                     VERDICTS.get(p.verdict or "", "-"))
    return grid


def _at_load(study: Study) -> str:
    """' @8/s': the load the per-config figures are taken at, when all configs share it."""
    loads = {c.at_load for c in study.configs if c.at_load is not None}
    if len(loads) != 1:
        return ""
    unit = {"tasks/s": "/s", "x": "x", "tasks in flight": " in flight"}.get(study.axis_unit or "", "")
    return f" @{number(loads.pop())}{unit}"


def summary_lines(study: Study) -> list[str]:
    """The lines under the table: the ranking and its verdicts, notes, what the figures mean, the twin's
    prediction, the config space, failed points and the study's own overhead."""
    lines = []
    if study.ranking is not None:
        lines.append(f"ranking: {' > '.join(study.ranking.order)}")
        for c in study.ranking.comparisons:
            lines += [f"  {text}" for text in (c.verdict, c.band_verdict) if text]
    lines += [f"note: {note}" for note in study.notes]
    lines += study_fleet.sizing_lines(study)
    lines += study_fleet.note_lines(study)
    lines += study_holdout.lines(study)
    lines += study_holdout.note_lines(study)
    lines += statistics_lines(study)
    lines += band_lines(study)
    lines += energy_lines(study)
    if any(c.capacity is not None for c in study.configs):
        lines.append("capacity: the highest offered task rate at which every SLO target held (at a rate the "
                     "workload could test); goodput: tasks completed within the task bound per hour of one run "
                     "at the load shown, the tail after its last arrival included: it stays below the offered rate")
    pred = study.twin_prediction
    if pred is not None:
        verdict = "the same order" if pred.same_order else "a different order"
        lines.append(f"twin ({pred.profile}{', calibrated here' if pred.calibrated else ''}) predicts "
                     f"{' > '.join(pred.predicted_order)}; measured {' > '.join(pred.measured_order)}: {verdict}"
                     + (f"; {pred.note}" if pred.note else ""))
        lines += [f"  twin: {text}" for text in pred.within_band]
    lines += study_space.lines(study)
    lines += [f"FAILED: {p.error}" for p in study.failed_points]
    overhead = study.overhead or {}
    if overhead.get("points"):
        lines.append(f"study overhead per point (server start aside): mean {number(overhead['mean_s'])} s, "
                     f"max {number(overhead['max_s'])} s over {overhead['points']} points")
    return lines


def statistics_lines(study: Study) -> list[str]:
    """What the repeats support: the capacity's resolution where one repeat gives no interval, and how
    many repeats a verdict needs."""
    lines = []
    for c in study.configs:
        cap = c.capacity
        if cap is not None and cap.per_hour is not None and cap.ci_per_s is None and cap.resolution_per_s is not None:
            lines.append(f"{c.name}: capacity {number(cap.per_hour)} tasks/h from {cap.estimates} repeat: no "
                         f"confidence interval; the bisection placed it to ±{number(cap.resolution_per_s * 3600)} "
                         "tasks/h")
    samples = [c.objective.samples for c in study.configs if c.objective.value is not None]
    if samples and min(samples) < MIN_REPEATS_FOR_CI:
        lines.append(f"statistics: intervals and significance need {MIN_REPEATS_FOR_CI} repeats or more of each "
                     "config (3 or more to tell apart configs a few percent apart): --set repeats=3")
    return lines


def print_study(study: Study, console: Console) -> None:
    """Print the table, split to fit the console, and the lines under it."""
    for grid in [study_grid(study), *study_holdout.grids(study), *study_fleet.grids(study)]:
        for table in grid.tables(console.width):
            console.print(table)
    if study.failed_points:
        console.print(f"{len(study.failed_points)} point(s) failed; see the HTML report or study.json")
    for line in summary_lines(study):
        console.print(line, highlight=False, soft_wrap=console.width >= 10_000, markup=False)
