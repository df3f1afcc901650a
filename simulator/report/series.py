"""The numbers behind the figures, computed from a folder's histograms and records: CDF points of an
HdrHistogram, counts in flight over time, rates per time bin, the /metrics series, the breakdown of
task time per class. Everything is bounded in size whatever the run's length (a figure gets at most a
few thousand points), so a report of a million calls stays small."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
from hdrh.histogram import HdrHistogram

from ..metrics.results import Window
from .folder_data import CallColumns, Scrapes, TaskColumns

MAX_CDF_POINTS = 1200
TIME_BINS = 400

BREAKDOWN_PARTS = (
    ("ttft", "queueing + prefill (TTFT)"),
    ("decode", "decode"),
    ("gaps", "tool / think time"),
    ("client_lag", "client lag"),
    ("other", "waiting for sub-agents"),
)
"""The parts of a task's time, in the summary's `breakdown_s` names, with their labels."""


def cdf(histogram: HdrHistogram, unit_us: float = 1000.0,
        max_points: int = MAX_CDF_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """(values, share of the recorded values at or below each) of a histogram's non-empty buckets,
    values in `unit_us` microseconds (1000: ms). A bucket's value is the highest it holds, as
    HdrHistogram's percentiles report it. Thinned to about `max_points`, keeping the points spread both
    over the values (log scale) and over the tail (1 - share, log scale)."""
    counts = np.ctypeslib.as_array(histogram.counts)[: histogram.counts_len]
    index = np.flatnonzero(counts)
    if index.size == 0:
        return np.empty(0), np.empty(0)
    values = np.fromiter((histogram.get_highest_equivalent_value(histogram.get_value_from_index(int(k)))
                          for k in index), dtype=np.float64, count=index.size)
    values = np.minimum(values, histogram.get_max_value()) / unit_us
    shares = np.cumsum(counts[index], dtype=np.float64) / float(counts[index].sum())
    if values.size > max_points:
        keep = _thin(values, shares, max_points)
        values, shares = values[keep], shares[keep]
    return values, shares


def _thin(values: np.ndarray, shares: np.ndarray, max_points: int) -> np.ndarray:
    """Indices of about `max_points` points: half evenly spaced in log(value), half in the tail."""
    half = max_points // 2
    low = max(values[0], 1e-9)
    by_value = np.searchsorted(values, np.geomspace(low, values[-1], half))
    tail = -np.log10(np.maximum(1.0 - shares, 1e-12))
    by_tail = np.searchsorted(tail, np.linspace(0.0, tail[-1], half))
    keep = np.unique(np.concatenate([by_value, by_tail, [0, values.size - 1]]))
    return keep[keep < values.size]


NICE_STEPS = (1.0, 2.0, 2.5, 5.0, 10.0)


def nice_width(span: float, bins: int) -> float:
    """The smallest round bin width (1, 2, 2.5 or 5 times a power of ten seconds) that covers `span`
    in at most `bins` bins."""
    raw = span / max(bins, 1)
    if not raw > 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(raw))
    return next(step * power for step in NICE_STEPS if step * power >= raw * (1 - 1e-9))


def time_edges(start: float, end: float, bins: int = TIME_BINS) -> np.ndarray:
    """Time bins of a round width (`nice_width`) from `start` to past `end`, at most `bins` of them
    (one bin of a second when the span is empty): a rate per bin reads as so many per 0.5 s."""
    if not end > start:
        end = start + 1.0
    width = nice_width(end - start, bins)
    count = max(1, math.ceil((end - start) / width - 1e-9))
    return start + width * np.arange(count + 1)


@dataclass(frozen=True)
class Occupancy:
    """How many intervals were open over each time bin: the time-weighted mean and the maximum."""

    edges: np.ndarray
    mean: np.ndarray
    peak: np.ndarray

    @property
    def centers(self) -> np.ndarray:
        """The middle of each bin."""
        return (self.edges[:-1] + self.edges[1:]) / 2


def occupancy(starts: Sequence[float], ends: Sequence[float], edges: np.ndarray) -> Occupancy:
    """Intervals [start, end) open over time (tasks or calls in flight), per bin of `edges`."""
    starts = np.asarray(starts, dtype=np.float64)
    ends = np.asarray(ends, dtype=np.float64)
    bins = len(edges) - 1
    if starts.size == 0:
        return Occupancy(edges, np.zeros(bins), np.zeros(bins))
    times = np.concatenate([starts, ends])
    steps = np.concatenate([np.ones(starts.size), -np.ones(ends.size)])
    order = np.lexsort((steps, times))  # at equal times an end goes before a start
    times, level = times[order], np.cumsum(steps[order])
    # area under the level up to each event, to take exact time-weighted means between any two times
    area = np.concatenate([[0.0], np.cumsum(level[:-1] * np.diff(times))])

    def level_at(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(times, t, side="right") - 1
        return np.where(i >= 0, level[np.maximum(i, 0)], 0.0)

    def area_at(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(times, t, side="right") - 1
        j = np.maximum(i, 0)
        return np.where(i >= 0, area[j] + level[j] * (t - times[j]), 0.0)

    mean = np.diff(area_at(edges)) / np.diff(edges)
    peak = level_at(edges[:-1])
    first = np.searchsorted(times, edges[:-1], side="left")
    last = np.searchsorted(times, edges[1:], side="left")
    for k in np.flatnonzero(last > first):  # bins with events: their highest level
        peak[k] = max(peak[k], level[first[k]:last[k]].max())
    return Occupancy(edges, mean, peak)


def per_second(times: Sequence[float], edges: np.ndarray, weights: Optional[Sequence[float]] = None) -> np.ndarray:
    """Events (or their `weights`, e.g. tokens) per second in each bin."""
    counts, _ = np.histogram(np.asarray(times, dtype=np.float64), bins=edges,
                             weights=None if weights is None else np.asarray(weights, dtype=np.float64))
    return counts / np.diff(edges)


def judged_shares(shares: np.ndarray, completed: int, judged: Optional[int]) -> np.ndarray:
    """A CDF's shares of the `completed` tasks as shares of the `judged` ones, so that the curve stops at
    the share that completed (the rest count as slower than any time, as the task SLO counts them);
    unchanged when the judged count is unknown or every judged task completed."""
    if not judged or judged <= completed:
        return shares
    return shares * (completed / judged)


def last_arrival(tasks: TaskColumns) -> Optional[float]:
    """The last intended arrival of a top-level task with a record (None without one): the end of
    arrivals, unless tasks were never started."""
    arrivals = tasks.arrival[tasks.top]
    return float(arrivals.max()) if arrivals.size else None


def run_span(calls: CallColumns, tasks: TaskColumns, samples: Optional[Scrapes] = None) -> tuple[float, float]:
    """The seconds a run's records and scrapes cover (from 0, or earlier if something was; 0 to 1 when
    there is nothing)."""
    times = [calls.intended, calls.end, tasks.arrival, tasks.end] + ([samples.t] if samples else [])
    times = [a for a in times if a.size]
    if not times:
        return 0.0, 1.0
    return float(min(0.0, *(a.min() for a in times))), float(max(a.max() for a in times))


def series(samples: Scrapes, key: str, edges: Optional[np.ndarray] = None) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """(t, value) of one /metrics gauge over the scrapes that have it; None when none has. With
    `edges`, the mean of the scrapes in each time bin that has any (hours of scrapes every second
    draw as a few hundred points)."""
    values = samples.values.get(key)
    if values is None:
        return None
    has = ~np.isnan(values)
    if not has.any():
        return None
    t, v = samples.t[has], values[has]
    if edges is None or t.size <= len(edges) - 1:
        return t, v
    counts, _ = np.histogram(t, bins=edges)
    sums, _ = np.histogram(t, bins=edges, weights=v)
    full = counts > 0
    centers = (edges[:-1] + edges[1:]) / 2
    return centers[full], sums[full] / counts[full]


def hit_share_series(samples: Scrapes, edges: Optional[np.ndarray] = None) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """The prefix-cache hit share (hits / queries of the counters' increase) between consecutive
    scrapes, at the later scrape's time, or per time bin of `edges`; spans without queries are left
    out."""
    hits, queries = samples.values.get("prefix_cache_hits"), samples.values.get("prefix_cache_queries")
    if hits is None or queries is None or samples.t.size < 2:
        return None
    t, d_hits, d_queries = samples.t[1:], np.diff(hits), np.diff(queries)
    known = ~(np.isnan(d_hits) | np.isnan(d_queries))
    t, d_hits, d_queries = t[known], d_hits[known], d_queries[known]
    if edges is not None and t.size > len(edges) - 1:
        d_hits, _ = np.histogram(t, bins=edges, weights=d_hits)
        d_queries, _ = np.histogram(t, bins=edges, weights=d_queries)
        t = (edges[:-1] + edges[1:]) / 2
    ok = d_queries > 0
    if not ok.any():
        return None
    return t[ok], d_hits[ok] / d_queries[ok]


def counted(tasks: TaskColumns, window: Window) -> np.ndarray:
    """Which tasks the task figures count: top-level, arrived in the window, completed."""
    inside = tasks.arrival >= window.start
    if window.end is not None:
        inside &= tasks.arrival <= window.end
    return tasks.top & tasks.ok & inside


def breakdown(tasks: TaskColumns, which: np.ndarray) -> dict[str, float]:
    """Mean seconds per task in each part of `BREAKDOWN_PARTS` (the summary's definition), and 'total',
    over the tasks `which` selects."""
    n = int(which.sum())
    if n == 0:
        return {key: 0.0 for key, _ in BREAKDOWN_PARTS} | {"total": 0.0}
    total = float((tasks.end[which] - tasks.arrival[which]).sum()) / n
    in_calls, ttft, gaps, lag = (float(a[which].sum()) / n for a in (tasks.in_calls, tasks.in_ttft,
                                                                       tasks.in_gaps, tasks.client_lag))
    return {"ttft": ttft, "decode": in_calls - ttft, "gaps": gaps, "client_lag": lag,
            "other": max(0.0, total - in_calls - gaps - lag), "total": total}


def breakdown_by_class(tasks: TaskColumns, window: Window) -> dict[str, dict[str, float]]:
    """`breakdown` of the counted tasks of each class, classes sorted."""
    base = counted(tasks, window)
    names = sorted(set(tasks.task_class[base].tolist()))
    return {name: breakdown(tasks, base & (tasks.task_class == name)) for name in names}
