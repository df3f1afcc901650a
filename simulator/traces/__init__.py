"""Trace importers: one module per format, chosen from a file's content, all producing a `Workload`.

An importer module defines ``FORMAT`` (its name on the command line), ``sniff(path, head) -> bool``
(does this file look like mine? `head` is the first 64 KiB) and ``read(path, policy) -> Workload``; one
whose tasks may run across files (a recording's rotated files) also defines ``read_files(paths, policy)``,
given all such files of a folder at once.
`load` picks the importer, reads every file of a folder, and merges them into one workload.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from pathlib import Path
from types import ModuleType
from typing import Iterable, Optional

from ..errors import ErrorPolicy, InputError, OnError
from ..gcpause import gc_paused
from ..workload import Provenance, Task, Workload

# Sniffing order: the most specific formats first.
_MODULES = (
    "recording",
    "claude_code",
    "dynamo",
    "bailian",
    "tracelab",
    "tracelab_csv",
    "mooncake",
    "otel",
    "burstgpt",
    "azure",
    "lmcache",
    "native",
)
HEAD_BYTES = 65536


def importers() -> dict[str, ModuleType]:
    """Every importer by format name, in sniffing order."""
    mods = [importlib.import_module(f"{__name__}.{name}") for name in _MODULES]
    return {m.FORMAT: m for m in mods}


def formats() -> list[str]:
    """Format names accepted by `--format`."""
    return list(importers())


def detect(path: Path, format_option: str = "--format") -> ModuleType:
    """The importer whose `sniff` accepts this file; `format_option` is how the user forces a format
    where the path came from (a command's --format, a scenario's workload.format), named when none does."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(HEAD_BYTES)
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", file=str(path)) from None
    if not head.strip():
        raise InputError("empty file", file=str(path))
    for module in importers().values():
        if module.sniff(path, head):
            return module
    raise InputError(
        f"unknown trace format: no importer recognises this file; force one with {format_option} "
        f"(known formats: {', '.join(formats())})", file=str(path)
    )


def _files(path: Path) -> list[Path]:
    try:
        if not path.exists():
            raise InputError("no such file or folder", file=str(path))
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and not _is_side_file(p))
            if not files:
                raise InputError("folder holds no trace files", file=str(path))
            return files
    except OSError as exc:  # a name too long, a folder that cannot be listed, ...
        raise InputError(f"cannot read: {exc.strerror or exc}", file=str(path)) from None
    return [path]


def _is_side_file(path: Path) -> bool:
    """License and readme files that sit beside traces."""
    name = path.name.upper()
    return name.startswith(("LICENSE", "README", "NOTICE", ".")) or path.suffix.lower() in {".md", ".txt"}


def load(
    paths: Iterable[str | Path],
    format: Optional[str] = None,
    on_error: OnError = "raise",
    assume_append_only: bool = False,
    format_option: str = "--format",
) -> Workload:
    """Import files and folders (every file inside, recursively) as one workload, sorted by arrival.

    With `assume_append_only`, (sub-)tasks whose calls carry no hash ids get ids from the agent loop's
    append-only context (`simulator.traces.structure`). `format_option` names where the user sets
    `format` (a command's ``--format``, a scenario's ``workload.format``) in the errors that need it."""
    known = importers()
    if format is not None and format not in known:
        near = difflib.get_close_matches(format, list(known), n=1)
        hint = f"; did you mean `{near[0]}`?" if near else ""
        raise InputError(f"unknown format {format!r} (known: {', '.join(known)}){hint}")
    parts: list[Workload] = []
    given: dict[ModuleType, list[Path]] = {}  # files named one by one, of formats read together
    for root in paths:
        root = Path(root)
        by_format: dict[str, list[Workload]] = {}
        joined: dict[ModuleType, list[Path]] = {}  # files of formats read together (`read_files`)
        skipped: list[str] = []
        for file in _files(root):
            try:
                module = known[format] if format else detect(file, format_option)
            except InputError as exc:
                if not root.is_dir():
                    raise
                # A folder may hold other views of its traces (a pretty-printed copy, notes): a file
                # no importer recognises is skipped and named in the workload's notes.
                skipped.append(f"skipped {file}: {exc.message}")
                continue
            if hasattr(module, "read_files"):
                (joined if root.is_dir() else given).setdefault(module, []).append(file)
                continue
            by_format.setdefault(module.FORMAT, []).append(_read(module, [file], on_error))
        for module, files in joined.items():
            by_format.setdefault(module.FORMAT, []).append(_read(module, files, on_error))
        if not by_format:
            if not root.is_dir():
                continue  # a file read with others of its format (below)
            raise InputError("no file in this folder is a trace of a known format: " + "; ".join(skipped),
                             file=str(root))
        for fmt, found in by_format.items():
            parts.append(_merge(found, Provenance(str(root), fmt, {"on_error": on_error})) if root.is_dir() else found[0])
        if skipped:
            parts[-1] = _with_notes(parts[-1], tuple(skipped))
    for module, files in given.items():
        parts.append(_read(module, files, on_error))
    merged = _merge(parts, None)
    tasks = _unique_ids(merged.tasks)
    if not tasks:
        raise InputError("no tasks found", file=", ".join(str(p) for p in paths))
    workload = Workload(tuple(sorted(tasks, key=lambda t: t.arrival)), merged.provenance)
    if assume_append_only:
        from .structure import assume_append_only as derive  # noqa: PLC0415

        workload, _ = derive(workload)
    return workload


def _read(module: ModuleType, files: list[Path], on_error: OnError) -> Workload:
    """`files` read by `module`: one by one (`read`), or together when it has ``read_files`` (a
    recording's rotated files, whose tasks run across files)."""
    policy = ErrorPolicy(on_error)
    try:
        with gc_paused():
            part = module.read_files(files, policy) if len(files) > 1 else module.read(files[0], policy)
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", file=str(files[0])) from None
    if policy.total_skipped:
        part = _with_notes(part, policy.notes())
    return part


def _with_notes(part: Workload, notes: tuple[str, ...]) -> Workload:
    prov = part.provenance or (Provenance("?", "?"),)
    first = dataclasses.replace(prov[0], notes=prov[0].notes + notes)
    return Workload(part.tasks, (first,) + prov[1:])


def _merge(parts: list[Workload], provenance: Optional[Provenance]) -> Workload:
    """Concatenate workloads; with `provenance`, the parts' notes are folded into that one entry."""
    tasks = tuple(t for p in parts for t in p.tasks)
    if provenance is None:
        return Workload(tasks, tuple(pr for p in parts for pr in p.provenance))
    notes = tuple(n for p in parts for pr in p.provenance for n in pr.notes)
    return Workload(tasks, (dataclasses.replace(provenance, notes=notes),))


def _unique_ids(tasks: tuple[Task, ...]) -> list[Task]:
    """Keep task ids unique across files and within them, sub-tasks' too: a repeated id gets a numeric suffix.
    Records and reports tell tasks apart by id, and a live run seeds a prompt's unshared part by it: two
    tasks under one id would share prompt text that the workload says is their own."""
    seen: dict[str, int] = {}

    def renamed(task: Task) -> Task:
        n = seen.get(task.id, 0)
        seen[task.id] = n + 1
        subs = tuple(dataclasses.replace(s, task=renamed(s.task)) for s in task.subtasks)
        if n == 0 and all(s.task is o.task for s, o in zip(subs, task.subtasks)):
            return task
        return dataclasses.replace(task, id=task.id if n == 0 else f"{task.id}#{n}", subtasks=subs)

    return [renamed(t) for t in tasks]
