"""The native trace format: versioned JSONL, a header line then one task per line.

Line 1: ``{"agentload_trace": 1, "provenance": [...]}``. Every other line is one `Task` as its
fields are named in `simulator.workload`, with default values left out, and one wire-only field:
a call after the first of a (sub-)task may carry ``"hash_keep": K``, meaning that its hash ids
start with the previous call's first K ids and ``hash_ids`` lists only the ids after those (agent
prompts grow turn by turn, so writing whole chains would repeat thousands of ids per call). The
reader gives such a call a `HashIds` view sharing the previous call's ids (`simulator.hash_ids`): a
task's ids are held once, whatever its number of calls, and `read(write(w)) == w`. The JSON Schema of a task line
is the schema classes' own plus that field (`task_json_schema`), documented in docs/trace-format.md.

Calls that carry ``messages`` but no ``hash_ids`` (a hand-made or exported file with content) get hash
ids derived from the messages when read (`content_ids`, `simulator.traces.content`), noted in the
provenance; a file agentload wrote has them already, so reading it again changes nothing.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import IO, Any, Iterable, Optional

import orjson
from pydantic import TypeAdapter, ValidationError

from ..errors import ErrorPolicy, InputError
from ..hash_ids import BadHashId, common_prefix, json_default, share_calls
from ..workload import MAX_DEPTH, Call, Provenance, SubTask, Task, Workload
from .content import ContentHasher

FORMAT = "native"
VERSION = 1
HEADER_KEY = "agentload_trace"
KEEP_KEY = "hash_keep"

_TASK = TypeAdapter(Task)
_PROVENANCE = TypeAdapter(list[Provenance])
_KEEP_BYTES = b'"' + KEEP_KEY.encode() + b'"'
_MESSAGES_BYTES = b'"messages"'
DUMP_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS  # of every line written (plus a newline)


def _defaults(cls: type) -> tuple[tuple[str, Any], ...]:
    """(field name, default) of a dataclass in field order; a required field's default equals nothing."""
    out = []
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = _REQUIRED
        out.append((f.name, default))
    return tuple(out)


class _Required:
    """Stands for "no default": unequal to every value, so a required field is always written."""

    def __eq__(self, other: object) -> bool:
        return False

    def __ne__(self, other: object) -> bool:
        return True

    __hash__ = None  # type: ignore[assignment]


_REQUIRED = _Required()
_CALL_FIELDS = _defaults(Call)
_SUBTASK_FIELDS = _defaults(SubTask)
_TASK_FIELDS = _defaults(Task)


def sniff(path: Path, head: bytes) -> bool:
    """True when the file starts with the native header."""
    return head.lstrip().startswith(b'{"' + HEADER_KEY.encode())


def add_hash_keep(schema: dict[str, Any]) -> dict[str, Any]:
    """Turn the schema of the `Task` class into the schema of a task line on the wire: the call
    object gains the optional `hash_keep` property (just before `hash_ids`, whose description says
    that it then lists only the ids after the kept ones). Changes and returns `schema`."""
    call = schema["$defs"]["Call"]
    props: dict[str, Any] = {}
    for name, prop in call["properties"].items():
        if name == "hash_ids":
            props[KEEP_KEY] = {
                "type": "integer",
                "minimum": 0,
                "title": "Hash Keep",
                "description": (
                    "Wire only: this call's hash ids start with the previous call's first `hash_keep` ids "
                    "(previous call of the same task or sub-task, same block_size), and `hash_ids` lists only "
                    "the ids after them. Not allowed on a task's first call; absent means 0."
                ),
            }
            prop = dict(prop, description=prop.get("description", "") + (
                " On the wire, only the ids after the first `hash_keep` when that is given."))
        props[name] = prop
    call["properties"] = props
    return schema


def task_json_schema() -> dict[str, Any]:
    """JSON Schema of one task line (as written: with `hash_keep`)."""
    return add_hash_keep(_TASK.json_schema())


def _describe(error: ValidationError) -> tuple[str, str, str]:
    """(JSON path, field, message) of the first problem pydantic found."""
    first = error.errors()[0]
    loc = [str(p) for p in first["loc"] if not str(p).startswith("function-")]
    path = "$" + "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in loc)
    field = next((p for p in reversed(loc) if not p.isdigit()), "")
    return path, field, first["msg"]


class _WireError(Exception):
    """A problem with `hash_keep` or `hash_ids`, found before validation: (JSON path, field, message)."""


def _share(task: Any, path: str) -> None:
    """Turn every call's `hash_ids` list of a decoded task line (and its sub-tasks) into a `HashIds` view,
    a `hash_keep` call's sharing the previous call's chain: a task's ids are stored once, not once a call.
    A line with a call that is not an object, or ids that are not a list, is left to validation to report.
    (Runs once per call of a million-call file: the loop does as little as it can.)"""
    if type(task) is not dict:
        return
    calls = task.get("calls")
    if type(calls) is list and calls:
        keeps: list[int] = []
        lists: list[list] = []
        prev_bs: Any = 0
        for i, call in enumerate(calls):
            if type(call) is not dict:
                break
            ids = call.get("hash_ids", _NO_IDS)
            if type(ids) is not list:
                break
            bs = call.get("block_size", 0)
            keep = call.pop(KEEP_KEY, None)
            if keep is None:
                keep = 0
            elif type(keep) is not int or keep < 0 or not i or (keep and bs != prev_bs) or keep > keeps[-1] + len(lists[-1]):
                _bad_keep(keep, i, bs, prev_bs, keeps, lists, f"{path}.calls[{i}].{KEEP_KEY}")
            keeps.append(keep)
            lists.append(ids)
            prev_bs = bs
        else:
            try:
                views = share_calls(keeps, lists)
            except BadHashId as exc:
                call_index, position = exc.index if isinstance(exc.index, tuple) else (0, None)
                where = f"{path}.calls[{call_index}].hash_ids" + (f"[{position}]" if position is not None else "")
                raise _WireError(where, "hash_ids", str(exc)) from None
            for call, view in zip(calls, views):
                call["hash_ids"] = view
    subtasks = task.get("subtasks")
    if type(subtasks) is list:
        for j, sub in enumerate(subtasks):
            if type(sub) is dict:
                _share(sub.get("task"), f"{path}.subtasks[{j}].task")


_NO_IDS: list = []


def _bad_keep(keep: Any, i: int, bs: Any, prev_bs: Any, keeps: list[int], lists: list[list], at: str) -> None:
    """Raise the `_WireError` of a `hash_keep` that `_share` found wrong."""
    if type(keep) is not int or keep < 0:
        raise _WireError(at, KEEP_KEY, f"must be an integer >= 0, not {keep!r:.40}")
    if not i:
        raise _WireError(at, KEEP_KEY, "not allowed on a task's first call (there is no previous call)")
    if keep and bs != prev_bs:
        raise _WireError(at, KEEP_KEY, f"the previous call's block_size is {prev_bs!r:.40}, this call's {bs!r:.40}")
    raise _WireError(at, KEEP_KEY, f"keeps {keep} ids but the previous call has only {keeps[-1] + len(lists[-1])}")


def _check_structure(task: Task, path: str, depth: int) -> None:
    """What the schema cannot say: each sub-task starts after a call its parent has, and sub-tasks nest at
    most `MAX_DEPTH` deep (raises _WireError)."""
    if depth >= MAX_DEPTH:
        raise _WireError(f"{path}.subtasks", "subtasks", f"sub-tasks nested more than {MAX_DEPTH} deep")
    for j, sub in enumerate(task.subtasks):
        if sub.after_call >= len(task.calls):
            raise _WireError(f"{path}.subtasks[{j}].after_call", "after_call",
                             f"the task has {len(task.calls)} calls: no call {sub.after_call} to start after")
        _check_structure(sub.task, f"{path}.subtasks[{j}].task", depth + 1)


def _parse_task(raw: bytes) -> Task:
    """One task line -> `Task` (raises ValidationError, _WireError or orjson.JSONDecodeError). Lines with
    messages go through orjson too, so a number in a message reads the same whichever path (orjson reads
    an integer beyond 64 bits as a float, pydantic's parser as an int) and a file reads back as written."""
    if _KEEP_BYTES not in raw and _MESSAGES_BYTES not in raw:
        return _TASK.validate_json(raw)
    data = orjson.loads(raw)
    _share(data, "$")
    return _TASK.validate_python(data)


def read(path: Path, policy: ErrorPolicy) -> Workload:
    """Read a native JSONL file."""
    name = str(path)
    tasks: list[Task] = []
    provenance: tuple[Provenance, ...] = ()
    content = False  # a line mentions messages: maybe calls to give ids from content
    with open(path, "rb") as fh:
        header_line = fh.readline()
        try:
            header = orjson.loads(header_line)
        except orjson.JSONDecodeError as exc:
            raise InputError(f"not JSON: {exc}", file=name, line=1) from None
        if not isinstance(header, dict) or HEADER_KEY not in header:
            raise InputError("missing the native header", file=name, line=1, field=HEADER_KEY)
        if header[HEADER_KEY] != VERSION:
            raise InputError(
                f"unsupported version {header[HEADER_KEY]!r} (this agentload reads {VERSION})",
                file=name, line=1, field=HEADER_KEY,
            )
        try:
            provenance = tuple(_PROVENANCE.validate_python(header.get("provenance", [])))
        except ValidationError as exc:
            where, field, msg = _describe(exc)
            raise InputError(msg, file=name, line=1, path="$.provenance" + where[1:], field=field) from None
        for number, raw in enumerate(fh, start=2):
            if not raw.strip():
                continue
            content = content or _MESSAGES_BYTES in raw
            try:
                task = _parse_task(raw)
                _check_structure(task, "$", 0)
                tasks.append(task)
            except ValidationError as exc:
                where, field, msg = _describe(exc)
                policy.bad(InputError(msg, file=name, line=number, path=where, field=field))
            except _WireError as exc:
                where, field, msg = exc.args
                policy.bad(InputError(msg, file=name, line=number, path=where, field=field))
            except orjson.JSONDecodeError as exc:
                policy.bad(InputError(f"not JSON: {exc}", file=name, line=number))
    if content:
        tasks, notes = content_ids(tasks)
        if notes:
            first = provenance[0] if provenance else Provenance(name, FORMAT)
            provenance = (dataclasses.replace(first, notes=first.notes + tuple(notes)),) + provenance[1:]
    return Workload(tuple(tasks), provenance)


def content_ids(tasks: list[Task]) -> tuple[list[Task], list[str]]:
    """Tasks whose calls carry `messages` but no hash ids get ids derived from the messages
    (`simulator.traces.content`), laid out in arrival order, each task's calls before its sub-tasks';
    calls with hash ids keep them. Returns the tasks and the notes to record."""
    ordered = sorted(range(len(tasks)), key=lambda i: tasks[i].arrival)
    wanted: list[tuple[Any, int]] = []

    def gather(task: Task) -> None:
        wanted.extend((c.messages, c.input_tokens) for c in task.calls if c.messages and not c.hash_ids)
        for sub in task.subtasks:
            gather(sub.task)

    for i in ordered:
        gather(tasks[i])
    if not wanted:
        return tasks, []
    hasher = ContentHasher()
    hasher.calibrate(wanted)

    def rebuild(task: Task) -> Task:
        calls = []
        for call in task.calls:
            if call.messages and not call.hash_ids:
                ids = hasher.hash_ids(call.messages, call.input_tokens)
                call = dataclasses.replace(call, hash_ids=ids, block_size=hasher.block_size if ids else 0)
            calls.append(call)
        subtasks = tuple(dataclasses.replace(s, task=rebuild(s.task)) for s in task.subtasks)
        return dataclasses.replace(task, calls=tuple(calls), subtasks=subtasks)

    out = list(tasks)
    for i in ordered:
        out[i] = rebuild(tasks[i])
    return out, hasher.notes("calls with messages and no hash ids")


def _call_record(call: Call, prev: Optional[Call]) -> dict[str, Any]:
    rec: dict[str, Any] = {}
    ids = call.hash_ids
    keep = 0
    if prev is not None and ids and prev.hash_ids and prev.block_size == call.block_size:
        keep = common_prefix(ids, prev.hash_ids)
    for name, default in _CALL_FIELDS:
        value = getattr(call, name)
        if name == "hash_ids" and keep:
            rec[KEEP_KEY] = keep
            value = ids[keep:]
        if value != default:
            rec[name] = value
    return rec


def task_record(task: Task) -> dict[str, Any]:
    """A task as the dict its line holds (defaults left out, `hash_keep` used wherever it applies)."""
    rec: dict[str, Any] = {}
    for name, default in _TASK_FIELDS:
        value = getattr(task, name)
        if name == "calls":
            prev = None
            calls = []
            for call in value:
                calls.append(_call_record(call, prev))
                prev = call
            value = calls
        elif name == "subtasks":
            value = [_subtask_record(sub) for sub in value]
            if not value:
                continue
        if value != default:
            rec[name] = value
    return rec


def _subtask_record(sub: SubTask) -> dict[str, Any]:
    rec: dict[str, Any] = {}
    for name, default in _SUBTASK_FIELDS:
        value = getattr(sub, name)
        if name == "task":
            value = task_record(value)
        if value != default:
            rec[name] = value
    return rec


def dump_line(record: dict[str, Any]) -> bytes:
    """One line of a native file (with its newline) from a header or task record."""
    try:
        return orjson.dumps(record, default=json_default, option=DUMP_OPTIONS | orjson.OPT_APPEND_NEWLINE)
    except orjson.JSONEncodeError:  # e.g. an integer beyond 64 bits, which orjson refuses
        return json.dumps(record, separators=(",", ":"), ensure_ascii=False, default=json_default).encode() + b"\n"


def header_line(provenance: Iterable[Provenance]) -> bytes:
    """The header line (with its newline)."""
    return dump_line({HEADER_KEY: VERSION, "provenance": _PROVENANCE.dump_python(list(provenance), mode="json")})


def write(workload: Workload, out: IO[bytes] | Path | str) -> None:
    """Write a workload as native JSONL (to a path or a binary stream)."""
    if isinstance(out, (str, Path)):
        with open(out, "wb") as fh:
            write(workload, fh)
        return
    out.write(header_line(workload.provenance))
    for task in workload.tasks:
        out.write(dump_line(task_record(task)))
