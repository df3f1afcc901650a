"""The twin's band in a study that ranks configs on the twin: whether two configs' results are further
apart than the twin's own uncertainty.

Each twin config gets a band on the figure its rank rests on, at the points that figure comes from:
its capacity points (each repeat's highest probe that held) when it ranks by capacity (goodput or
cost), the band of its goodput there; otherwise its sweep points at the ranking load, the band of the
ranking's figure there (goodput, or the p95 task time). Each such point is simulated again on profiles
drawn from the calibration's fit (`simulator.sim.band`), and the config's band is the range of the
figure over all those simulations and the points' own. That is `draws` simulations more per point, not
per probe: a capacity search of eight probes costs one search more, not eight. Two configs whose bands
overlap are within the twin's band: the twin's own uncertainty could swap them. The capacity itself
carries no band (a band on it would take a capacity search per draw).

A config on an uncalibrated profile (the GB300 presets) has no band, says why, and simulates nothing
more.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Callable, Optional

from ..metrics.slo import Slo
from ..metrics.summary import BANDED_FIGURES, BandedFigure, load_summary
from ..pipeline.plan import RunPlan
from ..pipeline.twin import plan_band
from ..sim.band import no_band_reason
from ..sim.profile import ServerProfile
from .model import TwinBand
from .points import PointResult
from .result import capacity_points, rank_load, sweep_points
from .schema import StudySpec
from .state import ConfigRun

PlanOf = Callable[[PointResult], RunPlan]
"""The plan a point ran (its scenario, seeded workload and folder), to simulate it again."""


def band_figure(objective: str, slo: Slo) -> Optional[BandedFigure]:
    """The figure a config's rank rests on, as the band has it: the p95 task time for `p95_task`, the
    goodput (tasks/h within the task SLO) otherwise; None when that is goodput and the SLO has no task
    target."""
    if objective != "p95_task" and slo.task_s is None:
        return None
    key = "tasks.completion_time_s.p95" if objective == "p95_task" else "tasks.goodput_per_hour"
    return next(b for b in BANDED_FIGURES if b.key == key)


def ranking_points(spec: StudySpec, run: ConfigRun) -> tuple[str, list[PointResult]]:
    """(which points, the points) a config's band is taken at (see the module doc)."""
    cap = run.capacity
    if spec.objective in ("goodput", "cost", "energy") and cap is not None and cap.rate is not None:
        return "at its capacity points", capacity_points(run)
    return "at the ranking load", sweep_points(run, rank_load(spec))


def config_band(spec: StudySpec, slo: Slo, run: ConfigRun, profile: ServerProfile, plan_of: PlanOf,
                study_dir: Path, draws: int) -> TwinBand:
    """The band of the config `run` on `profile`, each ranking point simulated again `draws` times
    (the points' nominal figures read back from their folders under `study_dir`)."""
    banded = band_figure(spec.objective, slo)
    if banded is None:
        return TwinBand(note="no band: the ranking's goodput needs a task SLO (task_s)")
    figure = {"figure": banded.key, "label": banded.label, "unit": banded.unit}
    reason = no_band_reason(profile)
    if reason is not None:
        return TwinBand(**figure, note=reason)
    where, points = ranking_points(spec, run)
    values, lows, highs, method = [], [], [], None
    for point in points:
        band = plan_band(plan_of(point), profile, load_summary(study_dir / point.folder), draws)
        entry = band.figures.get(banded.key)
        if entry is None:
            continue
        values.append(entry.value)
        lows.append(entry.low)
        highs.append(entry.high)
        method = band.method
    if not values:
        return TwinBand(**figure, where=where, note="no band: no ranking point ran")
    return TwinBand(**figure, where=where, value=statistics.fmean(values), low=min(lows), high=max(highs),
                    draws=draws, points=len(values),
                    method=f"over its {len(values)} point(s), each the {method}")

