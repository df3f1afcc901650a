"""How a run is split over shards: how many, which tasks each gets, and its share of the run's limits.

Tasks are dealt round-robin in order of arrival, whole (a task's sub-agents run in its shard), so each
shard gets an even share of every burst and of every stretch of the run. A shard's own limits
(`run.max_in_flight`, `target.max_connections`) are the run's divided over the shards.
"""

from __future__ import annotations

import math
from typing import Optional, Union

from ..workload import Task, Workload

BURST_PER_SHARD = 128
"""Calls one shard's event loop starts at one instant and still times honestly (TTFT error within
2 ms at p50 with a warm pool and bodies built ahead; see docs/scale-out.md and
benchmarks/burst_timing.py). `workers: auto` gives each shard at most this many simultaneous starts."""
BURST_WINDOW = 0.001
"""Arrivals closer together than this count as one instant."""


def peak_burst(workload: Workload, window: float = BURST_WINDOW) -> int:
    """The most calls that start within `window` seconds of each other at the arrivals of the
    workload's top-level tasks (each with its sub-agents that start with it)."""
    starts = sorted((t.arrival, _starting_width(t)) for t in workload.tasks)
    peak = level = low = 0
    for arrival, width in starts:
        level += width
        while starts[low][0] < arrival - window:
            level -= starts[low][1]
            low += 1
        peak = max(peak, level)
    return peak


def _starting_width(task: Task) -> int:
    """The task's first call and those of sub-agents that start at once with it (``after_call: -1``)."""
    return 1 + sum(_starting_width(sub.task) for sub in task.subtasks if sub.after_call == -1)


def shard_count(workers: Union[int, str, None], workload: Workload, cpus: Optional[float]) -> int:
    """Shards for `workers` (a number, or 'auto'/None: enough that no shard starts more than
    `BURST_PER_SHARD` calls at one instant, at most one per CPU of the cluster); never more than the
    workload has top-level tasks."""
    tasks = len(workload.tasks)
    if isinstance(workers, int):
        return max(1, min(workers, tasks))
    wanted = math.ceil(peak_burst(workload) / BURST_PER_SHARD)
    if cpus is not None:
        wanted = min(wanted, max(1, int(cpus)))
    return max(1, min(wanted, tasks))


def split(workload: Workload, shards: int) -> list[Workload]:
    """The workload's top-level tasks dealt round-robin, by arrival, into `shards` workloads."""
    ordered = sorted(workload.tasks, key=lambda t: t.arrival)
    return [Workload(tuple(ordered[i::shards]), workload.provenance) for i in range(shards)]


def split_limit(limit: Optional[int], shards: int) -> list[Optional[int]]:
    """A run-wide limit divided over `shards` as evenly as whole numbers go (None: no limit). The
    caller keeps `shards` at most `limit`, so no share is zero."""
    if limit is None or limit == 0:
        return [limit] * shards
    base, extra = divmod(limit, shards)
    return [base + (1 if i < extra else 0) for i in range(shards)]
