"""Recordings made by `agentload record` (``--format recording``): JSONL of recorded calls, one file or
the rotated files of one recording (`simulator.recorder.journal` defines the lines).

Calls are grouped by their ``task`` and ordered by ``i``; a (sub-)task's first call that names a
``parent`` makes it a sub-task of that (sub-)task, started after the parent's call ``after_call``. Times
come from the recorder's clock: a top-level task arrives at its first call's ``t``; a call's ``gap`` is
its ``t`` minus the end of what it waited for (the previous call of its task, and the sub-tasks that had
ended before it was sent, which the parent is then taken to have waited for: ``wait``); a sub-task's
first gap counts from the end of the parent's call it follows; ``server_time`` is ``end - t`` as the
recorder saw it (network to the server included). A ``revise`` line moves a sub-task under another parent
(or makes it a top-level task): the last one naming a task wins. Failed calls (with ``status``) are left out and
counted in the notes, as is a last line cut short (a recorder killed while writing it, or a file read
while it grows). The files of one recording (same ``started_unix``) are read as one: a folder of
rotated files gives whole tasks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import orjson

from ..errors import ErrorPolicy, InputError
from ..hash_ids import ID_LIMIT, HashIds
from ..workload import DEFAULT_CLASS, MAX_DEPTH, MAX_SECONDS, MAX_TOKENS, Call, Provenance, SubTask, Task, Workload

FORMAT = "recording"
VERSION = 1
SUBAGENT_CLASS = "subagent"
"""The task class of recorded sub-tasks (the generator's name for sub-agents)."""
_WAIT_SLACK = 1e-3
"""Seconds by which a parent's next call may precede a sub-task's end and still count as waiting for it
(the two ends are stamped on one clock but a few statements apart)."""


def sniff(path: Path, head: bytes) -> bool:
    """True when the first line is a recording header."""
    return head.lstrip().startswith(b'{"agentload_recording"')


def read(path: Path, policy: ErrorPolicy) -> Workload:
    """One recording file (see `read_files` for several)."""
    return read_files([path], policy)


@dataclass
class _Line:
    task: str
    i: int
    t: float
    end: float
    input_tokens: int
    output_tokens: int
    ids: Sequence[int]
    parent: Optional[str]
    after_call: Optional[int]
    stop: Optional[str]
    model: Optional[str]


@dataclass
class _Chain:
    lines: list[_Line] = field(default_factory=list)
    children: list[str] = field(default_factory=list)
    revised: Optional[tuple[Optional[str], Optional[int]]] = None
    """(parent, after_call) from the last revision line naming this (sub-)task, if any."""

    def parent(self) -> tuple[Optional[str], Optional[int]]:
        """Under which (sub-)task and after which of its calls this one started (None: top-level)."""
        if self.revised is not None:
            return self.revised
        return self.lines[0].parent, self.lines[0].after_call


def read_files(paths: Sequence[Path], policy: ErrorPolicy) -> Workload:
    """The files of one or more recordings as one workload (files of one recording are joined)."""
    files = [_read_file(Path(path), policy) for path in paths]
    recordings: dict[float, dict[str, _Chain]] = {}
    block_sizes: dict[float, int] = {}
    revised = 0
    ordered = sorted(files, key=lambda f: (f.start, f.segment))
    for file in ordered:
        block_sizes[file.start] = file.block_size
        into = recordings.setdefault(file.start, {})
        for name, chain in file.chains.items():
            into.setdefault(name, _Chain()).lines.extend(chain.lines)
    for file in ordered:  # later revisions win
        for task, parent, after in file.revisions:
            chain = recordings[file.start].get(task)
            if chain is not None:
                chain.revised = (parent, after)
                revised += 1
    failed = sum(f.failed for f in files)
    cut = sum(f.cut for f in files)
    notes: list[str] = []
    if revised:
        notes.append(f"{revised} sub-task placement(s) corrected by the recorder after later calls showed where they belong")
    if failed:
        notes.append(f"left out {failed} failed call(s) (HTTP errors, broken streams): a replay sends the calls that succeeded")
    if cut:
        notes.append(f"left out {cut} last line(s) cut short (a recorder killed while writing, or a file still growing)")
    first = min(recordings) if recordings else 0.0
    tasks: list[Task] = []
    for n, (start, chains) in enumerate(sorted(recordings.items())):
        prefix = f"r{n}:" if len(recordings) > 1 else ""
        tasks += _tasks(chains, start - first, prefix, block_sizes[start], notes)
    name = str(paths[0]) if len(paths) == 1 else str(Path(paths[0]).parent)
    return Workload(tuple(tasks), (Provenance(name, FORMAT, {"on_error": policy.on_error}, tuple(notes)),))


@dataclass
class _File:
    """What one file of a recording holds."""

    start: float
    segment: int
    block_size: int
    chains: dict[str, _Chain]
    revisions: list[tuple[str, Optional[str], Optional[int]]]
    failed: int
    cut: int


def _read_file(path: Path, policy: ErrorPolicy) -> _File:
    name = str(path)
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    cut = 0
    if lines and lines[-1].strip():
        # No newline after the last line: the recorder writes each line whole, with its newline, so this
        # one was being written (or the file was cut); read it if it is whole JSON, else leave it out.
        try:
            orjson.loads(lines[-1])
        except orjson.JSONDecodeError:
            lines.pop()
            cut = 1
    header = _header(lines[0] if lines else b"", name)
    chains: dict[str, _Chain] = {}
    last_ids: dict[str, Sequence[int]] = {}
    revisions: list[tuple[str, Optional[str], Optional[int]]] = []
    failed = 0
    for number, text in enumerate(lines[1:], start=2):
        if not text.strip():
            continue
        try:
            obj = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            policy.bad(InputError(f"not JSON: {exc}", file=name, line=number))
            continue
        try:
            if isinstance(obj, dict) and "revise" in obj:
                revisions.append(_revision(obj, name, number))
                continue
            line = _call(obj, name, number, last_ids)
        except InputError as exc:
            policy.bad(exc)
            continue
        if line is None:
            failed += 1
            continue
        chains.setdefault(line.task, _Chain()).lines.append(line)
    return _File(header["started_unix"], header["segment"], header["block_size"], chains, revisions, failed, cut)


def _revision(obj: dict[str, Any], name: str, number: int) -> tuple[str, Optional[str], Optional[int]]:
    """A revision line: (task, new parent or None, after_call)."""
    task, parent, after = obj.get("revise"), obj.get("parent"), obj.get("after_call")
    if not isinstance(task, str) or not task:
        raise InputError("expected a task id (a non-empty string)", file=name, line=number, field="revise")
    if parent is None:
        return task, None, None
    if not isinstance(parent, str) or not parent or parent == task:
        raise InputError("expected the id of another task, or null", file=name, line=number, field="parent")
    if type(after) is not int or after < -1:
        raise InputError("expected the parent's call index (-1: at its start)", file=name, line=number,
                         field="after_call")
    return task, parent, after


def _header(text: bytes, name: str) -> dict[str, Any]:
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError:
        obj = None
    if not isinstance(obj, dict) or "agentload_recording" not in obj:
        raise InputError("the first line is not a recording header ({\"agentload_recording\": 1, ...})",
                         file=name, line=1)
    if obj["agentload_recording"] != VERSION:
        raise InputError(f"recording version {obj['agentload_recording']!r}: this agentload reads version {VERSION}",
                         file=name, line=1, field="agentload_recording")
    size = obj.get("block_size")
    if type(size) is not int or not 0 < size <= MAX_TOKENS:
        raise InputError("expected a positive whole number of tokens", file=name, line=1, field="block_size")
    start = obj.get("started_unix", 0.0)
    if type(start) not in (int, float) or not math.isfinite(start) or abs(start) > MAX_SECONDS * 10:
        raise InputError("expected a number of seconds", file=name, line=1, field="started_unix")
    segment = obj.get("segment", 0)
    if type(segment) is not int or segment < 0:
        raise InputError("expected a whole number from 0", file=name, line=1, field="segment")
    return {"block_size": size, "started_unix": float(start), "segment": segment}


def _call(obj: Any, name: str, number: int, last_ids: dict[str, Sequence[int]]) -> Optional[_Line]:
    """One call line, or None for a failed call; InputError naming the field when it is malformed."""
    def bad(message: str, key: str) -> InputError:
        return InputError(message, file=name, line=number, field=key)

    if not isinstance(obj, dict):
        raise InputError("expected a JSON object", file=name, line=number)
    task = obj.get("task")
    if not isinstance(task, str) or not task:
        raise bad("expected a task id (a non-empty string)", "task")
    index = obj.get("i")
    if type(index) is not int or index < 0:
        raise bad("expected a call index (a whole number from 0)", "i")
    times = []
    for key in ("t", "end"):
        value = obj.get(key)
        if type(value) not in (int, float) or not math.isfinite(value) or not 0 <= value <= MAX_SECONDS:
            raise bad(f"expected seconds from the recording's start (0 to {MAX_SECONDS:g})", key)
        times.append(float(value))
    if times[1] < times[0]:
        raise bad("ends before it starts (end < t)", "end")
    if "status" in obj:
        return None  # a failed call: no ids, and the next call's hash_keep counts from the call before it
    counts = []
    for key in ("input_tokens", "output_tokens"):
        value = obj.get(key, 0)
        if type(value) is not int or not 0 <= value <= MAX_TOKENS:
            raise bad(f"expected a whole number of tokens from 0 to {MAX_TOKENS:,}", key)
        counts.append(value)
    keep = obj.get("hash_keep", 0)
    prev = last_ids.get(task, ())
    if type(keep) is not int or keep < 0:
        raise bad("expected a whole number of ids kept", "hash_keep")
    if keep > len(prev):
        raise bad(f"keeps {keep} ids but the previous call of task {task!r} has {len(prev)}", "hash_keep")
    new = obj.get("hash_ids", [])
    if type(new) is not list or not all(type(h) is int and 0 <= h < ID_LIMIT for h in new):
        raise bad("expected a list of integer block ids in [0, 2**63)", "hash_ids")
    ids: Sequence[int] = tuple(prev[:keep]) + tuple(new) if keep else tuple(new)
    last_ids[task] = ids
    parent = obj.get("parent")
    after = obj.get("after_call")
    if parent is not None:
        if not isinstance(parent, str) or not parent or parent == task:
            raise bad("expected the id of another task", "parent")
        if type(after) is not int or after < -1:
            raise bad("expected the parent's call index (-1: at its start)", "after_call")
    optional: dict[str, Any] = {}
    for key in ("stop_reason", "model"):
        value = obj.get(key)
        if value is not None and not isinstance(value, str):
            raise bad("expected a string", key)
        optional[key] = value
    return _Line(task, index, times[0], times[1], counts[0], counts[1], ids, parent,
                 after if parent is not None else None, optional["stop_reason"], optional["model"])


def _tasks(chains: dict[str, _Chain], offset: float, prefix: str, block_size: int, notes: list[str]) -> list[Task]:
    """The top-level tasks of one recording's chains, sub-tasks nested, on a clock shifted by `offset`."""
    for chain in chains.values():
        chain.lines.sort(key=lambda line: line.i)
    roots: list[str] = []
    orphans = 0
    for name, chain in chains.items():
        parent = chain.parent()[0]
        if parent is not None and parent in chains and 0 < _depth(chains, name) <= MAX_DEPTH:
            chains[parent].children.append(name)
        else:
            orphans += parent is not None
            roots.append(name)
    if orphans:
        notes.append(f"{orphans} sub-task(s) whose parent is not in the files read (or that nest deeper than "
                     f"{MAX_DEPTH}, or in a loop) became top-level tasks")
    ends: dict[str, float] = {}
    tasks = []
    for name in roots:
        task = _build(chains, name, prefix, block_size, ends, start=None)
        first = chains[name].lines[0].t
        tasks.append(_with_arrival(task, first + offset))
    return tasks


def _depth(chains: dict[str, _Chain], name: str) -> int:
    """How many parents up `name`'s top-level task is; 0 when its parent links loop (a hand-edited file) or
    run deeper than `MAX_DEPTH`."""
    depth, seen, parent = 0, {name}, chains[name].parent()[0]
    while parent is not None and parent in chains:
        if parent in seen or depth > MAX_DEPTH:
            return 0
        seen.add(parent)
        depth += 1
        parent = chains[parent].parent()[0]
    return depth


def _end(chains: dict[str, _Chain], name: str, ends: dict[str, float]) -> float:
    """When a (sub-)task ended: its last call's end, or a later end of a sub-task it waited for."""
    if name not in ends:
        chain = chains[name]
        ends[name] = max([chain.lines[-1].end] + [_end(chains, child, ends) for child in chain.children])
    return ends[name]


def _build(chains: dict[str, _Chain], name: str, prefix: str, block_size: int, ends: dict[str, float],
           start: Optional[float]) -> Task:
    chain = chains[name]
    lines = chain.lines
    # Sub-tasks by the kept call they follow (a failed parent call: the kept call before it).
    spawned: dict[int, list[tuple[str, bool]]] = {}
    for child in chain.children:
        spawned_after = chains[child].parent()[1]
        after = -1
        for k, line in enumerate(lines):
            if line.i <= (spawned_after if spawned_after is not None else -1):
                after = k
        nxt = lines[after + 1] if after + 1 < len(lines) else None
        wait = nxt is None or nxt.t + _WAIT_SLACK >= _end(chains, child, ends)
        spawned.setdefault(after, []).append((child, wait))
    task_start = lines[0].t if start is None else start
    calls = []
    ready = task_start
    for k, line in enumerate(lines):
        if k:
            ready = lines[k - 1].end
            for child, wait in spawned.get(k - 1, ()):
                if wait:
                    ready = max(ready, _end(chains, child, ends))
        elif -1 in spawned:
            ready = max([task_start] + [_end(chains, c, ends) for c, w in spawned[-1] if w])
        gap = max(0.0, line.t - ready) if (k or start is not None) else 0.0
        ids = HashIds.of(line.ids) if line.ids else ()
        calls.append(Call(line.input_tokens, line.output_tokens, round(gap, 6), ids, block_size if ids else 0,
                          round(line.end - line.t, 6), round(line.t - task_start, 6), line.stop, line.model))
    subtasks = []
    for after, children in sorted(spawned.items()):
        sub_start = lines[after].end if after >= 0 else task_start
        for child, wait in children:
            subtasks.append(SubTask(after, _build(chains, child, prefix, block_size, ends, sub_start), wait))
    return Task(prefix + name, tuple(calls), 0.0, DEFAULT_CLASS if start is None else SUBAGENT_CLASS, tuple(subtasks))


def _with_arrival(task: Task, arrival: float) -> Task:
    return Task(task.id, task.calls, max(0.0, arrival), task.task_class, task.subtasks)
