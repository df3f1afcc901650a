"""The capacity search: the highest task arrival rate at which every SLO holds.

One search per repeat (each with its own seed): probe `low`; if it holds, probe `high`, doubling until
a rate fails; if `low` fails, halve until one holds, not below `min_rate` (bracketing). Then bisect the bracket on a log
scale until its high is within `precision` above its low. The repeat's estimate is the middle of its
last bracket. The capacity is the mean of the repeats' estimates; its confidence interval adds the
Student-t interval of that mean (at the study's confidence, from two repeats on) to the mean half-width
of the last brackets, so it covers both the spread between repeats and the bisection's resolution.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Callable, Optional

from scipy import stats

Probe = Callable[[float], Optional[bool]]
"""Runs a point at a rate; True when every SLO held, False when not, None when the point failed."""


@dataclass
class Search:
    """One repeat's search."""

    repeat: int
    probes: list[tuple[float, Optional[bool]]] = field(default_factory=list)
    low: Optional[float] = None
    """The highest rate that held."""
    high: Optional[float] = None
    """The lowest rate that did not."""
    status: str = "ok"
    """'ok', 'imprecise' (probe budget spent before the precision), 'below_range' (no rate held),
    'above_range' (no rate failed) or 'failed' (a point failed)."""

    @property
    def estimate(self) -> Optional[float]:
        """The middle of the last bracket (None without one)."""
        if self.low is None or self.high is None:
            return None
        return (self.low + self.high) / 2

    def to_dict(self) -> dict:
        """The search as study.json holds it."""
        return {"repeat": self.repeat, "low": self.low, "high": self.high, "estimate": self.estimate,
                "status": self.status, "probes": [{"rate": r, "met": m} for r, m in self.probes]}


class _PointFailed(Exception):
    """A probe's point failed: the search stops."""


def search(probe: Probe, low: float, high: float, precision: float, max_probes: int, repeat: int = 0,
           factor: float = 2.0, min_rate: float = 0.0) -> Search:
    """Bracket then bisect (see the module doc); `probe` runs one point. Halving stops at `min_rate`."""
    result = Search(repeat)

    def run(rate: float) -> None:
        met = probe(rate)
        result.probes.append((rate, met))
        if met is None:
            raise _PointFailed
        if met:
            result.low = rate if result.low is None else max(result.low, rate)
        else:
            result.high = rate if result.high is None else min(result.high, rate)

    def budget() -> bool:
        return len(result.probes) < max_probes

    try:
        run(low)
        if result.low is not None:
            run(high)
        while (result.low is None or result.high is None) and budget():
            if result.low is None and result.high / factor < min_rate:
                break
            run(result.high / factor if result.low is None else result.low * factor)
        while result.low is not None and result.high is not None and result.high > result.low * (1 + precision) \
                and budget():
            run(math.sqrt(result.low * result.high))
    except _PointFailed:
        result.status = "failed"
        return result
    if result.low is None:
        result.status = "below_range"
    elif result.high is None:
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
            "status": self.status, "at_least_per_s": self.at_least, "at_most_per_s": self.at_most,
            "repeats": [s.to_dict() for s in self.searches],
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
    spread = 0.0
    if len(mids) >= 2:
        se = statistics.stdev(mids) / math.sqrt(len(mids))
        spread = float(stats.t.ppf((1 + confidence) / 2, len(mids) - 1)) * se
    half = statistics.fmean((s.high - s.low) / 2 for s in done)
    status = "ok" if len(done) == len(searches) else "partial"
    if any(s.status == "imprecise" for s in done):
        status = "imprecise"
    return Capacity(mean, (max(0.0, mean - spread - half), mean + spread + half), confidence, status, tuple(searches))
