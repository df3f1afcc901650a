"""The report of a study (its study.json, read as `simulator.report.study` says): the ranking of its
configs with capacities, significance, costs, quality and GPU figures, its figures, and every point."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from . import study_figures, study_fleet, study_holdout, study_space
from .cells import figure, number
from .page import Cell, KeyFigure, Report, Section, Table
from ..study.model import OBJECTIVE_LABELS, OBJECTIVE_NAMES, Pair, Study
from .study_terminal import (BOUND_SIGNS, band_lines, band_range, banded, energy_lines, statistics_lines,
                             with_energy)

GIB = 1024.0 ** 3
VERDICT_WORDS = {"held": "held", "missed": "missed", "untestable": "held as a burst (rate not tested)"}


def _interval(bounds: Pair, scale: float = 1.0) -> str:
    if not bounds or any(b is None for b in bounds):
        return "-"
    return f"{number(bounds[0] * scale)} – {number(bounds[1] * scale)}"


def _quality(study: Study, i: int) -> Cell:
    q = study.configs[i].quality
    if q is None or not q.status:
        return Cell("-")
    return Cell("CHANGED" if q.flagged else q.status, tone="bad" if q.flagged else "good" if q.status == "same" else "")


def _capacity(data: dict[str, Any], i: int) -> Cell:
    """A config's capacity in tasks per hour; past the search's range, at least its highest rate."""
    cell = figure(data, ("configs", i, "capacity", "per_hour"))
    capacity = data["configs"][i].get("capacity") or {}
    if cell.value is None and capacity.get("status") == "above_range":
        low = figure(data, ("configs", i, "capacity", "at_least_per_s"), scale=3600.0)
        if low.value is not None:
            return Cell(f"≥ {low.text}", value=low.value, source=low.source, scale=3600.0)
    if cell.value is None and capacity.get("status") == "below_range":
        return Cell("below range", tone="bad")
    return cell


def _objective(study: Study, data: dict[str, Any], i: int) -> Cell:
    """The objective's value, marked '≥' or '≤' where it only bounds the figure."""
    cell = figure(data, ("configs", i, "objective", "value"))
    sign = BOUND_SIGNS.get(study.configs[i].objective.bound, "")
    if sign and cell.value is not None:
        return Cell(sign + cell.text, value=cell.value, source=cell.source)
    return cell


def ranking_table(study: Study, data: dict[str, Any]) -> Table:
    """One row per config, best first: rank, objective with its CI, capacity with its CI, goodput and
    task times at the ranking load, cost per task, the quality check and the twin's rank."""
    unit = next((c.objective.unit for c in study.configs if c.objective.unit), "")
    table = Table(f"Ranking by {OBJECTIVE_LABELS.get(study.objective, study.objective)}",
                  ("rank", "config", "objective" + (f" ({unit})" if unit else ""), "its CI",
                   "capacity (tasks/h)", "capacity CI", "goodput (tasks/h)", "p95 task (s)", "p95 TTFT (ms)",
                   "$/task self-hosted", "$/task API", *(("J/task",) if with_energy(study) else ()),
                   "quality", "twin rank", *(("twin band",) if banded(study) else ())), numeric_from=2,
                  text_columns=(12 if with_energy(study) else 11,))
    order = sorted(range(len(study.configs)), key=lambda i: (study.configs[i].rank is None, study.configs[i].rank or 0, i))
    for i in order:
        c = study.configs[i]
        base = ("configs", i)
        cap = c.capacity
        table.rows.append([
            figure(data, (*base, "rank")), Cell(c.name + (" (base)" if c.is_base else "")),
            _objective(study, data, i), _interval(c.objective.ci),
            _capacity(data, i), _interval(cap.ci_per_s if cap else None, 3600.0),
            figure(data, (*base, "goodput_tasks_per_hour")),
            figure(data, (*base, "task_p95_s")), figure(data, (*base, "ttft_p95_ms")),
            figure(data, (*base, "cost", "self_hosted_per_task")), figure(data, (*base, "cost", "api_per_task")),
            *((figure(data, (*base, "cost", "joules_per_task"), unit="J"),) if with_energy(study) else ()),
            _quality(study, i), figure(data, (*base, "twin", "predicted_rank")),
            *((_band(study, data, i),) if banded(study) else ()),
        ])
    confidence = f" at {100 * study.confidence:g}% confidence" if study.confidence else ""
    loads = {c.at_load for c in study.configs if c.at_load is not None}
    at = f" at load {number(loads.pop())} ({study.axis_unit})" if len(loads) == 1 and study.axis_unit else " at the ranking load"
    table.note = (("Lower" if study.lower_is_better() else "Higher") + " is better. Capacity: the highest offered "
                  f"task rate at which every SLO target held at a rate the workload could test, with its "
                  f"interval{confidence} where repeats give one (a '-': one repeat). Goodput and task times{at}: "
                  "one run's tasks within the task bound per hour of that run, its tail after the last arrival "
                  "included, so goodput stays below the offered rate even where the SLO held.")
    return table


def _band(study: Study, data: dict[str, Any], i: int) -> Cell:
    """A twin config's band (`ConfigResult.twin_band`): '4.41 [3.48–5.11]', its points' own figure and the
    band (`study_terminal.band_range`), pointing at that figure."""
    value = figure(data, ("configs", i, "twin_band", "value"))
    if value.value is None:
        return Cell("-")
    return Cell(band_range(study.configs[i].twin_band), value=value.value, source=value.source)


def comparisons_table(study: Study, data: dict[str, Any]) -> Optional[Table]:
    """Each pair of configs ranked next to each other: the difference, its interval and the verdict; on
    the twin, whether the two are within the twin's band."""
    if study.ranking is None or not study.ranking.comparisons:
        return None
    unit = study.ranking.unit or ""
    band = any(c.band_verdict for c in study.ranking.comparisons)
    table = Table("Is the difference beyond noise?", ("better", "worse", f"difference{f' ({unit})' if unit else ''}",
                                                      "its CI", "verdict", *(("the twin's band",) if band else ())),
                  numeric_from=2, text_columns=(4, 5))
    for j, comp in enumerate(study.ranking.comparisons):
        tone = "" if comp.significant else "warn"
        within = Cell(comp.band_verdict or "-", tone="warn" if comp.within_twin_band else "")
        table.rows.append([comp.better, comp.worse, figure(data, ("ranking", "comparisons", j, "difference")),
                           _interval(comp.ci), Cell(comp.verdict or "", tone=tone), *((within,) if band else ())])
    return table


def configs_table(study: Study, data: dict[str, Any]) -> Table:
    """What each config is, how it ended, and its fixed-shape reference figure."""
    table = Table("Configs", ("config", "kind", "changes from the base", "status", "reference run",
                              "reference output tok/s"), numeric_from=5)
    for i, c in enumerate(study.configs):
        reference = c.reference or {}
        status = Cell(c.status or "-", tone="bad" if c.status in ("failed", "partial") else "")
        table.rows.append([c.name + (" (base)" if c.is_base else ""), c.kind or "-", c.differs_by or "-", status,
                           str(reference.get("label") or "-"), figure(data, ("configs", i, "reference", "output_tokens_per_s"))])
    return table


def quality_table(study: Study, data: dict[str, Any]) -> Table:
    """Each config's outputs on the fixed probe set against the base config's."""
    table = Table("Quality against the base config", ("config", "probes", "identical outputs",
                                                      "mean common prefix (tokens)", "mean |Δ logprob|", "check",
                                                      "note"), numeric_from=1, text_columns=(5, 6))
    for i, c in enumerate(study.configs):
        if c.quality is None:
            continue
        base = ("configs", i, "quality")
        table.rows.append([c.name, figure(data, (*base, "probes")),
                           figure(data, (*base, "identical_share"), unit="%", scale=100.0),
                           figure(data, (*base, "mean_common_prefix_tokens")), figure(data, (*base, "mean_abs_logprob_delta")),
                           _quality(study, i), Cell(c.quality.note or "")])
    return table


def gpu_table(study: Study, data: dict[str, Any]) -> Table:
    """GPU memory, utilisation and energy per task where NVML measured them, and the utilisation the
    cost per task assumed."""
    table = Table("GPU and energy", ("config", "memory max (GiB)", "GPU utilisation", "joules per task",
                                     "utilisation behind the cost", "note"), numeric_from=1, text_columns=(5,))
    for i, c in enumerate(study.configs):
        base = ("configs", i)
        table.rows.append([c.name, figure(data, (*base, "gpu", "memory_used_max_bytes"), scale=1 / GIB),
                           figure(data, (*base, "gpu", "utilisation_mean_perc"), unit="%"),
                           figure(data, (*base, "gpu", "joules_per_task")),
                           figure(data, (*base, "cost", "utilisation"), unit="%", scale=100.0),
                           Cell((c.gpu.note if c.gpu else None) or "")])
    return table


def points_table(study: Study, data: dict[str, Any]) -> Table:
    """Every point of every config."""
    table = Table("Every point", ("config", "run for", "load", "repeat", "offered /h", "tasks/h", "goodput /h",
                                  "p95 task (s)", "p95 TTFT (ms)", "SLO held", "result folder or error"),
                  numeric_from=2, text_columns=(9, 10))
    for i, c in enumerate(study.configs):
        for j, p in enumerate(c.points):
            base = ("configs", i, "points", j)
            held = Cell(VERDICT_WORDS.get(p.verdict or "", "-") if p.verdict else (
                "-" if p.slo_met is None else "yes" if p.slo_met else "no"),
                tone={"held": "good", "missed": "bad", "untestable": "warn"}.get(p.verdict or "", ""))
            where = (Cell(f"FAILED: {p.error or 'no reason given'}", tone="bad") if p.status == "failed"
                     else Cell(p.folder or ""))
            table.rows.append([c.name, p.source, figure(data, (*base, "load")), figure(data, (*base, "repeat")),
                               figure(data, (*base, "offered_rate_per_s"), scale=3600.0),
                               figure(data, (*base, "throughput_tasks_per_hour")),
                               figure(data, (*base, "goodput_tasks_per_hour")), figure(data, (*base, "task_p95_s")),
                               figure(data, (*base, "ttft_p95_ms")), held, where])
    return table


def warnings(study: Study) -> list[str]:
    """What a reader must know first: an unfinished study, failed points and configs, changed outputs,
    a twin that ranked the configs otherwise."""
    out = []
    if study.complete is False:
        out.append("The study is not complete: these are the configs and points it finished so far.")
    if study.failed_points:
        out.append(f"{len(study.failed_points)} point(s) failed: " + "; ".join(
            f"{f.config} ({f.source or 'point'} at load {number(f.load)}): {f.error or 'no reason given'}"
            for f in study.failed_points[:5]) + (" ..." if len(study.failed_points) > 5 else ""))
    for c in study.configs:
        if c.error:
            out.append(f"{c.name}: {c.error}")
        if c.quality is not None and c.quality.flagged:
            share, delta = c.quality.identical_share, c.quality.mean_abs_logprob_delta
            if c.quality.reason == "logprobs" and delta is not None:
                out.append(f"{c.name} moves the model's log probabilities by {delta:.3g} on average, though its "
                           "probes' outputs were identical to the base config's: its numerics changed. "
                           "Its speed is not free.")
            else:
                out.append(f"{c.name} changes the model's outputs"
                           + (f": {100 * share:.1f}% identical to the base config's" if share is not None else "")
                           + ". Its speed is not free.")
    twin = study.twin_prediction
    if twin is not None and twin.same_order is False:
        out.append(f"The twin ranked the configs {', '.join(twin.predicted_order)}; the live runs ranked them "
                   f"{', '.join(twin.measured_order)}.")
    return out


def build_study_report(study: Study, data: dict[str, Any], folder: Path) -> Report:
    """The whole report of a study folder."""
    workload = study.workload or {}
    report = Report("study", f"agentload study: {study.name}", subtitle=[part for part in (
        study.description or "", f"{len(study.configs)} configs",
        f"ranked by {OBJECTIVE_LABELS.get(study.objective, study.objective)}",
        f"{workload['tasks']:,} tasks a point" if isinstance(workload.get("tasks"), int) else "", str(folder)) if part])
    report.warnings = warnings(study) + study_holdout.warnings(study)
    objective = OBJECTIVE_NAMES.get(study.objective, study.objective)
    for i, c in enumerate(study.configs):
        if c.rank == 1:
            unit = f" ({c.objective.unit})" if c.objective.unit else ""
            report.key_figures.append(KeyFigure(f"best: {c.name}, {objective}{unit}", _objective(study, data, i)))
            report.key_figures.append(KeyFigure(f"{c.name}: capacity tasks/h", _capacity(data, i)))
            report.key_figures.append(KeyFigure(f"{c.name}: $ per task self-hosted",
                                                figure(data, ("configs", i, "cost", "self_hosted_per_task"))))
            if with_energy(study):
                report.key_figures.append(KeyFigure(f"{c.name}: joules per task",
                                                    figure(data, ("configs", i, "cost", "joules_per_task"), unit="J")))
    ranking = Section("Ranking", anchor="ranking", tables=[t for t in (
        ranking_table(study, data), study_holdout.table(study, data), comparisons_table(study, data),
        configs_table(study, data)) if t])
    ranking.notes += ([f"Note: {note}" for note in study.notes] + statistics_lines(study) + band_lines(study)
                      + energy_lines(study))
    ranking.notes += study_holdout.lines(study)
    twin = study.twin_prediction
    if twin is not None and twin.note:
        ranking.notes.append(f"Twin: {twin.note}")
    if twin is not None:
        ranking.notes += [f"Twin: {text}" for text in twin.within_band]
    fleets = Section("Fleets and routers", anchor="fleets", tables=study_fleet.tables(study, data),
                     notes=study_fleet.sizing_lines(study))
    fleets.charts += [c for c in (study_figures.policy_chart(study),) if c]
    if study.sizing is not None:
        report.key_figures.append(KeyFigure(f"fewest replicas for {study_fleet.rate_text(study.sizing)}",
                                            figure(data, ("sizing", "replicas")) if study.sizing.replicas is not None
                                            else Cell("none", tone="bad")))
    load = Section("Load", anchor="load")
    load.charts += [c for c in (study_figures.goodput_chart(study), study_figures.task_time_chart(study)) if c]
    cost = Section("Cost", anchor="cost")
    cost.charts += [c for c in (study_figures.cost_chart(study),) if c]
    quality = Section("Quality and GPU", anchor="quality",
                      tables=[t for t in (quality_table(study, data), gpu_table(study, data)) if t.rows])
    twin_section = Section("Twin against measurement", anchor="twin")
    twin_section.charts += [c for c in (study_figures.twin_chart(study),) if c]
    twin_section.tables += [t for t in (study_space.live_table(study, data), study_space.candidates_table(study, data))
                            if t]
    twin_section.notes += study_space.notes(study)
    points = Section("Points", anchor="points", tables=[points_table(study, data)])
    report.sections = [s for s in (ranking, fleets, load, cost, quality, twin_section, points)
                       if s.charts or s.tables or s.notes]
    return report
