"""study.json from what a study ran: `build(state)` turns a `simulator.study.state.StudyState` into the
typed `simulator.study.model.Study`, reading nothing but the state (the same state gives the same
study.json). `objective_values` is shared by the ranking, the twin's prediction and the config space.
Each figure is computed here once; its definition is the model's."""

from __future__ import annotations

import datetime as _dt
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import numpy as np

from . import cost
from .capacity import Capacity
from .fleet_result import fleet_result
from .load import AXIS_UNITS
from .model import (STUDY_VERSION, CapacityResult, Comparison, ConfigResult, Cost, FailedPoint, Gpu, HoldoutResult,
                    Objective, Quality, Ranking, SpaceResult, Study, StudyPoint, SweepRow, TwinEntry, TwinPrediction)
from .points import PointResult
from .ranking import HIGHER_IS_BETTER, UNITS, Value, band_verdict, order_of, rank
from .schema import StudySpec
from .search import objectives_of
from .space_result import space_result
from .sizing import sizing
from .state import ConfigRun, StudyState


def _iso(t: Optional[float]) -> Optional[str]:
    return None if t is None else _dt.datetime.fromtimestamp(t, _dt.timezone.utc).isoformat()


def rank_load(spec: StudySpec) -> Optional[float]:
    """The sweep value per-config figures are taken at: `rank_at`, else the highest."""
    load = spec.load
    if load is None:
        return None
    return spec.rank_at if spec.rank_at is not None else max(load.values())


def sweep_points(run: ConfigRun, load: Optional[float]) -> list[PointResult]:
    """The config's sweep points at `load` that ran."""
    return [p for p in run.points if p.source == "sweep" and p.ok and load is not None
            and abs(p.load - load) <= 1e-9 * max(1.0, load)]


def capacity_points(run: ConfigRun) -> list[PointResult]:
    """Each repeat's highest probe that held the SLO."""
    if run.capacity is None:
        return []
    lows = {(s.repeat, s.low) for s in run.capacity.searches if s.low is not None}
    return [p for p in run.points if p.source == "capacity" and p.ok and (p.repeat, p.load) in lows]


def _mean(values: list[Optional[float]]) -> Optional[float]:
    """The mean of the values, None when one is missing or there are none."""
    if not values or any(v is None for v in values):
        return None
    return statistics.fmean(values)


def _pooled(points: list[PointResult], q: float) -> Optional[float]:
    times = [t for p in points for t in p.figures.completion_times]
    return float(np.percentile(times, q)) if times else None


def _aggregate(points: list[PointResult]) -> dict[str, Any]:
    """Figures of a group of points (the repeats at one load): means, task percentiles pooled."""
    figures = [p.figures for p in points]
    return {
        "offered_tasks_per_hour": _mean([p.offered_rate * 3600 if p.offered_rate is not None else None for p in points]),
        "throughput_tasks_per_hour": _mean([f.throughput_tasks_per_hour for f in figures]),
        "goodput_tasks_per_hour": _mean([f.goodput_tasks_per_hour for f in figures]),
        "sustained_tasks_per_hour": _mean([p.sustained_tasks_per_hour() for p in points]),
        "output_tokens_per_s": _mean([f.output_tokens_per_s for f in figures]),
        "task_p50_s": _pooled(points, 50), "task_p95_s": _pooled(points, 95),
        "ttft_p95_ms": _mean([f.ttft_p95_ms for f in figures]),
    }


def _sweep(run: ConfigRun) -> list[SweepRow]:
    groups: dict[float, list[PointResult]] = defaultdict(list)
    for p in run.points:
        if p.source == "sweep":
            groups[p.load].append(p)
    out = []
    for load, group in groups.items():
        ok = [p for p in group if p.ok]
        met = [p.figures.slo_met for p in ok if p.figures.slo_met is not None]
        out.append(SweepRow(load=load, repeats=len(group), ok=len(ok),
                            slo_met_share=sum(met) / len(met) if met else None, **(_aggregate(ok) if ok else {})))
    return out


def _cost(state: StudyState, run: ConfigRun, points: list[PointResult]) -> Optional[Cost]:
    """$ per task both ways, at the capacity (else at the ranking load's sustained rate), and the
    utilisation behind it."""
    if not points:
        return None
    spec = state.spec.cost
    if run.capacity is not None and run.capacity.rate is not None:
        tasks_h, at_rate = run.capacity.rate * 3600, run.capacity.rate
    else:
        sustained = _mean([p.sustained_tasks_per_hour() for p in points])
        tasks_h = sustained if sustained is not None else _mean([p.figures.throughput_tasks_per_hour for p in points])
        at_rate = _mean([p.offered_rate for p in points])
    busy = [p.figures.busy_fraction for p in points if p.figures.busy_fraction is not None]
    util = [p.gpu["utilisation_mean_perc"] / 100 for p in points if p.gpu]
    # the energy where the self-hosted cost is taken: at the capacity's probes, else the ranking load
    energy = [e for e in map(point_energy, capacity_points(run) or points) if e.joules_per_task is not None]
    per_token = [e.joules_per_output_token for e in energy if e.joules_per_output_token is not None]
    return Cost(
        self_hosted_per_task=cost.self_hosted_per_task(spec, tasks_h, run.config.replicas),
        api_per_task=_mean([cost.api_per_task(spec, cost.api_tokens_of(state.workload.api_tokens[p.repeat],
                                                                        p.figures.task_times)) for p in points]),
        at_rate_per_s=at_rate, tasks_per_hour=tasks_h,
        utilisation=statistics.fmean(busy) if busy else (statistics.fmean(util) if util else None),
        utilisation_source="twin engine busy share" if busy else ("GPU utilisation (NVML)" if util else "not measured"),
        joules_per_task=statistics.fmean(e.joules_per_task for e in energy) if energy else None,
        joules_per_output_token=statistics.fmean(per_token) if per_token else None,
        energy_source=", ".join(dict.fromkeys(e.source for e in energy)) if energy else None)


@dataclass(frozen=True)
class PointEnergy:
    """A point's joules per completed task and per output token, and where they come from."""

    joules_per_task: Optional[float]
    joules_per_output_token: Optional[float] = None
    source: str = ""


def point_energy(point: PointResult) -> PointEnergy:
    """The point's energy per task: its summary's (over the window: the twin's power model, or the NVML
    power samples of its /metrics probe), else the study's own NVML sampling of a live point (the whole
    point's energy over the window's completed tasks), else none."""
    f = point.figures
    if f is not None and f.joules_per_task is not None:
        return PointEnergy(f.joules_per_task, f.joules_per_output_token, f.energy_source or "")
    if f is not None and point.gpu and f.tasks_completed:
        return PointEnergy(point.gpu["energy_j"] / f.tasks_completed, source="NVML (whole point)")
    return PointEnergy(None)


def _gpu(run: ConfigRun) -> Gpu:
    measured = [p for p in run.points if p.ok and p.gpu]
    if not measured:
        return Gpu(available=False, note=run.gpu_note or "no GPU figures")
    tasks = sum(p.figures.tasks_completed for p in measured)
    energy = sum(p.gpu["energy_j"] for p in measured)
    return Gpu(available=True, memory_used_max_bytes=max(p.gpu["memory_used_max_bytes"] for p in measured),
               utilisation_mean_perc=statistics.fmean(p.gpu["utilisation_mean_perc"] for p in measured),
               energy_j=energy, joules_per_task=energy / tasks if tasks else None)


def objective_values(study: StudySpec, runs: Mapping[str, ConfigRun], objective: Optional[str] = None) -> dict[str, Value]:
    """Each config's value of `objective` (default: the study's), with its samples (one per repeat) and
    interval."""
    objective, load = objective or study.objective, rank_load(study)
    spec = study.cost
    out = {}
    for name, run in runs.items():
        cap = run.capacity
        has_cap = cap is not None and cap.rate is not None
        if objective == "p95_task":
            points = sweep_points(run, load)
            times = [t for p in points for t in p.figures.completion_times]
            per_repeat = [float(np.percentile(p.figures.completion_times, 95)) for p in points
                          if p.figures.completion_times]
            value = Value(float(np.percentile(times, 95)) if times else None, per_repeat)
        elif objective == "goodput" and has_cap:
            value = Value(cap.rate * 3600, [e * 3600 for e in cap.estimates], cap.resolution * 3600,
                          (cap.ci[0] * 3600, cap.ci[1] * 3600) if cap.ci else None)
        elif objective == "cost" and has_cap:
            price = spec.gpu_hour * cost.gpus_of(spec, run.config.replicas)
            ci = None
            if cap.ci:
                low, high = cap.ci
                ci = (price / (high * 3600), price / (low * 3600) if low > 0 else math.inf)
            value = Value(price / (cap.rate * 3600), [price / (e * 3600) for e in cap.estimates], 0.0, ci)
        elif objective in ("goodput", "cost") and cap is not None and cap.status in ("above_range", "below_range"):
            value = _unbracketed(cap, objective, spec, run.config.replicas)
        elif objective == "energy":
            value = _energy(run)
        else:
            value = _best_sweep(run, objective, spec)
        out[name] = value.with_ci(study.confidence)
    return out


def _unbracketed(cap: Capacity, objective: str, spec: Any, replicas: int = 1) -> Value:
    """A capacity search that found no bracket ranks by its bound: above the range by the highest rate
    that held (at least that), below it as zero (no rate held)."""
    above = cap.status == "above_range"
    if objective == "goodput":
        if not above:
            return Value(0.0, [0.0 for _ in cap.searches])
        return Value(cap.at_least * 3600, [(s.low or 0.0) * 3600 for s in cap.searches], bound="at_least")
    if not above:
        return Value(None)
    price = spec.gpu_hour * cost.gpus_of(spec, replicas)
    return Value(price / (cap.at_least * 3600), [price / (s.low * 3600) for s in cap.searches if s.low],
                 bound="at_most")


def _sweep_loads(run: ConfigRun) -> list[list[PointResult]]:
    """The sweep's points that ran, grouped by load (the repeats of each)."""
    groups: dict[float, list[PointResult]] = defaultdict(list)
    for p in run.points:
        if p.source == "sweep" and p.ok:
            groups[p.load].append(p)
    return list(groups.values())


def _best_sweep(run: ConfigRun, objective: str, spec: Any) -> Value:
    """Without a capacity: the best load of the sweep by the repeats' mean (cost: among loads that held
    the SLO, when any did)."""
    best: Optional[Value] = None
    for group in _sweep_loads(run):
        if objective == "goodput":
            samples = [p.figures.goodput_tasks_per_hour if p.figures.goodput_tasks_per_hour is not None
                       else p.figures.throughput_tasks_per_hour for p in group]
        else:
            if not all(p.verdict() in ("held", None) for p in group):
                continue
            samples = [cost.self_hosted_per_task(spec, p.sustained_tasks_per_hour(), run.config.replicas)
                       for p in group]
            if any(s is None for s in samples):
                continue
        candidate = Value(statistics.fmean(samples), samples)
        if best is None:
            best = candidate
        elif candidate.value > best.value if HIGHER_IS_BETTER[objective] else candidate.value < best.value:
            best = candidate
    return best or Value(None)


def _energy(run: ConfigRun) -> Value:
    """Joules per completed task at each repeat's highest capacity probe that held, one sample a repeat
    (above the search's range: at most that, since a higher load spreads the idle power over more tasks);
    without a capacity search, the lowest of the sweep's loads that held the SLO by the repeats' mean."""
    cap = run.capacity
    if cap is not None:
        samples = [e.joules_per_task for e in map(point_energy, capacity_points(run))]
        if not samples or any(s is None for s in samples):
            return Value(None)
        return Value(statistics.fmean(samples), samples, bound="at_most" if cap.status == "above_range" else "exact")
    best: Optional[Value] = None
    for group in _sweep_loads(run):
        samples = [point_energy(p).joules_per_task for p in group]
        if any(s is None for s in samples) or not all(p.verdict() in ("held", None) for p in group):
            continue
        if best is None or statistics.fmean(samples) < best.value:
            best = Value(statistics.fmean(samples), samples)
    return best or Value(None)


def _finite(pair: Optional[tuple[float, float]]) -> Optional[tuple[Optional[float], Optional[float]]]:
    """JSON has no infinity: an open end of an interval is null."""
    if pair is None:
        return None
    return tuple(v if math.isfinite(v) else None for v in pair)  # type: ignore[return-value]


def _objective(spec: StudySpec, value: Value, run: ConfigRun) -> Objective:
    cap = run.capacity
    resolution = None
    if spec.objective == "goodput" and cap is not None and cap.rate is not None:
        resolution = cap.resolution * 3600
    return Objective(value=value.value, ci=_finite(value.ci), unit=UNITS[spec.objective],
                     bound=value.bound, samples=len(value.samples), resolution=resolution)


def config_entry(state: StudyState, run: ConfigRun, value: Value, rank_no: Optional[int],
                 twin: Optional[TwinEntry]) -> ConfigResult:
    """One config in study.json."""
    c, spec = run.config, state.spec
    load = rank_load(spec)
    at = sweep_points(run, load)
    at_load = load
    if not at:
        at = capacity_points(run)
        at_load = _mean([p.load for p in at])
    reference = next((p for p in run.points if p.source == "reference" and p.ok), None)
    status = "ok" if run.error is None else ("failed" if not any(p.ok for p in run.points) else "partial")
    return ConfigResult(
        name=c.name, kind=c.kind, is_base=c.is_base, differs_by=c.differs_by, status=status, error=run.error,
        server=run.server, points=[StudyPoint.model_validate(p.to_dict()) for p in run.points], sweep=_sweep(run),
        at_load=at_load, **(_aggregate(at) if at else {}),
        capacity=CapacityResult.model_validate(run.capacity.to_dict()) if run.capacity is not None else None,
        holdout=HoldoutResult.model_validate(run.holdout.to_dict()) if run.holdout is not None else None,
        cost=_cost(state, run, at),
        quality=Quality.model_validate(run.quality) if run.quality is not None else None,
        gpu=_gpu(run),
        reference=None if reference is None else {
            "label": spec.reference.label or _shape_label(spec), "folder": reference.folder,
            "output_tokens_per_s": reference.figures.output_tokens_per_s,
            "requests_per_s": reference.figures.requests_per_s},
        objective=_objective(spec, value, run), rank=rank_no, twin=twin, twin_band=run.band,
        fleet=fleet_result(c, run.capacity, at, spec.cost))


def _shape_label(spec: StudySpec) -> str:
    s = spec.reference.synthetic
    return f"{s.input_tokens}/{s.output_tokens} x {s.concurrency}"


def build(state: StudyState) -> Study:
    """The whole study.json, from the study's state and nothing else."""
    spec, objective = state.spec, state.spec.objective
    values = objective_values(spec, state.runs)
    order, comparisons = rank(values, objective, spec.confidence)
    comparisons = [_with_band(c, state.runs) for c in comparisons]
    ranks = {name: i + 1 for i, name in enumerate(order) if values[name].value is not None}
    prediction, twin_entries = _twin_prediction(state, order)
    workload = state.workload
    points = state.all_points()
    fresh = [p.overhead_s for p in points if not p.resumed]
    configs = [config_entry(state, run, values[name], ranks.get(name), twin_entries.get(name))
               for name, run in state.runs.items()]
    return Study(
        agentload_study=STUDY_VERSION, name=spec.display_name(), description=spec.description,
        study_file=spec.source, folder=str(state.folder),
        started_at=_iso(state.started_at), finished_at=_iso(state.finished_at) if state.complete else None,
        complete=state.complete,
        workload={"source": workload.source, "tasks": workload.tasks, "calls": workload.calls,
                  "subtasks": workload.subtasks, "base_rate_per_s": workload.base_rate_per_s},
        slo=state.slo.model_dump(mode="json", exclude_none=True, by_alias=True),
        axis=spec.load.axis if spec.load else None, axis_unit=AXIS_UNITS[spec.load.axis] if spec.load else None,
        objective=objective, confidence=spec.confidence, repeats=spec.repeats,
        capacity_repeats=(spec.capacity.repeats or spec.repeats) if spec.capacity else None,
        notes=list(state.notes) + _untestable_notes(state),
        cost=spec.cost.model_dump(mode="json") if spec.cost else None,
        base=state.base().name,
        configs=configs,
        ranking=Ranking(objective=objective, unit=UNITS[objective],
                        better="higher" if HIGHER_IS_BETTER[objective] else "lower", order=order,
                        comparisons=comparisons),
        twin_prediction=prediction,
        space=_space(state, order, values),
        overhead={"points": len(fresh), "mean_s": statistics.fmean(fresh) if fresh else None,
                  "max_s": max(fresh) if fresh else None},
        failed_points=[FailedPoint(config=p.config, load=p.load, repeat=p.repeat, source=p.source, error=p.error,
                                   folder=p.folder) for p in points if p.status != "ok"],
        sizing=sizing(spec.sizing, configs, spec.cost, spec.confidence),
    )


def _with_band(comparison: Comparison, runs: Mapping[str, ConfigRun]) -> Comparison:
    """`comparison` with whether its two configs are within the twin's band (`twin_band`)."""
    a, b = runs[comparison.better].band, runs[comparison.worse].band
    if a is None or b is None:
        return comparison
    return comparison.model_copy(update={"within_twin_band": a.overlaps(b),
                                         "band_verdict": band_verdict(comparison.better, comparison.worse, a, b)})


def _untestable_notes(state: StudyState) -> list[str]:
    """One line per config whose probes or sweep points came as bursts too short to test their rate."""
    notes = []
    tasks = state.workload.tasks
    for name, run in state.runs.items():
        bursts = sorted({p.offered_rate for p in run.points if p.verdict() == "untestable"})
        if bursts:
            rates = ", ".join(f"{rate:.3g}" for rate in bursts)
            notes.append(f"{name}: at {rates} tasks/s the SLO held, but the workload's {tasks:,} tasks arrived within "
                         "two median task times: a burst, not a test of that rate (more tasks test higher rates)")
    return notes


def _twin_prediction(state: StudyState, measured: list[str]) -> tuple[Optional[TwinPrediction], dict[str, TwinEntry]]:
    """The twin's order of the live configs it ran, against the measured order of the same configs."""
    if not state.twin_runs:
        return None, {}
    values = objective_values(state.spec, state.twin_runs)
    predicted = order_of({n: v.value for n, v in values.items()}, state.spec.objective)
    names = set(state.twin_runs)
    measured_same = [n for n in measured if n in names]
    profile = state.twin_profile or ""
    entries = {n: TwinEntry(predicted_value=values[n].value, predicted_rank=predicted.index(n) + 1, profile=profile)
               for n in predicted}
    left_out = [c.name for c in state.configs if c.live and c.name not in names]
    note = f"no twin equivalent (flags only): {', '.join(left_out)}" if left_out else None
    bands = {n: state.twin_runs[n].band for n in predicted}
    within = []
    for a, b in zip(predicted, predicted[1:]):
        band_a, band_b = bands[a], bands[b]
        if band_a is not None and band_b is not None and band_a.overlaps(band_b):
            within.append(band_verdict(a, b, band_a, band_b) or "")
    return TwinPrediction(profile=profile, calibrated=state.calibrated, configs=sorted(names),
                          predicted_order=predicted, measured_order=measured_same,
                          same_order=predicted == measured_same, note=note, within_band=within), entries


def _space(state: StudyState, measured: list[str], values: Mapping[str, Value]) -> Optional[SpaceResult]:
    """The config space's section (`simulator.study.space_result`), each objective's values of its
    candidates on the twin computed here as for the study's own configs."""
    if state.space is None:
        return None
    objectives = dict.fromkeys([state.spec.objective, *objectives_of(state.spec)])
    predicted = {o: objective_values(state.spec, state.space.runs, o) for o in objectives}
    return space_result(state, measured, values, predicted)
