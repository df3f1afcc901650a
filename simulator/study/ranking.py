"""The objective per config, the ranking, and whether each step of the ranking is beyond noise.

Objectives:

- ``goodput``: tasks per hour the config carries with the task SLO held: its capacity (from the capacity
  search, x 3600) when one ran, else the highest goodput (tasks/h completed within the task SLO's
  per-item bound) of its sweep points, repeats averaged. Higher is better.
- ``p95_task``: the 95th percentile of task completion time at the ranking load (`rank_at`, default the
  highest sweep value), the repeats' tasks pooled. Lower is better.
- ``cost``: self-hosted $ per completed task at the capacity (else the lowest of the sweep points that
  held the SLO). Lower is better.

Each config's value comes with samples (one per repeat, or one per task for p95_task). Two neighbours
in the ranking are compared by a bootstrap of the difference of their statistic (`scipy.stats.bootstrap`,
percentile method, at the study's confidence), widened by the capacity search's resolution; when the
interval holds 0, or a side has fewer than two samples and the two configs' own intervals overlap, the
difference is called within noise.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np
from scipy import stats

RESAMPLES = 2000
SEED = 12345
"""The bootstrap's seed: a study's verdicts do not change from one read of its results to the next."""

UNITS = {"goodput": "tasks/h", "p95_task": "s", "cost": "$/task"}
HIGHER_IS_BETTER = {"goodput": True, "p95_task": False, "cost": False}


def mean(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """The statistic of per-repeat samples (vectorised for the bootstrap)."""
    return np.mean(x, axis=axis)


def p95(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """The statistic of per-task times (vectorised for the bootstrap)."""
    return np.percentile(x, 95, axis=axis)


@dataclass
class Value:
    """A config's objective: the figure, its interval, and what the bootstrap resamples."""

    value: Optional[float]
    samples: list[float] = field(default_factory=list)
    statistic: Callable[..., Any] = mean
    resolution: float = 0.0
    """Half-width added to any interval (the capacity search's last brackets)."""
    ci: Optional[tuple[float, float]] = None

    def with_ci(self, confidence: float) -> Value:
        """This value with its interval: the given one, else a bootstrap of its samples, widened by
        the resolution."""
        if self.ci is None and self.value is not None:
            low, high = _interval(self.samples, self.statistic, confidence)
            self.ci = (low - self.resolution, high + self.resolution) if low is not None else None
        return self


def _interval(samples: list[float], statistic: Callable[..., Any], confidence: float,
              other: Optional[list[float]] = None) -> tuple[Optional[float], Optional[float]]:
    """Percentile-bootstrap interval of statistic(samples) (or of statistic(samples) - statistic(other))."""
    if len(samples) < 2 or (other is not None and len(other) < 2):
        return None, None
    if len(set(samples)) == 1 and (other is None or len(set(other)) == 1):
        point = float(statistic(np.asarray(samples))) - (float(statistic(np.asarray(other))) if other else 0.0)
        return point, point
    data = (np.asarray(samples),) if other is None else (np.asarray(samples), np.asarray(other))
    fn = statistic if other is None else (lambda x, y, axis=-1: statistic(x, axis=axis) - statistic(y, axis=axis))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # degenerate resamples of tiny samples warn; the interval stands
        result = stats.bootstrap(data, fn, confidence_level=confidence, n_resamples=RESAMPLES, method="percentile",
                                 random_state=np.random.default_rng(SEED), vectorized=True)
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


@dataclass(frozen=True)
class Comparison:
    """Two neighbours of the ranking: the difference of their objective, its interval, the verdict."""

    better: str
    worse: str
    difference: float
    ci: Optional[tuple[float, float]]
    significant: bool

    def to_dict(self, unit: str) -> dict[str, Any]:
        """The comparison as study.json holds it, with its verdict in words."""
        verdict = (f"{self.better} ahead of {self.worse}" if self.significant
                   else f"{self.better} and {self.worse} within noise")
        ci = [v if math.isfinite(v) else None for v in self.ci] if self.ci else None
        return {"better": self.better, "worse": self.worse, "difference": self.difference,
                "ci": ci, "significant": self.significant,
                "verdict": f"{verdict} ({self.difference:+.4g} {unit})"}


def rank(values: dict[str, Value], objective: str, confidence: float) -> tuple[list[str], list[Comparison]]:
    """Configs best first (those without a value last, in their order), and each neighbour compared."""
    higher = HIGHER_IS_BETTER[objective]
    valued = [name for name, v in values.items() if v.value is not None]
    order = sorted(valued, key=lambda n: values[n].value, reverse=higher)
    comparisons = [_compare(a, b, values[a], values[b], confidence, higher) for a, b in zip(order, order[1:])]
    return order + [n for n in values if n not in valued], comparisons


def _compare(a: str, b: str, va: Value, vb: Value, confidence: float, higher: bool) -> Comparison:
    difference = (va.value - vb.value) if higher else (vb.value - va.value)
    low, high = _interval(va.samples, va.statistic, confidence, vb.samples)
    if low is not None:
        if not higher:
            low, high = -high, -low
        widen = va.resolution + vb.resolution
        ci = (low - widen, high + widen)
        return Comparison(a, b, difference, ci, ci[0] > 0)
    if va.ci is not None and vb.ci is not None:
        apart = va.ci[0] > vb.ci[1] if higher else va.ci[1] < vb.ci[0]
        return Comparison(a, b, difference, None, apart)
    return Comparison(a, b, difference, None, False)


def order_of(values: dict[str, Optional[float]], objective: str) -> list[str]:
    """Names best first by plain values (None last): the twin's predicted order."""
    higher = HIGHER_IS_BETTER[objective]
    valued = sorted((n for n, v in values.items() if v is not None), key=lambda n: values[n], reverse=higher)
    return valued + [n for n, v in values.items() if v is None]
