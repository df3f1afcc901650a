"""The capacity search: the highest task arrival rate at which every SLO holds.

One search per repeat (each with its own seed): probe `low`; if it holds, probe `high`, doubling until
a rate fails; if `low` fails, halve until one holds, not below `min_rate` (bracketing). Then bisect the
bracket on a log scale until its high is within `precision` above its low. The repeat's estimate is the
middle of its last bracket.

A finite workload tests a rate only while its arrivals last long enough for the load to build up (see
`simulator.study.points.PointResult.tests_rate`): at a higher rate its tasks come as one burst, and a
burst the server clears within the SLO says nothing of the rate it could sustain. Such a probe is
*untestable*: it bounds the search from above like a failure, but says only that the workload cannot
test past it, so a config that held at every rate it could test ends 'above_range', at least its
highest tested rate.

The capacity is the mean of the repeats' estimates. Its confidence interval is the Student-t interval of
that mean at the study's confidence, which needs two repeats or more, widened by the mean half-width of
the last brackets (the bisection's resolution); from one repeat there is no interval, only that
resolution, reported as what it is.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Callable, Optional

from scipy import stats

HELD, MISSED, UNTESTABLE = "held", "missed", "untestable"
Probe = Callable[[float], Optional[str]]
"""Runs a point at a rate: HELD (every SLO held), MISSED, UNTESTABLE (held, but the workload's arrivals
were too short to test the rate), or None when the point failed."""


@dataclass
class Search:
    """One repeat's search."""

    repeat: int
    probes: list[tuple[float, Optional[str]]] = field(default_factory=list)
    low: Optional[float] = None
    """The highest rate that held (and that the workload could test)."""
    high: Optional[float] = None
    """The lowest rate that did not."""
    ceiling: Optional[float] = None
    """The lowest rate the workload could not test (held, but as a burst)."""
    status: str = "ok"
    """'ok', 'imprecise' (probe budget spent before the precision), 'below_range' (no rate held),
    'above_range' (no rate it could test failed) or 'failed' (a point failed)."""

    @property
    def estimate(self) -> Optional[float]:
        """The middle of the last bracket (None without one, or when the bracket's top was untestable)."""
        if self.low is None or self.high is None or (self.ceiling is not None and self.ceiling <= self.high):
            return None
        return (self.low + self.high) / 2

    def to_dict(self) -> dict:
        """The search as study.json holds it."""
        return {"repeat": self.repeat, "low": self.low, "high": self.high, "estimate": self.estimate,
                "untestable_from": self.ceiling, "status": self.status,
                "probes": [{"rate": r, "verdict": v} for r, v in self.probes]}


class _PointFailed(Exception):
    """A probe's point failed: the search stops."""


def search(probe: Probe, low: float, high: float, precision: float, max_probes: int, repeat: int = 0,
           factor: float = 2.0, min_rate: float = 0.0) -> Search:
    """Bracket then bisect (see the module doc); `probe` runs one point. Halving stops at `min_rate`."""
    result = Search(repeat)

    def run(rate: float) -> None:
        verdict = probe(rate)
        result.probes.append((rate, verdict))
        if verdict is None:
            raise _PointFailed
        if verdict == HELD:
            result.low = rate if result.low is None else max(result.low, rate)
        elif verdict == MISSED:
            result.high = rate if result.high is None else min(result.high, rate)
        else:
            result.ceiling = rate if result.ceiling is None else min(result.ceiling, rate)

    def budget() -> bool:
        return len(result.probes) < max_probes

    def top() -> Optional[float]:
        """The rate the bracket's upper end is at: the lowest failed or untestable one."""
        tops = [r for r in (result.high, result.ceiling) if r is not None]
        return min(tops) if tops else None

    try:
        run(low)
        if result.low is not None:
            run(high)
        while (result.low is None or top() is None) and budget():
            if result.low is None:
                if result.high is None or result.high / factor < min_rate:
                    break
                run(result.high / factor)
            else:
                run(result.low * factor)
        while result.low is not None and top() is not None and top() > result.low * (1 + precision) and budget():
            run(math.sqrt(result.low * top()))
    except _PointFailed:
        result.status = "failed"
        return result
    if result.low is None:
        result.status = "below_range"
    elif result.high is None or (result.ceiling is not None and result.ceiling < result.high):
        result.status = "above_range"
    elif result.high > result.low * (1 + precision):
        result.status = "imprecise"
    return result


@dataclass(frozen=True)
class Capacity:
    """The repeats' searches combined."""

    rate: Optional[float]
    """Tasks per second (None when no repeat bracketed it)."""
    ci: Optional[tuple[float, float]]
    """Its confidence interval (None from fewer than two repeats with an estimate)."""
    confidence: float
    status: str
    searches: tuple[Search, ...]

    @property
    def estimates(self) -> list[float]:
        """The repeats' estimates (those with a bracket)."""
        return [s.estimate for s in self.searches if s.estimate is not None]

    @property
    def resolution(self) -> float:
        """Mean half-width of the repeats' last brackets (tasks/s)."""
        widths = [(s.high - s.low) / 2 for s in self.searches if s.estimate is not None]
        return statistics.fmean(widths) if widths else 0.0

    @property
    def at_least(self) -> Optional[float]:
        """The highest rate any repeat held the SLO at (a lower bound when no rate failed)."""
        lows = [s.low for s in self.searches if s.low is not None]
        return max(lows) if lows else None

    @property
    def untestable_from(self) -> Optional[float]:
        """The lowest rate the workload could not test in any repeat (None: every rate probed tested)."""
        ceilings = [s.ceiling for s in self.searches if s.ceiling is not None]
        return min(ceilings) if ceilings else None

    @property
    def at_most(self) -> Optional[float]:
        """The lowest rate any repeat failed at (an upper bound when no rate held)."""
        highs = [s.high for s in self.searches if s.high is not None]
        return min(highs) if highs else None

    def to_dict(self) -> dict:
        """The capacity as study.json holds it (per second, minute and hour)."""
        ci = list(self.ci) if self.ci else None
        return {
            "rate_per_s": self.rate, "per_min": _times(self.rate, 60), "per_hour": _times(self.rate, 3600),
            "ci_per_s": ci, "ci_per_min": [v * 60 for v in ci] if ci else None, "confidence": self.confidence,
            "resolution_per_s": self.resolution if self.estimates else None, "estimates": len(self.estimates),
            "status": self.status, "at_least_per_s": self.at_least, "at_most_per_s": self.at_most,
            "untestable_from_per_s": self.untestable_from, "repeats": [s.to_dict() for s in self.searches],
        }


def _times(value: Optional[float], k: float) -> Optional[float]:
    return None if value is None else value * k


def combine(searches: list[Search], confidence: float) -> Capacity:
    """The capacity and its CI from the repeats' searches (see the module doc)."""
    done = [s for s in searches if s.estimate is not None]
    if not done:
        status = searches[0].status if searches else "failed"
        return Capacity(None, None, confidence, status, tuple(searches))
    mids = [s.estimate for s in done]
    mean = statistics.fmean(mids)
    ci = None
    if len(mids) >= 2:
        se = statistics.stdev(mids) / math.sqrt(len(mids))
        spread = float(stats.t.ppf((1 + confidence) / 2, len(mids) - 1)) * se
        half = statistics.fmean((s.high - s.low) / 2 for s in done)
        ci = (max(0.0, mean - spread - half), mean + spread + half)
    status = "ok" if len(done) == len(searches) else "partial"
    if any(s.status == "imprecise" for s in done):
        status = "imprecise"
    return Capacity(mean, ci, confidence, status, tuple(searches))
