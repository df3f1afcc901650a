"""The result folder: records streamed to JSONL as they finish, histograms and summary beside them.

Layout of a result folder::

    run.json         what ran: scenario, target, measurement window, planned counts (written first)
    calls.jsonl      one CallRecord per line, in the order calls ended
    tasks.jsonl      one TaskRecord per line, in the order tasks ended
    histograms.json  {name: encoded HdrHistogram} (rewritten on every flush)
    summary.json     the figures (written at the end, also after an interruption)
    server_metrics.jsonl, server_tasks.jsonl
                     the server's /metrics scrapes and their per-task joins, when it has /metrics

Files are flushed about every second and at the end, so a crash or Ctrl-C keeps what was measured.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from ..errors import InputError
from . import histograms
from .records import CallRecord, TaskRecord

RUN_FILE = "run.json"
CALLS_FILE = "calls.jsonl"
TASKS_FILE = "tasks.jsonl"
HISTOGRAMS_FILE = "histograms.json"
SUMMARY_FILE = "summary.json"


@dataclass(frozen=True)
class Window:
    """The measurement window, in seconds since the run's start: items whose intended arrival (tasks)
    or intended send (calls) falls outside it are recorded but left out of the figures."""

    start: float = 0.0
    end: Optional[float] = None
    """None: open-ended."""

    def contains(self, t: float) -> bool:
        return t >= self.start and (self.end is None or t <= self.end)


@dataclass
class LiveCounters:
    """Running totals for the progress display."""

    tasks_done: int = 0
    tasks_failed: int = 0
    calls_ok: int = 0
    calls_failed: int = 0
    output_tokens: int = 0
    errors: Counter = field(default_factory=Counter)


def record_dict(record: Any) -> dict[str, Any]:
    """A record's fields as a JSON-ready dict."""
    return {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}


class ResultWriter:
    """Streams records into a result folder and keeps the live ITL histogram and counters."""

    def __init__(self, folder: Path, window: Window, flush_interval: float = 1.0) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.window = window
        self.flush_interval = flush_interval
        self.itl = histograms.new_histogram()
        self.counters = LiveCounters()
        self._calls = open(self.folder / CALLS_FILE, "w", encoding="utf-8")
        self._tasks = open(self.folder / TASKS_FILE, "w", encoding="utf-8")
        self._last_flush = time.monotonic()
        self._closed = False

    def write_run_info(self, info: dict[str, Any]) -> None:
        """Write run.json (what ran, before anything is measured)."""
        (self.folder / RUN_FILE).write_text(json.dumps(info, indent=1, default=str))

    def call(self, record: CallRecord, gaps: Sequence[float] = ()) -> None:
        """Store one finished call (an attempt) and the inter-token gaps it saw."""
        self._calls.write(json.dumps(record_dict(record)) + "\n")
        c = self.counters
        if record.ok:
            c.calls_ok += 1
            c.output_tokens += record.output_tokens
            if self.window.contains(record.intended_send):
                for gap in gaps:
                    histograms.record_seconds(self.itl, gap)
        else:
            c.calls_failed += 1
            c.errors[record.error_class or "unknown"] += 1
        self.maybe_flush()

    def task(self, record: TaskRecord) -> None:
        """Store one finished task (or sub-task)."""
        self._tasks.write(json.dumps(record_dict(record)) + "\n")
        if record.parent_id is None:
            if record.ok:
                self.counters.tasks_done += 1
            else:
                self.counters.tasks_failed += 1
        self.maybe_flush()

    def maybe_flush(self) -> None:
        if time.monotonic() - self._last_flush >= self.flush_interval:
            self.flush()

    def flush(self) -> None:
        """Push records to disk and rewrite histograms.json."""
        if self._closed:
            return
        self._calls.flush()
        self._tasks.flush()
        histograms.save(self.folder / HISTOGRAMS_FILE, {"itl": self.itl})
        self._last_flush = time.monotonic()

    def close(self) -> None:
        if not self._closed:
            self.flush()
            self._calls.close()
            self._tasks.close()
            self._closed = True

    def __enter__(self) -> ResultWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- reading back ---------------------------------------------------------------------------------


def _read_jsonl(path: Path, kind: type) -> Iterator[Any]:
    if not path.exists():
        return
    with open(path, encoding="utf-8") as fh:
        lines = fh.readlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield kind(**json.loads(line))
        except (json.JSONDecodeError, TypeError) as exc:
            if number == len(lines) and not line.endswith("\n"):
                return  # a line cut short by a crash
            raise InputError(f"bad record: {exc}", file=str(path), line=number) from None


def read_calls(folder: Path) -> list[CallRecord]:
    """Every call record of a result folder."""
    return list(_read_jsonl(Path(folder) / CALLS_FILE, CallRecord))


def read_tasks(folder: Path) -> list[TaskRecord]:
    """Every task record of a result folder."""
    return list(_read_jsonl(Path(folder) / TASKS_FILE, TaskRecord))


def read_json(folder: Path, name: str) -> Optional[dict[str, Any]]:
    """A JSON file of the result folder, or None when it is missing."""
    path = Path(folder) / name
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise InputError(f"bad JSON: {exc}", file=str(path)) from None


def write_json(folder: Path, name: str, data: dict[str, Any]) -> None:
    """Write a JSON file of the result folder atomically."""
    path = Path(folder) / name
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(path)
