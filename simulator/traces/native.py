"""The native trace format: versioned JSONL, a header line then one task per line.

Line 1: ``{"agentload_trace": 1, "provenance": [...]}``. Every other line is one `Task` as its
fields are named in `simulator.workload`, with default values left out, and one wire-only field:
a call after the first of a (sub-)task may carry ``"hash_keep": K``, meaning that its hash ids
start with the previous call's first K ids and ``hash_ids`` lists only the ids after those (agent
prompts grow turn by turn, so writing whole chains would repeat thousands of ids per call). The
reader expands it back to whole tuples, so `read(write(w)) == w`. The JSON Schema of a task line
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
from ..workload import Call, Provenance, SubTask, Task, Workload
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
    """A problem with `hash_keep`, found before validation: (JSON path, field, message)."""


_UNUSABLE = object()  # the previous call's ids are not a list: validation reports that call


def _expand(task: Any, path: str) -> None:
    """Replace every `hash_keep` of a decoded task line (and its sub-tasks) by the ids it stands for."""
    if not isinstance(task, dict):
        return
    calls = task.get("calls")
    if isinstance(calls, list):
        prev: Any = None
        prev_bs: Any = 0
        for i, call in enumerate(calls):
            if not isinstance(call, dict):
                prev = _UNUSABLE
                continue
            ids = call.get("hash_ids", [])
            bs = call.get("block_size", 0)
            if KEEP_KEY in call:
                keep = call.pop(KEEP_KEY)
                at = f"{path}.calls[{i}].{KEEP_KEY}"
                if type(keep) is not int or keep < 0:
                    raise _WireError(at, KEEP_KEY, f"must be an integer >= 0, not {keep!r}")
                if prev is None:
                    raise _WireError(at, KEEP_KEY, "not allowed on a task's first call (there is no previous call)")
                if prev is not _UNUSABLE and isinstance(ids, list):
                    if keep > len(prev):
                        raise _WireError(at, KEEP_KEY, f"keeps {keep} ids but the previous call has only {len(prev)}")
                    if keep and bs != prev_bs:
                        raise _WireError(at, KEEP_KEY, f"the previous call's block_size is {prev_bs!r}, this call's {bs!r}")
                    ids = prev[:keep] + ids
                    call["hash_ids"] = ids
            prev = ids if isinstance(ids, list) else _UNUSABLE
            prev_bs = bs
    subtasks = task.get("subtasks")
    if isinstance(subtasks, list):
        for j, sub in enumerate(subtasks):
            if isinstance(sub, dict):
                _expand(sub.get("task"), f"{path}.subtasks[{j}].task")


def _parse_task(raw: bytes) -> Task:
    """One task line -> `Task` (raises ValidationError, _WireError or orjson.JSONDecodeError)."""
    if _KEEP_BYTES not in raw:
        return _TASK.validate_json(raw)
    data = orjson.loads(raw)
    _expand(data, "$")
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
                tasks.append(_parse_task(raw))
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


def common_prefix(a: tuple, b: tuple) -> int:
    """How many leading items `a` and `b` share. Tuple comparisons run in C: the usual case, one prompt
    extending the other, costs one slice; otherwise a binary search that compares only the window
    still in doubt (about 2n items copied in all, not n log n)."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    if (a if len(a) == n else a[:n]) == (b if len(b) == n else b[:n]):
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


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
        return orjson.dumps(record, option=DUMP_OPTIONS | orjson.OPT_APPEND_NEWLINE)
    except orjson.JSONEncodeError:  # e.g. an integer beyond 64 bits, which orjson refuses
        return json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


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
