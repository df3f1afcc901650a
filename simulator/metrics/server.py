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
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Protocol, Sequence

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


def task_rows(
    tasks: Iterable[TaskRecord],
    calls: Iterable[CallRecord],
    loads: Optional[Mapping[str, Mapping[str, Optional[float]]]] = None,
) -> list[dict[str, Any]]:
    """One row per task: its identity, its mean server load (`loads[task_id]`, keys `LOAD_KEYS`; None
    without a /metrics timeline) and the cached share of its successful calls' prompt tokens (None when
    the server reported no cached_tokens for them)."""
    cached: dict[str, list[int]] = {}
    for c in calls:
        if c.ok and c.cached_tokens is not None:
            totals = cached.setdefault(c.task_id, [0, 0])
            totals[0] += c.cached_tokens
            totals[1] += c.input_tokens
    rows = []
    for t in tasks:
        load = (loads or {}).get(t.task_id, {})
        hit, total = cached.get(t.task_id, (0, 0))
        rows.append({
            "task_id": t.task_id,
            "parent_id": t.parent_id,
            "task_class": t.task_class,
            "arrival": t.arrival,
            "end": t.end,
            "ok": t.ok,
            **{key: load.get(key) for key in LOAD_KEYS},
            "cached_tokens": hit if t.task_id in cached else None,
            "prompt_tokens": total if t.task_id in cached else None,
            "cache_hit_share": hit / total if total else None,
        })
    return rows


def write_task_rows(folder: Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    """Write server_tasks.jsonl."""
    path = Path(folder) / SERVER_TASKS_FILE
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    return path


def distribution(values: Iterable[Optional[float]]) -> Optional[dict[str, float]]:
    """count, mean, p50, p90, max of the values that are not None; None when there are none."""
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
    """The ``server`` section of summary.json.

    `timeline` is the /metrics summary (gauges ``{name: {"mean", "max"}}``, counters ``name_delta``,
    ``prefix_cache_hit_share``), None when nothing was scraped; `note` says why."""
    ok = [c for c in calls if c.ok]
    reporting = [c for c in ok if c.cached_tokens is not None]
    prompt = sum(c.input_tokens for c in reporting)
    section: dict[str, Any] = {
        "scraped": timeline is not None,
        "interval_s": interval_s,
        "timeline": dict(timeline) if timeline is not None else None,
        "usage_cached_tokens": {
            "calls_reporting": len(reporting),
            "calls_ok": len(ok),
            "cached_tokens": sum(c.cached_tokens for c in reporting),
            "prompt_tokens": prompt,
            "hit_share": sum(c.cached_tokens for c in reporting) / prompt if prompt else None,
        },
        "per_task": {key: distribution(row.get(key) for row in rows) for key in TASK_KEYS},
        "tasks": len(rows),
        "files": [name for name, present in ((SERVER_METRICS_FILE, timeline is not None), (SERVER_TASKS_FILE, bool(rows))) if present],
    }
    if note:
        section["note"] = note
    return section
