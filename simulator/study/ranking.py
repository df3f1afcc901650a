"""The objective per config, the ranking, and whether each step of the ranking is beyond noise.

Objectives:

- ``goodput``: tasks per hour the config carries with the task SLO held: its capacity (from the capacity
  search, x 3600) when one ran, else the highest goodput (tasks/h completed within the task SLO's
  per-item bound) of its sweep points, repeats averaged. Higher is better.
- ``p95_task``: the 95th percentile of task completion time at the ranking load (`rank_at`, default the
  highest sweep value), the repeats' tasks pooled. Lower is better.
- ``cost``: self-hosted $ per completed task at the capacity (else the lowest of the sweep points that
  held the SLO). Lower is better.
- ``energy``: the GPUs' joules per completed task at each repeat's highest capacity probe that held
  (else the lowest of the sweep loads that held the SLO): the twin's power model, or NVML live
  (`simulator.metrics.energy`). Lower is better; a config whose points have no energy is not ranked.

Each config's value comes with one sample per repeat (a capacity search's estimate, a run's figure, a
run's own p95). A statistic claims only what its repeats support: with fewer than `MIN_REPEATS_FOR_CI`
samples a value has no confidence interval and two neighbours in the ranking are not tested (their
order is the measured one, said to be untested); from two on, the interval is Student's t over the
samples and the test of two neighbours Welch's t interval of the difference of their means, both at the
study's confidence and widened by the capacity search's resolution. A difference whose interval holds 0
is within noise. A value that is only a bound (a capacity above the search's range: at least X) is not
tested against a neighbour it could pass.

On the twin, repeats measure the workload's seeds, not the twin's own uncertainty: two neighbours whose
twin bands overlap (`simulator.study.twin_band`) are also said to be within the twin's band
(`band_verdict`).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Optional

from scipy import stats

from .model import MIN_REPEATS_FOR_CI, Comparison, TwinBand

UNITS = {"goodput": "tasks/h", "p95_task": "s", "cost": "$/task", "energy": "J/task"}
HIGHER_IS_BETTER = {"goodput": True, "p95_task": False, "cost": False, "energy": False}
REPEATS_HINT = "--set repeats=3"
"""How a user gets the repeats a test needs (the study's `repeats`, which capacity searches follow)."""


@dataclass
class Value:
    """A config's objective: the figure, its samples (one per repeat), its interval and its kind."""

    value: Optional[float]
    samples: list[float] = field(default_factory=list)
    resolution: float = 0.0
    """Half-width added to any interval (the capacity search's last brackets)."""
    ci: Optional[tuple[float, float]] = None
    bound: str = "exact"
    """'exact', or 'at_least' / 'at_most' when the value only bounds the figure."""

    def with_ci(self, confidence: float) -> Value:
        """This value with its interval: the given one, else Student's t over its samples (from
        `MIN_REPEATS_FOR_CI` on), widened by the resolution."""
        if self.ci is None and self.value is not None and self.bound == "exact":
            interval = _mean_interval(self.samples, confidence)
            if interval is not None:
                self.ci = (interval[0] - self.resolution, interval[1] + self.resolution)
        return self


def _mean_interval(samples: list[float], confidence: float) -> Optional[tuple[float, float]]:
    """Student's t interval of the mean of `samples` (None from too few)."""
    if len(samples) < MIN_REPEATS_FOR_CI:
        return None
    mean = statistics.fmean(samples)
    half = float(stats.t.ppf((1 + confidence) / 2, len(samples) - 1)) * statistics.stdev(samples) / math.sqrt(len(samples))
    return mean - half, mean + half


def _difference_interval(a: list[float], b: list[float], confidence: float) -> tuple[float, float]:
    """Welch's t interval of mean(a) - mean(b) (a point when neither varies)."""
    if statistics.pvariance(a) == 0 and statistics.pvariance(b) == 0:
        d = statistics.fmean(a) - statistics.fmean(b)
        return d, d
    interval = stats.ttest_ind(a, b, equal_var=False).confidence_interval(confidence)
    return float(interval.low), float(interval.high)


def rank(values: dict[str, Value], objective: str, confidence: float) -> tuple[list[str], list[Comparison]]:
    """Configs best first (those without a value last, in their order), and each neighbour compared."""
    higher = HIGHER_IS_BETTER[objective]
    valued = [name for name, v in values.items() if v.value is not None]
    order = sorted(valued, key=lambda n: values[n].value, reverse=higher)
    comparisons = [compare(a, b, values[a], values[b], confidence, objective) for a, b in zip(order, order[1:])]
    return order + [n for n in values if n not in valued], comparisons


def compare(a: str, b: str, va: Value, vb: Value, confidence: float, objective: str) -> Comparison:
    """`a` (ranked better) against `b`: the difference in `a`'s favour, and whether it is beyond noise."""
    higher = HIGHER_IS_BETTER[objective]
    unit = UNITS[objective]
    difference = (va.value - vb.value) if higher else (vb.value - va.value)
    amount = f"{_signed(difference)} {unit}"
    # a bound cannot be ordered against a value it may pass: 'at least X' ranked below, 'at most X' above
    loose = (va.bound == "at_most" if higher else va.bound == "at_least") or \
            (vb.bound == "at_least" if higher else vb.bound == "at_most")
    if loose:
        return Comparison(better=a, worse=b, difference=difference, tested=False, significant=None,
                          verdict=f"{a} and {b}: order not settled ({amount}): a value beyond its search's range "
                                  "bounds the figure only")
    n = min(len(va.samples), len(vb.samples))
    if n < MIN_REPEATS_FOR_CI:
        return Comparison(better=a, worse=b, difference=difference, tested=False, significant=None,
                          verdict=f"{a} ahead of {b} ({amount}) in {_repeats(n)}: not tested for significance "
                                  f"(needs {MIN_REPEATS_FOR_CI} repeats or more: {REPEATS_HINT})")
    low, high = _difference_interval(va.samples, vb.samples, confidence)
    if not higher:
        low, high = -high, -low
    widen = va.resolution + vb.resolution
    ci = (low - widen, high + widen)
    significant = ci[0] > 0
    words = f"{a} ahead of {b}" if significant else f"{a} and {b} within noise"
    return Comparison(better=a, worse=b, difference=difference, ci=ci, tested=True, significant=significant,
                      verdict=f"{words} ({amount}, {confidence:.0%} CI {_signed(ci[0])} to {_signed(ci[1])}, "
                              f"{n} repeats)")


def _repeats(n: int) -> str:
    return "one repeat" if n == 1 else "no repeat" if n == 0 else f"{n} repeats"


def _signed(value: float) -> str:
    """A difference for a sentence: sign, thousands separated, no exponent, float noise as 0."""
    if abs(value) < 1e-9:
        return "0"
    magnitude = abs(value)
    digits = 0 if magnitude >= 100 else 1 if magnitude >= 10 else 2 if magnitude >= 1 else 2 - math.floor(math.log10(magnitude))
    return f"{value:+,.{digits}f}"


def plain(value: Optional[float]) -> str:
    """A figure for a sentence: thousands separated, no exponent, the digits its size needs."""
    return "-" if value is None else _signed(value).removeprefix("+")


def band_text(name: str, band: TwinBand) -> str:
    """'a 10.2–11.9': a config's band in a sentence."""
    return f"{name} {plain(band.low)}–{plain(band.high)}"


def band_verdict(better: str, worse: str, a: TwinBand, b: TwinBand) -> Optional[str]:
    """Whether `better` (ranked ahead) and `worse` are within the twin's band, in a sentence with both
    bands; None when either has no band."""
    within = a.overlaps(b)
    if within is None:
        return None
    unit = f" {a.unit}" if a.unit else ""
    ranges = f"{a.label} {a.where}: {band_text(better, a)}, {band_text(worse, b)}{unit}"
    if within:
        return f"{better} and {worse} within the twin's band ({ranges}): the twin's own uncertainty could swap them"
    return f"{better} ahead of {worse} beyond the twin's band ({ranges})"


def order_of(values: dict[str, Optional[float]], objective: str) -> list[str]:
    """Names best first by plain values (None last): the twin's predicted order."""
    higher = HIGHER_IS_BETTER[objective]
    valued = sorted((n for n, v in values.items() if v is not None), key=lambda n: values[n], reverse=higher)
    return valued + [n for n, v in values.items() if v is None]

