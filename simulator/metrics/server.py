"""What the server saw during a run: its /metrics timeline, and each task's share of it.

Two files of the result folder come from here::

    server_metrics.jsonl  one scrape per line: {"t": seconds since the run's start, name: value, ...}
                          (appended while the run goes, so an interrupted run keeps its samples)
    server_tasks.jsonl    one line per task (sub-agents too): the mean KV-cache usage, waiting and
                          running requests over its lifetime, and its prefix-cache hit share from
                          the calls' ``usage.prompt_tokens_details.cached_tokens``

and the ``server`` section of summary.json: the timeline summary (gauges: mean and max; counters:
increase over the run), the distribution of the per-task values across tasks, and the share of prompt
tokens the server reported as cached. Samples and per-task loads come in as plain values (the
scraping itself lives in `simulator.live.probes`).
"""

from __future__ import annotations

import json
from array import array
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Optional, Protocol, Sequence

import numpy as np

from .records import CallRecord, TaskRecord

SERVER_METRICS_FILE = "server_metrics.jsonl"
SERVER_TASKS_FILE = "server_tasks.jsonl"

LOAD_KEYS = ("kv_cache_usage_mean", "waiting_mean", "running_mean")
"""Per-task time-weighted means from the /metrics timeline."""
TASK_KEYS = (*LOAD_KEYS, "cache_hit_share")


class SampleLike(Protocol):
    t: float
    values: Mapping[str, float]


class SampleLog:
    """Appends scrapes to server_metrics.jsonl as they come: `sync(samples)` writes the new ones."""

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / SERVER_METRICS_FILE
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
