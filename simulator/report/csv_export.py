"""CSV files of a report (``--csv DIR``): for a result folder, its calls, tasks, summary and /metrics
scrapes; for several, the compared figures; for a study, its configs and points. Records are streamed
from the result folder, so a run of any size exports in constant memory. Values are written as they
are, strings included (a spreadsheet that evaluates formulas should import the files as text)."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from ..metrics import results
from ..metrics import server as server_metrics
from ..metrics.fleet import ReplicaFigures
from ..metrics.records import CallRecord, TaskRecord
from ..metrics.summary import Summary
from .compare import compare_many, letters
from .folder_data import Scrapes
from ..study.model import Study
from . import study_space
from .study_holdout import CSV_COLUMNS as HOLDOUT_COLUMNS
from .study_holdout import csv_rows as holdout_rows

CALL_EXTRA = ("latency", "client_lag", "tpot")
TASK_EXTRA = ("completion_time",)


def _write(path: Path, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def _records(records: Iterable[Any], fields: Sequence[str], extra: Sequence[str]) -> Iterator[list[Any]]:
    for record in records:
        yield [getattr(record, name) for name in fields] + [getattr(record, name) for name in extra]


def flatten(data: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    """(dotted path, value) of every leaf of nested mappings and lists."""
    if isinstance(data, Mapping):
        for key, value in data.items():
            yield from flatten(value, (*prefix, str(key)))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from flatten(value, (*prefix, str(i)))
    else:
        yield ".".join(prefix), data


TASK_COUNTS = ("judged", "completed", "failed", "cancelled", "interrupted", "not_started",
               "throughput_per_hour", "goodput_per_hour")
"""The columns of task_counts.csv: the summary's fields of `TaskFigures` (and of each class's)."""


def task_counts(summary: Summary) -> Iterator[list[Any]]:
    """Rows of task_counts.csv: 'all', then each class, with how its judged tasks ended and its rates,
    as the summary holds them (empty where it holds nothing: a class has no 'interrupted')."""
    tasks = summary.to_dict().get("tasks") or {}
    yield ["all", *(tasks.get(key) for key in TASK_COUNTS)]
    for name, entry in (tasks.get("by_class") or {}).items():
        yield [name, *(entry.get(key) for key in TASK_COUNTS)]


def write_run(folder: Path, out: Path) -> list[Path]:
    """calls.csv, tasks.csv (the records), summary.csv (path, value), task_counts.csv (how the judged
    tasks ended, overall and per class), with scrapes server_metrics.csv, and for a fleet replicas.csv
    (summary.json's per-replica figures, one row per replica)."""
    from ..metrics.summary import load_summary

    out = Path(out)
    summary = load_summary(folder)
    call_fields = [f.name for f in dataclasses.fields(CallRecord)]
    task_fields = [f.name for f in dataclasses.fields(TaskRecord)]
    written = [
        _write(out / "calls.csv", [*call_fields, *CALL_EXTRA], _records(results.iter_calls(folder), call_fields, CALL_EXTRA)),
        _write(out / "tasks.csv", [*task_fields, *TASK_EXTRA], _records(results.iter_tasks(folder), task_fields, TASK_EXTRA)),
        _write(out / "summary.csv", ["field", "value"], flatten(summary.to_dict())),
        _write(out / "task_counts.csv", ["class", *TASK_COUNTS], task_counts(summary)),
    ]
    scrapes = Scrapes.read(Path(folder) / server_metrics.SERVER_METRICS_FILE)
    if scrapes:
        keys = list(scrapes.values)
        columns = [scrapes.t, *(scrapes.values[k] for k in keys)]
        rows = ([None if v != v else v for v in row] for row in zip(*(c.tolist() for c in columns)))  # NaN: empty
        written.append(_write(out / "server_metrics.csv", ["t", *keys], rows))
    if summary.fleet is not None:
        fields = list(ReplicaFigures.model_fields)
        written.append(_write(out / "replicas.csv", fields,
                              ([getattr(r, f) for f in fields] for r in summary.fleet.replicas)))
    return written


def write_comparison(summaries: Sequence[Summary], labels: Sequence[str], out: Path) -> list[Path]:
    """comparison.csv: each compared figure, every folder's value and the ratios to the first; where a
    folder is a simulation with a band, each folder's band (low, high) and whether each other folder's
    figure is within the band of the first's (`compare.within_band`)."""
    names = letters(len(labels))
    compared = compare_many(summaries)
    banded = any(b is not None for r in compared for b in r["bands"])
    header = ["section", "figure", "field", *(f"{n}: {label}" for n, label in zip(names, labels)),
              *(f"{n}/{names[0]}" for n in names[1:])]
    if banded:
        header += [*(f"{n} band {end}" for n in names for end in ("low", "high")),
                   *(f"{n} within band of {names[0]}" for n in names[1:])]

    def row(r: Mapping[str, Any]) -> list[Any]:
        cells = [r["section"], r["figure"], ".".join(r["path"]), *r["values"], *r["ratios"][1:]]
        if banded:
            cells += [None if b is None else b[end] for b in r["bands"] for end in ("low", "high")]
            cells += r["within_band"][1:]
        return cells

    return [_write(Path(out) / "comparison.csv", header, (row(r) for r in compared))]


def write_study(study: Study, out: Path) -> list[Path]:
    """study_configs.csv (one row per config, its figures flattened, points apart), study_points.csv,
    with a held-out capacity check study_holdout.csv (one row per config and share checked), and with a
    config space study_space.csv (one row per candidate)."""
    configs = [dict(flatten({k: v for k, v in c.model_dump(mode="json").items() if k not in ("points", "sweep")}))
               for c in study.configs]
    keys = list(dict.fromkeys(k for row in configs for k in row))
    points = [{"config": c.name, **dict(flatten(p.model_dump(mode="json")))} for c in study.configs for p in c.points]
    point_keys = list(dict.fromkeys(k for row in points for k in row))
    written = [_write(Path(out) / "study_configs.csv", keys, ([row.get(k) for k in keys] for row in configs)),
               _write(Path(out) / "study_points.csv", point_keys, ([row.get(k) for k in point_keys] for row in points))]
    if any(c.holdout is not None for c in study.configs):
        written.append(_write(Path(out) / "study_holdout.csv", HOLDOUT_COLUMNS, holdout_rows(study)))
    if study.space is not None:
        written.append(_write(Path(out) / "study_space.csv", study_space.csv_columns(study.space),
                              study_space.csv_rows(study.space)))
    return written
