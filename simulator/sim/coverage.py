"""Coverage of a simulation: how its calls lie against the region of call shapes the profile's calibration
measured (`simulator.sim.profile.CalibratedRegion`), per dimension the share of calls below and above
the range and how far, and the share outside any range (`simulator.metrics.summary.Coverage`).

`CallShapes` stands in front of the run's record sink and keeps five numbers per call as records pass;
`coverage` then works over those arrays with numpy, once, after the run: nothing of it runs in the
twin's steps.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from ..metrics.records import CallRecord, TaskRecord
from ..metrics.results import Window
from ..metrics.summary import Coverage, RangeCoverage
from ..task_run import RecordSink
from .profile import BURST_WINDOW, CalibratedRegion, ServerProfile

DIFFERENCE_DIMENSIONS = frozenset({"cached_share"})
"""Dimensions whose distance past a bound is a difference (a share between 0 and 1); the others' a ratio."""


@dataclass(frozen=True)
class Shapes:
    """The calls of a run as coverage sees them, one entry per call record (attempts included)."""

    sent: np.ndarray
    """Actual send times, seconds."""
    ended: np.ndarray
    prompt: np.ndarray
    cached: np.ndarray
    """Prompt tokens served from the prefix cache (NaN: not reported)."""
    output: np.ndarray
    counted: np.ndarray
    """Booleans: the call was done and its intended send is in the measurement window."""


class CallShapes:
    """A record sink in front of `sink`: passes every record on, keeping each call's send and end
    times, tokens and whether it counts in `window`."""

    def __init__(self, sink: RecordSink, window: Window) -> None:
        self.sink = sink
        self.window = window
        self._times = array("d")
        self._tokens = array("d")
        self._counted = array("b")

    def call(self, record: CallRecord, gaps: Sequence[float] = ()) -> None:
        self.sink.call(record, gaps)
        self._times.extend((record.actual_send, record.end))
        cached = record.cached_tokens
        self._tokens.extend((record.input_tokens, np.nan if cached is None else cached, record.output_tokens))
        self._counted.append(record.ok and self.window.contains(record.intended_send))

    def task(self, record: TaskRecord) -> None:
        self.sink.task(record)

    def shapes(self) -> Shapes:
        """The calls seen so far."""
        times = np.array(self._times, dtype=float).reshape(-1, 2)  # copies, so the arrays can grow on
        tokens = np.array(self._tokens, dtype=float).reshape(-1, 3)
        return Shapes(times[:, 0], times[:, 1], tokens[:, 0], tokens[:, 1], tokens[:, 2],
                      np.array(self._counted, dtype=bool))


def calibrated_region(profile: ServerProfile) -> Optional[CalibratedRegion]:
    """The region `profile`'s calibration measured (None: uncalibrated, or no region recorded)."""
    record = profile.calibration if profile.calibrated else None
    return None if record is None else record.region


def in_flight(sent: np.ndarray, ended: np.ndarray) -> np.ndarray:
    """For each call, the calls in flight when it was sent: sent by then (at the same instant included,
    itself too) and not ended by then."""
    return (np.searchsorted(np.sort(sent), sent, side="right")
            - np.searchsorted(np.sort(ended), sent, side="right"))


def burst_sizes(sent: np.ndarray, window: float = BURST_WINDOW) -> np.ndarray:
    """For each call, the calls of its burst: in send order, a burst is the first call not yet in one
    and every call sent within `window` seconds after it."""
    order = np.argsort(sent, kind="stable")
    times = sent[order]
    n = len(times)
    # A call sent more than `window` after the one before it begins a burst; only the runs of calls
    # closer together than that need the bursts found one by one.
    begins = np.concatenate(([True], times[1:] > times[:-1] + window))
    starts = np.flatnonzero(begins)
    ends = np.append(starts[1:], n)
    runs = ends - starts > 1
    listed = times.tolist()
    for first, end in zip(starts[runs].tolist(), ends[runs].tolist()):
        i = first
        while i < end:  # one step per burst; bisect runs in C
            begins[i] = True
            i = bisect_right(listed, listed[i] + window, i, end)
    counts = np.diff(np.append(np.flatnonzero(begins), n))
    sizes = np.empty(n, dtype=np.int64)
    sizes[order] = np.repeat(counts, counts)
    return sizes


def coverage(region: CalibratedRegion, shapes: Shapes, max_running: Optional[int] = None) -> Coverage:
    """The counted calls of `shapes` against `region`; the calls in the engine at most `max_running`
    (the server's `max_num_seqs`). Every call counts as load for the calls in flight and the bursts."""
    running = in_flight(shapes.sent, shapes.ended)
    if max_running is not None:
        running = np.minimum(running, max_running)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = shapes.cached / shapes.prompt
    values = {"prompt_tokens": shapes.prompt, "cached_share": share, "running_calls": running,
              "burst_calls": burst_sizes(shapes.sent), "output_tokens": shapes.output}
    counted = shapes.counted
    outside = np.zeros(int(counted.sum()), dtype=bool)
    dimensions = {}
    for name in CalibratedRegion.model_fields:
        low, high = getattr(region, name)
        value = np.asarray(values[name], dtype=float)[counted]
        known = value[~np.isnan(value)]
        below, above = known[known < low], known[known > high]
        if name in DIFFERENCE_DIMENSIONS:
            below_by, above_by = low - below, above - high
        else:
            below_by, above_by = low / np.maximum(below, 1.0), above / high
        outside |= (value < low) | (value > high)
        dimensions[name] = RangeCoverage(
            low=low, high=high, measure="difference" if name in DIFFERENCE_DIMENSIONS else "ratio",
            calls=len(known), below_share=_share(len(below), len(known)), below_median=_median(below_by),
            below_max=_max(below_by), above_share=_share(len(above), len(known)), above_median=_median(above_by),
            above_max=_max(above_by))
    return Coverage(calls=len(outside), outside=_share(int(outside.sum()), len(outside)), dimensions=dimensions)


def _share(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def _median(values: np.ndarray) -> Optional[float]:
    return float(np.median(values)) if len(values) else None


def _max(values: np.ndarray) -> Optional[float]:
    return float(np.max(values)) if len(values) else None
