"""The result folder: records streamed to JSONL as they finish, histograms and summary beside them.

Layout of a result folder::

    run.json         what ran: scenario, target, measurement window, planned counts (written first)
    calls.jsonl      one CallRecord per line, in the order calls ended
    tasks.jsonl      one TaskRecord per line, in the order tasks ended
    histograms.json  {name: encoded HdrHistogram} (the live ITL one rewritten every second)
    progress.json    {"tasks_started": N}: top-level tasks the run had started (rewritten as it goes)
    summary.json     the figures (written at the end, also after an interruption)
    server_metrics.jsonl, server_tasks.jsonl
                     the server's /metrics scrapes and their per-task joins, when it has /metrics

Records are pushed to the operating system at most 100 ms after they finish and at the end, so a
crash, Ctrl-C or SIGTERM keeps what was measured (a summary rebuilt from the records by `report`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import operator
import time
from array import array
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np
import orjson
from hdrh.histogram import HdrHistogram

from ..errors import InputError
from . import histograms
from .records import CallRecord, TaskRecord

RUN_FILE = "run.json"
CALLS_FILE = "calls.jsonl"
TASKS_FILE = "tasks.jsonl"
HISTOGRAMS_FILE = "histograms.json"
SUMMARY_FILE = "summary.json"
PROGRESS_FILE = "progress.json"
ITL_BATCH = 1 << 20
"""Inter-token gaps gathered before they go into the histogram at once."""
FLUSH_INTERVAL = 0.1
"""Most seconds a written record waits before it is pushed to the operating system."""
HISTOGRAMS_INTERVAL = 1.0


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


OMITTED_WHEN_NONE = frozenset({"replica"})
"""Record fields left out of a line while unset, so that a run outside a fleet writes what it wrote
before fleets came (reading back gives them their default, None)."""


_FIELDS: dict[type, tuple[tuple[str, ...], Callable[[Any], tuple[Any, ...]]]] = {}
"""Per record type: its field names and a getter of their values (`dataclasses.fields` walks the
class's fields on each call: too slow once per record)."""


def _fields(kind: type) -> tuple[tuple[str, ...], Callable[[Any], tuple[Any, ...]]]:
    found = _FIELDS.get(kind)
    if found is None:
        names = tuple(f.name for f in dataclasses.fields(kind))
        getter = operator.attrgetter(*names)
        found = _FIELDS[kind] = (names, getter if len(names) > 1 else lambda record: (getter(record),))
    return found


def record_dict(record: Any) -> dict[str, Any]:
    """A record's fields as a JSON-ready dict."""
    names, values_of = _fields(type(record))
    out = dict(zip(names, values_of(record)))
    for name in OMITTED_WHEN_NONE:
        if name in out and out[name] is None:
            del out[name]
    return out


def record_line(record: Any) -> bytes:
    """A record as its line of calls.jsonl or tasks.jsonl (newline included): what every writer of
    record files writes. orjson writes it, but for a record orjson would write otherwise than
    `json.dumps` (a NaN or infinity, which orjson turns into null; records hold only plain values) or
    cannot write (an integer past 64 bits, a lone surrogate): `json.dumps` writes that one, so every
    line reads back as the same values as the `json.dumps` line of the same record."""
    data = record_dict(record)
    if not any(type(v) is float and v - v != 0.0 for v in data.values()):  # v - v: nan for nan and inf
        try:
            return orjson.dumps(data, option=orjson.OPT_APPEND_NEWLINE)
        except orjson.JSONEncodeError:
            pass
    return (json.dumps(data) + "\n").encode("utf-8")


class ResultWriter:
    """Streams records into a result folder and keeps the live ITL histogram and counters; every record
    also goes to each of `sinks` (a `simulator.metrics.tally.RunTally`, ...), which keep the run's
    figures as it goes.

    A record reaches the operating system at most `flush_interval` seconds after it was written (by a
    loop timer when an asyncio loop runs, else at the next record), so a process killed outright loses
    at most that much; histograms.json is rewritten at most every `HISTOGRAMS_INTERVAL` seconds."""

    def __init__(self, folder: Path, window: Window, flush_interval: float = FLUSH_INTERVAL,
                 sinks: Sequence[Any] = ()) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.window = window
        self.flush_interval = flush_interval
        self.sinks = tuple(sinks)
        self._itl = histograms.new_histogram()
        self._itl_pending = array("d")
        """Gaps not yet in `_itl`: recorded in batches (`ITL_BATCH`), a cost per bucket, not per gap."""
        self.counters = LiveCounters()
        self.tasks_started: Optional[int] = None
        """Top-level tasks started so far, when the driver tells (`started`); saved in progress.json."""
        self._calls = open(self.folder / CALLS_FILE, "wb")
        self._tasks = open(self.folder / TASKS_FILE, "wb")
        self._last_flush = self._last_histograms = time.monotonic()
        self._pending = False
        self._progress_saved: Optional[int] = None
        self._closed = False

    def call(self, record: CallRecord, gaps: Sequence[float] = ()) -> None:
        """Store one finished call (an attempt) and the inter-token gaps it saw."""
        self._calls.write(record_line(record))
        c = self.counters
        if record.ok:
            c.calls_ok += 1
            c.output_tokens += record.output_tokens
            if self.window.contains(record.intended_send):
                pending = self._itl_pending
                if type(gaps) is list:
                    pending.fromlist(gaps)  # what the twin gives: faster than extend's item-by-item path
                else:
                    pending.extend(gaps)
                if len(pending) >= ITL_BATCH:
                    self._record_pending()
        else:
            c.calls_failed += 1
            c.errors[record.error_class or "unknown"] += 1
        for sink in self.sinks:
            sink.call(record, gaps)
        self._written()

    @property
    def itl(self) -> HdrHistogram:
        """The inter-token gaps of the calls stored so far (within the window)."""
        if self._itl_pending:
            self._record_pending()
        return self._itl

    def _record_pending(self) -> None:
        histograms.record_many_seconds(self._itl, np.frombuffer(self._itl_pending, dtype=np.float64))
        self._itl_pending = array("d")

    def task(self, record: TaskRecord) -> None:
        """Store one finished task (or sub-task)."""
        self._tasks.write(record_line(record))
        if record.parent_id is None:
            if record.ok:
                self.counters.tasks_done += 1
            else:
                self.counters.tasks_failed += 1
        for sink in self.sinks:
            sink.task(record)
        self._written()

    def started(self, tasks: int) -> None:
        """The driver has started `tasks` top-level tasks so far (saved with the next flush, so that a
        killed run's report tells the tasks it had started from those it had not)."""
        self.tasks_started = tasks
        if tasks != self._progress_saved:
            self._written()

    def _written(self) -> None:
        if self._pending or self._closed:
            return
        self._pending = True
        if time.monotonic() - self._last_flush >= self.flush_interval:
            self.flush()
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (a simulation): the next record flushes once the interval has passed
        loop.call_later(self.flush_interval, self.flush)

    def maybe_flush(self) -> None:
        """Flush when the last flush is `flush_interval` old."""
        if time.monotonic() - self._last_flush >= self.flush_interval:
            self.flush()

    def flush(self) -> None:
        """Push records to disk (and progress.json); rewrite histograms.json when it is a second old."""
        if self._closed:
            return
        self._calls.flush()
        self._tasks.flush()
        self._pending = False
        now = self._last_flush = time.monotonic()
        if self.tasks_started is not None and self.tasks_started != self._progress_saved:
            write_json(self.folder, PROGRESS_FILE, {"tasks_started": self.tasks_started})
            self._progress_saved = self.tasks_started
        if now - self._last_histograms >= HISTOGRAMS_INTERVAL:
            self._save_histograms()

    def _save_histograms(self) -> None:
        histograms.save(self.folder / HISTOGRAMS_FILE, {"itl": self.itl})
        self._last_histograms = time.monotonic()

    def close(self) -> None:
        if not self._closed:
            self.flush()
            self._save_histograms()
            self._calls.close()
            self._tasks.close()
            self._closed = True

    def __enter__(self) -> ResultWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- reading back ---------------------------------------------------------------------------------


def _read_jsonl(path: Path, kind: type) -> Iterator[Any]:
    """The records of a JSONL file, one at a time (a file of any size reads in constant memory)."""
    if not path.exists():
        return
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                try:
                    data = orjson.loads(line)
                except orjson.JSONDecodeError:  # NaN, integers past 64 bits: what only json reads
                    data = json.loads(line)
                yield kind(**data)
            except (json.JSONDecodeError, TypeError) as exc:
                if not line.endswith("\n"):
                    return  # the last line, cut short by a crash
                raise InputError(f"bad record: {exc}", file=str(path), line=number) from None


def iter_calls(folder: Path) -> Iterator[CallRecord]:
    """The call records of a result folder, one at a time."""
    return _read_jsonl(Path(folder) / CALLS_FILE, CallRecord)


def iter_tasks(folder: Path) -> Iterator[TaskRecord]:
    """The task records of a result folder, one at a time."""
    return _read_jsonl(Path(folder) / TASKS_FILE, TaskRecord)


def read_calls(folder: Path) -> list[CallRecord]:
    """Every call record of a result folder (a list: for tests and small runs; `iter_calls` streams)."""
    return list(iter_calls(folder))


def read_tasks(folder: Path) -> list[TaskRecord]:
    """Every task record of a result folder (a list; `iter_tasks` streams)."""
    return list(iter_tasks(folder))


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
