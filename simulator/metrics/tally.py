"""The running counts and histograms a run's summary is computed from, fed one record at a time.

A `RunTally` takes every call and task record as it finishes (`call`, `task`: the `RecordSink` that
`ResultWriter` forwards to) and keeps only counters, sums, maxima and HdrHistograms, per task class
where the summary has per-class figures: its memory does not grow with the number of records, so a
10M-call run is summarised without holding or re-reading its records. The calls' values go into their
histograms in batches of up to `BATCH` (`histograms.record_many_seconds`, which leaves a histogram
exactly as recording them one by one does); `hist`, `flush`, and packing or merging a tally
(`simulator.scale.merge`) record what is gathered first. `simulator.metrics.summary.from_tally`
turns the tally into the typed `Summary`; fed the same records it gives the same figures,
bit for bit, as computing them from the lists of records did (sums are added in record order).

The error messages of failed attempts are counted too (`error_messages`), up to `MESSAGE_KINDS`
distinct ones, so that a report can show what failed and not only its class.
"""

from __future__ import annotations

from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Sequence

from hdrh.histogram import HdrHistogram

from . import histograms as H
from .records import CallRecord, TaskRecord
from .results import Window
from .slo import Slo

CANCELLED = "cancelled"
"""The error class of calls and tasks cut off by a stop (see `simulator.task_run`)."""
MESSAGE_KINDS = 1000
"""Distinct (class, message) pairs counted; later new ones are counted as `OTHER_MESSAGES`."""
MESSAGE_LENGTH = 300
"""Characters of an error message kept (the rest is cut, with an ellipsis)."""
OTHER_MESSAGES = "(further distinct messages)"
CALL_HISTOGRAMS = ("ttft", "tpot", "itl_approx", "e2el", "client_lag")
"""The histograms of the window's calls (`RunTally.hist`)."""
BATCH = 1 << 16
"""Values a call histogram gathers before they go into it at once (`histograms.record_many_seconds`: a
few numpy passes for the batch rather than an HdrHistogram call per value)."""


@dataclass
class TaskCounts:
    """The top-level tasks of one class (or of all) whose arrival is in the window."""

    counted: int = 0
    ok: int = 0
    failed: int = 0
    """Not ok and not cancelled (a class's figures count the cancelled as failed too)."""
    cancelled: int = 0
    within_bound: int = 0
    """Completed within the task SLO's per-item bound."""
    completion: HdrHistogram = field(default_factory=H.new_histogram)


@dataclass
class _Breakdown:
    """Sums over the completed tasks of the window, added in record order."""

    total: float = 0
    in_calls: float = 0
    ttft: float = 0
    gaps: float = 0
    client_lag: float = 0


class RunTally:
    """Counters and histograms of a run's records (see the module docstring). `window` and `slo` are
    those the summary is judged by: they decide what is counted as each record comes."""

    def __init__(self, window: Window = Window(), slo: Slo = Slo()) -> None:
        self.window = window
        self.slo = slo
        self._task_bound = slo.task_s.item_bound() if slo.task_s else None
        self._ttft_bound = slo.ttft_ms.item_bound() / 1000 if slo.ttft_ms else None
        self._tpot_bound = slo.tpot_ms.item_bound() / 1000 if slo.tpot_ms else None
        # calls, all of them
        self.attempts = 0
        self.calls_ok = 0
        self.failed_attempts = 0
        self.cancelled_calls = 0
        self.errors: Counter[str] = Counter()
        self.messages: Counter[tuple[str, str]] = Counter()
        # calls whose intended send is in the window
        self.window_calls = 0
        self.window_ok = 0
        self.input_tokens = 0
        self.output_tokens = 0
        self.cached_tokens: Optional[int] = None
        self.meeting_ttft = 0
        self.meeting_tpot = 0
        self.meeting_all = 0
        self.latest_end: Optional[float] = None
        self._hist = {name: H.new_histogram() for name in CALL_HISTOGRAMS}
        self._pending = {name: array("d") for name in CALL_HISTOGRAMS}
        """Seconds not yet in `_hist` (read through `hist`, which records them first)."""
        self._itl_weights = array("q")
        """The count each value of ``_pending["itl_approx"]`` is recorded with (its call's gaps)."""
        # tasks
        self.tasks_finished = 0
        self.top_finished = 0
        self.all_tasks = TaskCounts()
        self.by_class: dict[str, TaskCounts] = {}
        self.breakdown = _Breakdown()

    # --- feeding it --------------------------------------------------------------------------------

    def call(self, record: CallRecord, gaps: Sequence[float] = ()) -> None:
        """Count one call record (an attempt); `gaps` are unused (the live ITL histogram has them)."""
        self.attempts += 1
        if record.error_class == CANCELLED:
            self.cancelled_calls += 1
        if record.ok:
            self.calls_ok += 1
        else:
            kind = record.error_class or "unknown"
            self.errors[kind] += 1
            self._message(kind, record.error_message)
            if record.error_class != CANCELLED:
                self.failed_attempts += 1
        if not self.window.contains(record.intended_send):
            return
        self.window_calls += 1
        self._end(record.end)
        lag = self._pending["client_lag"]
        lag.append(record.client_lag)
        if record.ok:
            self._ok_call(record)
        if len(lag) >= BATCH:  # every other call histogram has at most as many values waiting
            self.flush()

    def _ok_call(self, c: CallRecord) -> None:
        self.window_ok += 1
        self.input_tokens += c.input_tokens
        self.output_tokens += c.output_tokens
        if c.cached_tokens is not None:
            self.cached_tokens = (self.cached_tokens or 0) + c.cached_tokens
        ttft, tpot = c.ttft, c.tpot
        pending = self._pending
        if ttft is not None:
            pending["ttft"].append(ttft)
        if tpot is not None:
            pending["tpot"].append(tpot)
        pending["e2el"].append(c.latency)
        if c.itl_count and c.itl_mean is not None:
            pending["itl_approx"].append(c.itl_mean)
            self._itl_weights.append(c.itl_count)
        ttft_bound, tpot_bound = self._ttft_bound, self._tpot_bound
        ttft_ok = ttft_bound is None or (ttft is not None and ttft <= ttft_bound)
        tpot_ok = tpot_bound is None or tpot is None or tpot <= tpot_bound
        self.meeting_ttft += ttft_ok
        self.meeting_tpot += tpot_ok
        self.meeting_all += ttft_ok and tpot_ok

    def _message(self, kind: str, message: Optional[str]) -> None:
        text = " ".join((message or "").split())
        if len(text) > MESSAGE_LENGTH:
            text = text[: MESSAGE_LENGTH - 1] + "…"
        key = (kind, text)
        if key not in self.messages and len(self.messages) >= MESSAGE_KINDS:
            key = (kind, OTHER_MESSAGES)
        self.messages[key] += 1

    def task(self, record: TaskRecord) -> None:
        """Count one finished task or sub-task."""
        self.tasks_finished += 1
        if record.parent_id is not None:
            return
        self.top_finished += 1
        if not self.window.contains(record.arrival):
            return
        self._end(record.end)
        group = self.by_class.get(record.task_class)
        if group is None:
            group = self.by_class[record.task_class] = TaskCounts()
        completion = record.completion_time
        for counts in (self.all_tasks, group):
            counts.counted += 1
            if record.error_class == CANCELLED:
                counts.cancelled += 1
            if record.ok:
                counts.ok += 1
                H.record_seconds(counts.completion, completion)
                if self._task_bound is not None and completion <= self._task_bound:
                    counts.within_bound += 1
            elif record.error_class != CANCELLED:
                counts.failed += 1
        if record.ok:
            b = self.breakdown
            b.total += completion
            b.in_calls += record.time_in_calls
            b.ttft += record.time_in_ttft
            b.gaps += record.time_in_gaps
            b.client_lag += record.client_lag

    def _end(self, end: float) -> None:
        if self.latest_end is None or end > self.latest_end:
            self.latest_end = end

    def feed(self, calls: Iterable[CallRecord], tasks: Iterable[TaskRecord]) -> RunTally:
        """Count all these records (calls first); returns the tally."""
        for c in calls:
            self.call(c)
        for t in tasks:
            self.task(t)
        return self

    def flush(self) -> None:
        """Record the values gathered into the call histograms (each histogram ends exactly as recording
        them one at a time with `histograms.record_seconds` leaves it)."""
        for name, values in self._pending.items():
            if values:
                H.record_many_seconds(self._hist[name], values,
                                      self._itl_weights if name == "itl_approx" else None)
                self._pending[name] = array("d")
        self._itl_weights = array("q")

    # --- reading it -------------------------------------------------------------------------------

    @property
    def hist(self) -> dict[str, HdrHistogram]:
        """The call histograms by name (`CALL_HISTOGRAMS`), of the window's calls counted so far."""
        self.flush()
        return self._hist

    @property
    def duration(self) -> float:
        """Seconds from the window's start to the last counted call or task end."""
        start = self.window.start
        latest = self.latest_end if self.latest_end is not None else start
        return max(0.0, latest - start)

    def histograms(self, itl: Optional[HdrHistogram] = None) -> dict[str, HdrHistogram]:
        """The latency histograms the figures come from (histograms.json); without the live `itl`
        histogram, ITL is approximated from each call's mean gap, weighted by its count."""
        h = self.hist
        out = {"ttft": h["ttft"], "tpot": h["tpot"], "itl": itl if itl is not None else h["itl_approx"],
               "e2el": h["e2el"], "client_lag": h["client_lag"], "task_completion": self.all_tasks.completion}
        for name in sorted(self.by_class):
            out[f"task_completion[{name}]"] = self.by_class[name].completion
        return out

    def top_messages(self, limit: int = 10) -> list[dict[str, Any]]:
        """The most frequent error messages of failed attempts: class, message, count."""
        return [{"error_class": kind, "message": message, "count": n}
                for (kind, message), n in self.messages.most_common(limit)]
