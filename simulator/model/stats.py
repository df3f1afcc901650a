"""Descriptive statistics of a workload: sizes, token and gap distributions, prefix reuse, arrivals.

What `agentload trace inspect` prints, and the marginals `fidelity` compares between a recorded
workload and one generated from its fitted model.

`workload_samples` gathers every per-call and per-task quantity into numpy arrays in one pass;
`workload_stats` summarises them. Definitions (also in docs/trace-format.md):

- *calls per task*: per top-level task, its calls plus those of all its sub-tasks.
- *input, appended, output tokens*: per call, sub-task calls included. Appended tokens follow
  `simulator.workload.appended_tokens` against the previous call of the same (sub-)task; the first
  call of a (sub-)task appends its whole input.
- *gaps*: the `gap` of every call except the first of each (sub-)task.
- *task duration*: per top-level task, the end of its last call on the recorded clock. A call ends at
  ``start + server_time`` (0 when not recorded), where ``start`` is its recorded `sent_at` when present,
  else the previous call's end plus its gap; so with `sent_at` everywhere it is the last call's
  ``sent_at + server_time``, without it the sum of gaps and server times. A sub-task starts at the end
  of the call it follows and, if it ends later, extends its parent's duration. Time a parent spends
  waiting for sub-tasks is only seen through recorded `sent_at` values.
- *prefix reuse*: over calls that carry hash ids, the share of their input tokens covered by the
  leading run of blocks already seen in an earlier call, as a prefix cache would serve them
  (``block_size`` tokens a block, at most the call's input). *Within tasks* looks only at earlier calls
  of the same top-level task (its sub-tasks included); *across tasks* at earlier calls of any task.
  Tasks are taken in arrival order, each one's calls depth first (own calls, then sub-tasks).
- *arrivals*: of top-level tasks. Rate is 1 / mean inter-arrival time; the CV is std / mean of
  inter-arrival times; the index of dispersion is variance / mean of the task counts in consecutive
  complete windows from the first arrival (None with fewer than `MIN_WINDOWS` windows).
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from ..workload import Task, Workload, appended_tokens

PERCENTILES = (50, 90, 99)
DISPERSION_WINDOWS = (1.0, 10.0, 60.0)
MIN_WINDOWS = 5
"""Fewest complete windows for which an index of dispersion is reported."""


@dataclass(frozen=True)
class Distribution:
    """Summary of one sample: size, mean, percentiles (numpy's linear interpolation) and maximum."""

    count: int
    mean: Optional[float] = None
    p50: Optional[float] = None
    p90: Optional[float] = None
    p99: Optional[float] = None
    max: Optional[float] = None

    @classmethod
    def of(cls, values: np.ndarray) -> Distribution:
        """Summarise an array (all fields but `count` are None when it is empty)."""
        if values.size == 0:
            return cls(0)
        p50, p90, p99 = (float(v) for v in np.percentile(values, PERCENTILES))
        return cls(int(values.size), float(values.mean()), p50, p90, p99, float(values.max()))


@dataclass(frozen=True)
class PrefixReuse:
    """Shares of input tokens a prefix cache could serve from blocks seen before (see module doc)."""

    within_task: Optional[float]
    across_tasks: Optional[float]
    hashed_input_share: float
    """Share of all input tokens that belong to calls carrying hash ids (the base of both shares)."""


@dataclass(frozen=True)
class Arrivals:
    """How top-level tasks arrive."""

    span_s: float
    """Seconds from the first arrival to the last."""
    rate_per_s: Optional[float]
    interarrival_cv: Optional[float]
    index_of_dispersion: dict[str, Optional[float]]
    """Variance / mean of task counts per window, keyed by window ('1s', '10s', '60s')."""


@dataclass(frozen=True)
class WorkloadStats:
    """Everything `workload_stats` reports; `to_dict` gives plain JSON-ready values."""

    tasks: int
    calls: int
    subtasks: int
    calls_per_task: Distribution
    input_tokens: Distribution
    appended_tokens: Distribution
    output_tokens: Distribution
    gaps_s: Distribution
    task_duration_s: Distribution
    prefix_reuse: PrefixReuse
    arrivals: Arrivals
    provenance: list[dict[str, Any]] = field(default_factory=list)
    """Source, format and notes of each part the workload was read from."""

    def to_dict(self) -> dict[str, Any]:
        """Plain dicts, lists, numbers and strings."""
        return dataclasses.asdict(self)


MARGINALS = ("calls_per_task", "input_tokens", "appended_tokens", "output_tokens", "gaps_s", "task_duration_s")
"""Names of the distributions, shared by `Samples` and `WorkloadStats`."""
LABELS = {
    "calls_per_task": "calls per task",
    "input_tokens": "input tokens",
    "appended_tokens": "appended tokens",
    "output_tokens": "output tokens",
    "gaps_s": "gap (s)",
    "task_duration_s": "task duration (s)",
}
"""Display names of the distributions."""


@dataclass(frozen=True)
class Samples:
    """The raw per-call and per-task arrays a workload's statistics are computed from."""

    calls_per_task: np.ndarray
    input_tokens: np.ndarray
    appended_tokens: np.ndarray
    output_tokens: np.ndarray
    gaps_s: np.ndarray
    task_duration_s: np.ndarray
    arrivals: np.ndarray
    """Arrival times of top-level tasks, sorted."""
    subtasks: int
    prefix_reuse: PrefixReuse


@dataclass
class _Columns:
    """Per-call values gathered task by task (depth first), and the calls that carry hash ids."""

    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    appended: list[int] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    hashed: list[tuple[int, ...]] = field(default_factory=list)
    hashed_bs: list[int] = field(default_factory=list)
    hashed_input: list[int] = field(default_factory=list)
    hashed_family: list[int] = field(default_factory=list)
    """Top-level task (its index in arrival order) of each hashed call."""
    subtasks: int = 0

    def visit(self, task: Task, family: int) -> float:
        """Collect the calls of `task` and of its sub-tasks; return its duration (see module doc)."""
        previous = None
        end = 0.0
        ends = []
        for call in task.calls:
            self.inputs.append(call.input_tokens)
            self.outputs.append(call.output_tokens)
            self.appended.append(appended_tokens(call, previous))
            if previous is not None:
                self.gaps.append(call.gap)
            start = call.sent_at if call.sent_at is not None else end + call.gap
            end = start + (call.server_time or 0.0)
            ends.append(end)
            if call.hash_ids and call.block_size:
                self.hashed.append(call.hash_ids)
                self.hashed_bs.append(call.block_size)
                self.hashed_input.append(call.input_tokens)
                self.hashed_family.append(family)
            previous = call
        duration = end
        self.subtasks += len(task.subtasks)
        for sub in task.subtasks:
            spawn = ends[sub.after_call] if 0 <= sub.after_call < len(ends) else 0.0
            duration = max(duration, spawn + self.visit(sub.task, family))
        return duration


def workload_samples(workload: Workload) -> Samples:
    """Gather every quantity of the workload into arrays (one pass over its calls)."""
    tops = sorted(workload.tasks, key=lambda t: t.arrival)
    cols = _Columns()
    per_task_calls: list[int] = []
    durations: list[float] = []
    for family, top in enumerate(tops):
        before = len(cols.inputs)
        durations.append(cols.visit(top, family))
        per_task_calls.append(len(cols.inputs) - before)

    input_arr = np.asarray(cols.inputs, dtype=np.int64)
    reuse = _prefix_reuse(cols.hashed, np.asarray(cols.hashed_bs, dtype=np.int64),
                          np.asarray(cols.hashed_input, dtype=np.int64),
                          np.asarray(cols.hashed_family, dtype=np.int64), int(input_arr.sum()))
    return Samples(
        calls_per_task=np.asarray(per_task_calls, dtype=np.int64),
        input_tokens=input_arr,
        appended_tokens=np.asarray(cols.appended, dtype=np.int64),
        output_tokens=np.asarray(cols.outputs, dtype=np.int64),
        gaps_s=np.asarray(cols.gaps, dtype=np.float64),
        task_duration_s=np.asarray(durations, dtype=np.float64),
        arrivals=np.asarray([t.arrival for t in tops], dtype=np.float64),
        subtasks=cols.subtasks,
        prefix_reuse=reuse,
    )


def workload_stats(workload: Workload) -> WorkloadStats:
    """Counts, distributions, prefix reuse and arrival statistics of a workload (see module doc)."""
    samples = workload_samples(workload)
    return WorkloadStats(
        tasks=int(samples.calls_per_task.size),
        calls=int(samples.input_tokens.size),
        subtasks=samples.subtasks,
        **{name: Distribution.of(getattr(samples, name)) for name in MARGINALS},
        prefix_reuse=samples.prefix_reuse,
        arrivals=arrival_stats(samples.arrivals),
        provenance=[{"source": p.source, "format": p.format, "notes": list(p.notes)} for p in workload.provenance],
    )


def arrival_stats(arrivals: np.ndarray) -> Arrivals:
    """Rate, inter-arrival CV and index of dispersion of sorted arrival times."""
    arrivals = np.sort(np.asarray(arrivals, dtype=np.float64))
    span = float(arrivals[-1] - arrivals[0]) if arrivals.size else 0.0
    rate = cv = None
    if arrivals.size >= 2 and span > 0:
        inter = np.diff(arrivals)
        rate = 1.0 / float(inter.mean())
        cv = float(inter.std() / inter.mean())
    dispersion = {f"{w:g}s": index_of_dispersion(arrivals, w) for w in DISPERSION_WINDOWS}
    return Arrivals(span, rate, cv, dispersion)


def index_of_dispersion(arrivals: np.ndarray, window: float) -> Optional[float]:
    """Variance / mean of arrival counts in complete windows of `window` seconds from the first arrival;
    None with fewer than `MIN_WINDOWS` complete windows or fewer than two arrivals."""
    if arrivals.size < 2:
        return None
    first = float(arrivals.min())
    windows = int(np.floor((float(arrivals.max()) - first) / window))
    if windows < MIN_WINDOWS:
        return None
    index = np.floor((arrivals - first) / window).astype(np.int64)
    counts = np.bincount(index[index < windows], minlength=windows)
    return float(counts.var() / counts.mean())


def _prefix_reuse(
    hashed: list[tuple[int, ...]],
    block_sizes: np.ndarray,
    inputs: np.ndarray,
    families: np.ndarray,
    total_input: int,
) -> PrefixReuse:
    """Within- and across-task prefix reuse of the calls that carry hash ids, vectorised over blocks."""
    hashed_total = int(inputs.sum())
    share = hashed_total / total_input if total_input else 0.0
    if not hashed or hashed_total == 0:
        return PrefixReuse(None, None, share)
    lengths = np.fromiter((len(h) for h in hashed), dtype=np.int64, count=len(hashed))
    ids = _id_array(hashed, int(lengths.sum()))
    call_of = np.repeat(np.arange(len(hashed), dtype=np.int64), lengths)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    position = np.arange(ids.size, dtype=np.int64) - np.repeat(starts, lengths)
    sizes = np.repeat(block_sizes, lengths)
    mixed_sizes = bool((block_sizes != block_sizes[0]).any())

    def served(scope: Optional[np.ndarray]) -> float:
        keys = [ids] + ([sizes] if mixed_sizes else []) + ([scope] if scope is not None else [])
        seen = _seen_in_earlier_call(keys, call_of)
        first_miss = np.minimum.reduceat(np.where(seen, lengths.max(), position), starts)
        blocks = np.minimum(first_miss, lengths)
        return float(np.minimum(blocks * block_sizes, inputs).sum()) / hashed_total

    return PrefixReuse(served(np.repeat(families, lengths)), served(None), share)


def _id_array(hashed: list[tuple[int, ...]], total: int) -> np.ndarray:
    """All hash ids as one integer array; ids beyond 64 bits are replaced by dense codes."""
    try:
        return np.fromiter(itertools.chain.from_iterable(hashed), dtype=np.int64, count=total)
    except OverflowError:
        codes: dict[int, int] = {}
        flat = (codes.setdefault(h, len(codes)) for h in itertools.chain.from_iterable(hashed))
        return np.fromiter(flat, dtype=np.int64, count=total)


def _seen_in_earlier_call(keys: list[np.ndarray], call_of: np.ndarray) -> np.ndarray:
    """For each block, whether an equal key occurred in an earlier call (blocks are in call order)."""
    n = call_of.size
    # Stable sorts, least significant key first, leave equal keys in position order, so each run of
    # equal keys starts at its first use. (Timsort is fast here: ids mostly grow along the calls.)
    order = np.argsort(keys[0], kind="stable")
    for key in keys[1:]:
        order = order[np.argsort(key[order], kind="stable")]
    head = np.zeros(n, dtype=bool)
    head[0] = True
    for key in keys:
        k = key[order]
        head[1:] |= k[1:] != k[:-1]
    run = np.cumsum(head) - 1
    first_call = call_of[order[head]][run]
    seen = np.empty(n, dtype=bool)
    seen[order] = first_call < call_of[order]
    return seen
