"""What the server saw during a run: its /metrics timeline, and each task's share of it.

Two files of the result folder come from here::

    server_metrics.jsonl  one scrape per line: {"t": seconds since the run's start, name: value, ...}
                          (appended while the run goes, so an interrupted run keeps its samples)
    server_tasks.jsonl    one line per task (sub-agents too): the mean KV-cache usage, waiting and
                          running requests over its lifetime, and its prefix-cache hit share from
                          the calls' ``usage.prompt_tokens_details.cached_tokens``

and the ``server`` section of summary.json: the timeline summary (gauges: mean and max; counters:
increase over the run), the distribution of the per-task values across tasks, and the share of prompt
tokens the server reported as cached. Samples come in as plain values, from a live run's scrapes
(`simulator.live.probes`) or a simulation's twin (`simulator.sim.scrape`); `summarize` builds the
section and server_tasks.jsonl from them the same way for both.
"""

from __future__ import annotations

import bisect
import json
import math
from array import array
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Optional, Protocol, Sequence

import numpy as np

from . import results
from .records import CallRecord, TaskRecord

SERVER_METRICS_FILE = "server_metrics.jsonl"
SERVER_TASKS_FILE = "server_tasks.jsonl"

LOAD_KEYS = ("kv_cache_usage_mean", "waiting_mean", "running_mean")
"""Per-task time-weighted means from the /metrics timeline."""
TASK_KEYS = (*LOAD_KEYS, "cache_hit_share")

# Our name -> the sample names vLLM has used for it (newest first). Label sets (engines, models)
# are summed.
GAUGES: dict[str, tuple[str, ...]] = {
    "num_requests_running": ("vllm:num_requests_running",),
    "num_requests_waiting": ("vllm:num_requests_waiting",),
    "kv_cache_usage_perc": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
}
COUNTERS: dict[str, tuple[str, ...]] = {
    "prefix_cache_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_cache_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    "num_preemptions": ("vllm:num_preemptions_total",),
    "request_success": ("vllm:request_success_total",),
    "prompt_tokens": ("vllm:prompt_tokens_total",),
    "generation_tokens": ("vllm:generation_tokens_total",),
    "prompt_tokens_cached": ("vllm:prompt_tokens_cached_total",),
    "spec_decode_num_drafts": ("vllm:spec_decode_num_drafts_total",),
    "spec_decode_num_draft_tokens": ("vllm:spec_decode_num_draft_tokens_total",),
    "spec_decode_num_accepted_tokens": ("vllm:spec_decode_num_accepted_tokens_total",),
}
GPU_PREFIX = "gpu"
"""Gauges sampled from the GPUs (NVML) are named with this prefix."""
LOAD_GAUGES = {"kv_cache_usage_mean": "kv_cache_usage_perc", "waiting_mean": "num_requests_waiting",
               "running_mean": "num_requests_running"}
"""Each per-task load and the gauge it is the mean of."""


class SampleLike(Protocol):
    """Anything with a sample's time (seconds since the run's start) and values by name."""

    t: float
    values: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class Sample:
    """One scrape: seconds since the run's start and the values found (our names)."""

    t: float
    values: dict[str, float]


def timeline_summary(samples: Sequence[SampleLike], failures: int = 0) -> dict[str, Any]:
    """Gauges: mean and max over samples; counters: increase over the run; prefix-cache hit share."""
    out: dict[str, Any] = {"samples": len(samples), "failed_scrapes": failures}
    gauge_keys = list(GAUGES) + sorted({k for s in samples for k in s.values if k.startswith(GPU_PREFIX)})
    for key in gauge_keys:
        vals = [s.values[key] for s in samples if key in s.values]
        if vals:
            out[key] = {"mean": sum(vals) / len(vals), "max": max(vals)}
    for key in COUNTERS:
        vals = [s.values[key] for s in samples if key in s.values]
        if vals:
            out[f"{key}_delta"] = counter_delta(vals)
    queries = out.get("prefix_cache_queries_delta")
    hits = out.get("prefix_cache_hits_delta")
    out["prefix_cache_hit_share"] = hits / queries if queries and hits is not None else None
    return out


def counter_delta(series: Sequence[float]) -> float:
    """Increase over the run, tolerating a server restart (a counter that falls back toward 0)."""
    total = 0.0
    for prev, cur in zip(series, series[1:]):
        total += cur - prev if cur >= prev else cur
    return total


class TimelineJoin:
    """Each task's time-weighted mean KV-cache usage, waiting and running requests over [arrival, end]
    from the samples (sample and hold; before the first sample its value holds; a task of no length
    gets the value at its instant). Built once; a task then costs a binary search and the samples
    within its lifetime, not a pass over the whole timeline."""

    def __init__(self, samples: Sequence[SampleLike]) -> None:
        self._series: dict[str, tuple[list[float], list[float], list[float]]] = {}
        for load, gauge in LOAD_GAUGES.items():
            points = [(s.t, s.values[gauge]) for s in samples if gauge in s.values]
            if points:
                times, values = [p[0] for p in points], [p[1] for p in points]
                # each whole segment's area, as the sum over a task's lifetime adds it
                areas = [v * (b - a) for v, a, b in zip(values, times, times[1:])]
                self._series[load] = (times, values, areas)

    def loads(self, task: TaskRecord) -> dict[str, Optional[float]]:
        """The task's means by `LOAD_KEYS` (None for a gauge never sampled)."""
        return {key: self._mean(key, task.arrival, task.end) if key in self._series else None for key in LOAD_KEYS}

    def _mean(self, key: str, start: float, end: float) -> float:
        times, values, areas = self._series[key]
        first = max(0, bisect.bisect_right(times, start) - 1)  # the segment holding `start`
        if end <= start:
            return values[first]
        last = max(first, bisect.bisect_left(times, end) - 1)  # the segment holding `end`
        # the first segment, cut at start (and at end when it holds both)
        seg_end = times[first + 1] if first + 1 < len(times) else math.inf
        hi = seg_end if seg_end < end else end
        area = values[first] * (hi - start) if hi > start else 0.0
        if last > first:
            for whole in islice(areas, first + 1, last):  # added in order, as segment by segment
                area += whole
            area += values[last] * (end - times[last])
        return area / (end - start)


class SampleLog:
    """Appends scrapes to server_metrics.jsonl (or `name` in `folder`: a fleet replica's file) as they
    come: `sync(samples)` writes the new ones."""

    def __init__(self, folder: Path, name: str = SERVER_METRICS_FILE) -> None:
        self.path = Path(folder) / name
        self._fh = open(self.path, "w", encoding="utf-8")
        self.written = 0

    def sync(self, samples: Sequence[SampleLike]) -> None:
        """Write the samples not written yet (`samples` only ever grows) and flush."""
        if self._fh.closed:
            return
        for sample in samples[self.written:]:
            self._fh.write(json.dumps({"t": sample.t, **sample.values}) + "\n")
        if len(samples) > self.written:
            self._fh.flush()
            self.written = len(samples)

    def add(self, t: float, values: Mapping[str, float]) -> None:
        """Write one sample (seconds since the run's start, values by name), unflushed: for a writer
        that has all its samples in turn, such as a simulation's twin."""
        self._fh.write(json.dumps({"t": t, **values}) + "\n")
        self.written += 1

    def close(self) -> None:
        self._fh.close()


def read_samples(folder: Path) -> list[dict[str, float]]:
    """The scrapes of a result folder (empty when there are none)."""
    path = Path(folder) / SERVER_METRICS_FILE
    if not path.exists():
        return []
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def read_task_rows(folder: Path) -> list[dict[str, Any]]:
    """The per-task rows of a result folder (empty when there are none)."""
    path = Path(folder) / SERVER_TASKS_FILE
    if not path.exists():
        return []
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


class ServerTally:
    """What the summary's ``server`` section needs from the call records, kept as they come: the usage
    totals of the successful calls, and each task's cached and prompt tokens: a pair while the task
    runs, then (fed its task record) sixteen bytes in the order the tasks ended, which is
    tasks.jsonl's order (`ended`)."""

    def __init__(self) -> None:
        self.calls_ok = 0
        self.calls_reporting = 0
        self.cached_tokens = 0
        self.prompt_tokens = 0
        self.per_task: dict[str, list[int]] = {}
        """Cached and prompt tokens of the tasks that have not ended (all of them, fed no task record)."""
        self._ended = array("q")
        """Cached and prompt tokens of each ended task in turn (-1, -1: no call reported cached tokens)."""

    def call(self, c: CallRecord, gaps: Sequence[float] = ()) -> None:
        """Count one call record."""
        if not c.ok:
            return
        self.calls_ok += 1
        if c.cached_tokens is not None:
            self.calls_reporting += 1
            self.cached_tokens += c.cached_tokens
            self.prompt_tokens += c.input_tokens
            totals = self.per_task.setdefault(c.task_id, [0, 0])
            totals[0] += c.cached_tokens
            totals[1] += c.input_tokens

    def task(self, t: TaskRecord) -> None:
        """A task ended: its totals move from `per_task` to the compact list of ended tasks."""
        totals = self.per_task.pop(t.task_id, None)
        self._ended.extend(totals if totals is not None else (-1, -1))

    def feed(self, calls: Iterable[CallRecord]) -> "ServerTally":
        for c in calls:
            self.call(c)
        return self

    def cached(self, task_id: str) -> Optional[tuple[int, int]]:
        """(cached, prompt tokens) of a task not fed its record; None when none of its calls reported."""
        totals = self.per_task.get(task_id)
        return None if totals is None else (totals[0], totals[1])

    def ended(self) -> Iterator[Optional[tuple[int, int]]]:
        """(cached, prompt tokens) or None of each task fed its record, in turn."""
        data = self._ended
        for i in range(0, len(data), 2):
            yield None if data[i] < 0 else (data[i], data[i + 1])

    def usage(self) -> dict[str, Any]:
        """The ``usage_cached_tokens`` part of the section."""
        prompt = self.prompt_tokens
        return {
            "calls_reporting": self.calls_reporting,
            "calls_ok": self.calls_ok,
            "cached_tokens": self.cached_tokens,
            "prompt_tokens": prompt,
            "hit_share": self.cached_tokens / prompt if prompt else None,
        }


def task_row(t: TaskRecord, cached: Optional[tuple[int, int]],
             load: Optional[Mapping[str, Optional[float]]] = None) -> dict[str, Any]:
    """One task's row: its identity, its mean server load (`load`, keys `LOAD_KEYS`; None without a
    /metrics timeline) and the cached share of its successful calls' prompt tokens (`cached`: their
    cached and prompt tokens; None when the server reported no cached_tokens for them)."""
    load = load or {}
    hit, total = cached if cached is not None else (0, 0)
    return {
        "task_id": t.task_id,
        "parent_id": t.parent_id,
        "task_class": t.task_class,
        "arrival": t.arrival,
        "end": t.end,
        "ok": t.ok,
        **{key: load.get(key) for key in LOAD_KEYS},
        "cached_tokens": hit if cached is not None else None,
        "prompt_tokens": total if cached is not None else None,
        "cache_hit_share": hit / total if total else None,
    }


def task_rows(
    tasks: Iterable[TaskRecord],
    calls: Iterable[CallRecord],
    loads: Optional[Mapping[str, Mapping[str, Optional[float]]]] = None,
) -> list[dict[str, Any]]:
    """One row per task (`task_row`), `loads[task_id]` its server load."""
    tally = ServerTally().feed(calls)
    return [task_row(t, tally.cached(t.task_id), (loads or {}).get(t.task_id)) for t in tasks]


def write_task_rows(folder: Path, rows: Iterable[Mapping[str, Any]]) -> dict[str, array]:
    """Write server_tasks.jsonl, one row at a time; returns the rows' values of each of `TASK_KEYS`
    that are not None (what `distribution` needs: eight bytes per task rather than a row)."""
    values = {key: array("d") for key in TASK_KEYS}
    path = Path(folder) / SERVER_TASKS_FILE
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
            for key in TASK_KEYS:
                if row.get(key) is not None:
                    values[key].append(row[key])
    return values


def distribution(values: Iterable[Optional[float]]) -> Optional[dict[str, float]]:
    """count, mean, p50, p90, max of the values that are not None; None when there are none."""
    if isinstance(values, array):  # from `write_task_rows`: no None in it
        data = np.frombuffer(values, dtype=float)
    else:
        data = np.array([v for v in values if v is not None], dtype=float)
    if data.size == 0:
        return None
    p50, p90 = np.percentile(data, [50, 90])
    return {"count": int(data.size), "mean": float(data.mean()), "p50": float(p50), "p90": float(p90),
            "max": float(data.max())}


def server_section(
    rows: Sequence[Mapping[str, Any]],
    calls: Iterable[CallRecord],
    timeline: Optional[Mapping[str, Any]] = None,
    *,
    interval_s: Optional[float] = None,
    note: Optional[str] = None,
) -> dict[str, Any]:
    """The ``server`` section of summary.json from lists of rows and call records (`section` is the
    same from a `ServerTally` and the rows' values)."""
    values = {key: [row[key] for row in rows if row.get(key) is not None] for key in TASK_KEYS}
    return section(ServerTally().feed(calls), values, len(rows), timeline, interval_s=interval_s, note=note)


def section(
    tally: ServerTally,
    values: Mapping[str, Sequence[float]],
    tasks: int,
    timeline: Optional[Mapping[str, Any]] = None,
    *,
    interval_s: Optional[float] = None,
    note: Optional[str] = None,
) -> dict[str, Any]:
    """The ``server`` section of summary.json: `values` are the per-task rows' values by key (as
    `write_task_rows` returns them) of `tasks` rows. `timeline` is the /metrics summary (gauges
    ``{name: {"mean", "max"}}``, counters ``name_delta``, ``prefix_cache_hit_share``), None when nothing
    was scraped; `note` says why."""
    out: dict[str, Any] = {
        "scraped": timeline is not None,
        "interval_s": interval_s,
        "timeline": dict(timeline) if timeline is not None else None,
        "usage_cached_tokens": tally.usage(),
        "per_task": {key: distribution(values.get(key, ())) for key in TASK_KEYS},
        "tasks": tasks,
        "files": [name for name, present in ((SERVER_METRICS_FILE, timeline is not None), (SERVER_TASKS_FILE, bool(tasks))) if present],
    }
    if note:
        out["note"] = note
    return out


def summarize(folder: Path, tally: ServerTally, samples: Optional[Sequence[SampleLike]],
              timeline: Optional[Mapping[str, Any]] = None, *, interval_s: Optional[float] = None,
              note: Optional[str] = None) -> dict[str, Any]:
    """Join the samples with the task records of `folder` (read back one at a time, in the order `tally`
    was fed them), write server_tasks.jsonl, return the ``server`` section. `samples` None: nothing was
    scraped; `timeline` replaces `timeline_summary(samples)` where the caller adds to it."""
    join = TimelineJoin(samples) if samples is not None else None
    if samples is not None and timeline is None:
        timeline = timeline_summary(samples)
    counted = 0

    def rows() -> Iterator[dict[str, Any]]:
        nonlocal counted
        for task, cached in zip(results.iter_tasks(folder), tally.ended()):
            counted += 1
            yield task_row(task, cached, join.loads(task) if join is not None else None)

    values = write_task_rows(folder, rows())
    return section(tally, values, counted, timeline, interval_s=interval_s if samples is not None else None, note=note)
