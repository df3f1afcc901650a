"""Everything a report reads from one result folder: run.json, the summary, the histograms, the call
and task records (streamed once into columns of numbers: a report of a million calls holds arrays, not
records) and the server's /metrics scrapes. Each part may be missing: a hand-written or older
summary.json alone still makes a report, with the figures that need the rest left out."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import numpy as np
import orjson
from hdrh.histogram import HdrHistogram

from ..errors import InputError
from ..redact import mask_url
from ..metrics import histograms, results
from ..metrics import server as server_metrics
from ..metrics.records import CallRecord, TaskRecord
from ..metrics.results import Window
from ..metrics.summary import Summary, load_summary, rebuild


@dataclass
class CallColumns:
    """The calls of a run (every attempt), column by column."""

    send: np.ndarray
    """Actual send, seconds since the run's start."""
    intended: np.ndarray
    end: np.ndarray
    ok: np.ndarray
    output_tokens: np.ndarray
    failed_class: list[str]
    """The error class of each failed attempt, in the order of `end[~ok]`."""
    first_failure: dict[str, CallRecord]
    """The first failed attempt of each error class."""
    statuses: dict[str, set[int]]
    """The HTTP statuses seen per error class."""
    replica: Optional[np.ndarray] = None
    """The fleet replica each call's response named (None where none did); None for a run no call of
    which named one."""

    def __len__(self) -> int:
        return int(self.end.size)

    @classmethod
    def read(cls, records: Iterable[CallRecord]) -> CallColumns:
        """The columns of these records."""
        builder = _CallBuilder()
        for c in records:
            builder.add(c.actual_send, c.intended_send, c.end, c.output_tokens, c if not c.ok else None, c.replica)
        return builder.columns()

    @classmethod
    def read_folder(cls, folder: Path) -> CallColumns:
        """The calls of a result folder. Successful calls, nearly all of a run, go straight from their
        JSON into the columns (a third of the time of building each record); a failed one is built as a
        `CallRecord`. Any line that does not read cleanly sends the whole file through
        `results.iter_calls`, which names a bad record or skips a last line cut short by a crash."""
        path = Path(folder) / results.CALLS_FILE
        builder = _CallBuilder()
        if not path.exists():
            return builder.columns()
        try:
            with open(path, "rb") as fh:
                for line in fh:
                    row = orjson.loads(line)
                    if not line.endswith(b"\n"):
                        raise ValueError("a last line cut short")
                    builder.add(float(row["actual_send"]), float(row["intended_send"]), float(row["end"]),
                                int(row["output_tokens"]), None if row["ok"] is True else CallRecord(**row),
                                row.get("replica"))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, OverflowError):
            return cls.read(results.iter_calls(folder))
        return builder.columns()


class _CallBuilder:
    """Collects calls into compact arrays, then makes the `CallColumns`."""

    def __init__(self) -> None:
        self.send, self.intended, self.end = array("d"), array("d"), array("d")
        self.tokens, self.ok = array("q"), array("b")
        self.failed: list[str] = []
        self.first: dict[str, CallRecord] = {}
        self.statuses: dict[str, set[int]] = {}
        self.replicas: list[Optional[str]] = []
        self.named = False

    def add(self, send: float, intended: float, end: float, tokens: int, failure: Optional[CallRecord],
            replica: Optional[str] = None) -> None:
        """One call; `failure` is the call's record when it failed, None when it succeeded; `replica` the
        fleet replica that answered it, when known."""
        self.replicas.append(replica)
        self.named = self.named or replica is not None
        self.send.append(send)
        self.intended.append(intended)
        self.end.append(end)
        self.tokens.append(tokens)
        self.ok.append(failure is None)
        if failure is not None:
            name = failure.error_class or "unknown"
            self.failed.append(name)
            self.first.setdefault(name, failure)
            if failure.status is not None:
                self.statuses.setdefault(name, set()).add(failure.status)

    def columns(self) -> CallColumns:
        """The calls added so far, as `CallColumns`."""
        return CallColumns(np.array(self.send, dtype=np.float64), np.array(self.intended, dtype=np.float64),
                           np.array(self.end, dtype=np.float64), np.array(self.ok, dtype=bool),
                           np.array(self.tokens, dtype=np.int64), self.failed, self.first, self.statuses,
                           np.array(self.replicas, dtype=object) if self.named else None)


@dataclass
class TaskColumns:
    """The tasks of a run (sub-agents too), column by column."""

    top: np.ndarray
    """True for a top-level task, False for a sub-agent."""
    arrival: np.ndarray
    end: np.ndarray
    ok: np.ndarray
    task_class: np.ndarray
    in_calls: np.ndarray
    in_ttft: np.ndarray
    in_gaps: np.ndarray
    client_lag: np.ndarray

    def __len__(self) -> int:
        return int(self.end.size)

    @classmethod
    def read(cls, records: Iterable[TaskRecord]) -> TaskColumns:
        """The columns of these records."""
        cols = {name: array("d") for name in ("arrival", "end", "in_calls", "in_ttft", "in_gaps", "client_lag")}
        top, ok = array("b"), array("b")
        classes: dict[str, int] = {}
        class_index = array("l")
        for t in records:
            top.append(t.parent_id is None)
            ok.append(t.ok)
            class_index.append(classes.setdefault(t.task_class, len(classes)))
            for name, value in (("arrival", t.arrival), ("end", t.end), ("in_calls", t.time_in_calls),
                                ("in_ttft", t.time_in_ttft), ("in_gaps", t.time_in_gaps),
                                ("client_lag", t.client_lag)):
                cols[name].append(value)
        names = np.array(list(classes) or [""], dtype=object)
        return cls(np.frombuffer(top, dtype=np.int8).astype(bool), *(np.frombuffer(cols[n]) for n in ("arrival", "end")),
                   np.frombuffer(ok, dtype=np.int8).astype(bool), names[np.frombuffer(class_index, dtype=np.int_)],
                   *(np.frombuffer(cols[n]) for n in ("in_calls", "in_ttft", "in_gaps", "client_lag")))


@dataclass
class Scrapes:
    """The server's /metrics scrapes (server_metrics.jsonl), column by column: NaN where a scrape
    lacks a metric."""

    t: np.ndarray
    values: dict[str, np.ndarray]

    def __len__(self) -> int:
        return int(self.t.size)

    def __bool__(self) -> bool:
        return self.t.size > 0

    @classmethod
    def read(cls, path: Path) -> Scrapes:
        """The scrapes of a server_metrics.jsonl (none when the file is missing); a bad line is an
        `InputError` naming it. Read with orjson: a live run of hours holds a scrape a second."""
        rows: list[dict[str, Any]] = []
        if path.exists():
            with open(path, "rb") as fh:
                for number, line in enumerate(fh, 1):
                    if not line.strip():
                        continue
                    try:
                        row = orjson.loads(line)
                        float(row["t"])
                    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                        if not line.endswith(b"\n"):
                            break  # the last line, cut short by a crash
                        raise InputError(f"bad /metrics scrape: {exc}", file=str(path), line=number) from None
                    rows.append(row)
        columns: dict[str, list[float]] = {}
        nan = float("nan")
        for i, row in enumerate(rows):
            for key, value in row.items():
                if key == "t":
                    continue
                if key not in columns:
                    columns[key] = [nan] * i
                columns[key].append(nan if value is None else value)
            for values in columns.values():
                if len(values) <= i:
                    values.append(nan)
        return cls(np.array([float(row["t"]) for row in rows], dtype=np.float64),
                   {key: np.array(values, dtype=np.float64) for key, values in sorted(columns.items())})


@dataclass
class RunData:
    """One result folder as a report reads it."""

    folder: Path
    label: str
    info: dict[str, Any]
    """run.json (empty when the folder has none)."""
    summary: Summary
    histograms: dict[str, HdrHistogram] = field(default_factory=dict)
    calls: CallColumns = field(default_factory=lambda: CallColumns.read(()))
    tasks: TaskColumns = field(default_factory=lambda: TaskColumns.read(()))
    samples: Scrapes = field(default_factory=lambda: Scrapes(np.empty(0), {}))
    """The /metrics scrapes of server_metrics.jsonl."""

    @cached_property
    def summary_json(self) -> dict[str, Any]:
        """The summary as summary.json holds it (the keys a page's cells point into)."""
        return self.summary.to_dict()

    @property
    def window(self) -> Window:
        """The measurement window (from run.json, else the summary's)."""
        win = self.info.get("window")
        if isinstance(win, dict):
            return Window(float(win.get("start") or 0.0), win.get("end"))
        return self.summary.window

    @property
    def scenario(self) -> str:
        """The scenario's name (the folder's when nothing says it)."""
        return self.summary.scenario or str(self.info.get("scenario") or self.folder.name)

    def target(self) -> str:
        """What served the run (`served_by`)."""
        return served_by(self.info, self.summary)


def served_by(info: dict[str, Any], summary: Summary) -> str:
    """What served a run, from its run.json (`info`) and summary: the twin of a profile, the built-in
    emulator with the timing it ran, or a server's URL ("" when nothing says); for a fleet, its replicas
    and router policy first."""
    fleet = summary.fleet
    if fleet is not None:
        kind = (info.get("fleet") or {}).get("kind")
        what = f"{len(fleet.replicas)} {kind + ' ' if kind and kind != 'twin' else ''}replicas behind " \
               f"{'the router model' if info.get('simulated') else 'sglang-router'} ({fleet.policy or '?'})"
        rest = served_by(info, summary.model_copy(update={"fleet": None}))
        return f"a fleet of {what}: {rest}" if rest else f"a fleet of {what}"
    if info.get("simulated") or summary.simulation is not None:
        profile = info.get("profile") or (summary.simulation.profile if summary.simulation else "")
        return f"simulated on the twin of {profile}" if profile else "simulated on the twin"
    if info.get("emulator"):
        timing = info.get("emulator_timing")
        text = timing.get("text") if isinstance(timing, dict) else None
        return f"built-in emulator, {text}" if text else "built-in emulator"
    url = info.get("base_url")
    return f"live against {mask_url(str(url))}" if url else ""  # run.json of an older version kept credentials


def load_folder(folder: Path, label: Optional[str] = None) -> RunData:
    """Read a result folder for a report; raises `InputError` when it is no result folder."""
    folder = Path(folder)
    info = results.read_json(folder, results.RUN_FILE) or {}
    hist: dict[str, HdrHistogram] = {}
    path = folder / results.HISTOGRAMS_FILE
    try:
        if not (folder / results.SUMMARY_FILE).exists() and folder.is_dir():
            # a run that never wrote its summary (killed): its histograms.json holds the live ITL only,
            # so the summary and every histogram are rebuilt from its records
            summary, hist = rebuild(folder)
        else:
            summary = load_summary(folder)
            if path.exists():
                hist = histograms.load(path)
    except (ValueError, TypeError) as exc:
        raise InputError(f"bad histograms: {exc}", file=str(path)) from None
    samples = Scrapes.read(folder / server_metrics.SERVER_METRICS_FILE)
    return RunData(folder=folder, label=label or folder.name, info=info, summary=summary, histograms=hist,
                   calls=CallColumns.read_folder(folder),
                   tasks=TaskColumns.read(results.iter_tasks(folder)), samples=samples)


def folder_labels(folders: Sequence[Path]) -> list[str]:
    """Short names that tell the folders apart: the folder name, with its parents while two clash."""
    paths = [Path(f).resolve() for f in folders]
    depth = 1
    while True:
        names = ["/".join(p.parts[-depth:]) for p in paths]
        if len(set(names)) == len(names) or depth >= max(len(p.parts) for p in paths):
            return names
        depth += 1


def load_folders(folders: Sequence[Path]) -> list[RunData]:
    """Several result folders, labelled so that they can be told apart."""
    return [load_folder(Path(f), label) for f, label in zip(folders, folder_labels(folders))]
