"""The native trace format: versioned JSONL, a header line then one task per line.

Line 1: ``{"agentload_trace": 1, "provenance": [...]}``. Every other line is one `Task` as its
fields are named in `simulator.workload`, with default values left out. The JSON Schema of a task
line comes from the same classes (`task_json_schema`), documented in docs/trace-format.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any

from pydantic import TypeAdapter, ValidationError

from ..errors import ErrorPolicy, InputError
from ..workload import Provenance, Task, Workload

FORMAT = "native"
VERSION = 1
HEADER_KEY = "agentload_trace"

_TASK = TypeAdapter(Task)
_PROVENANCE = TypeAdapter(list[Provenance])


def sniff(path: Path, head: bytes) -> bool:
    """True when the file starts with the native header."""
    return head.lstrip().startswith(b'{"' + HEADER_KEY.encode())


def task_json_schema() -> dict[str, Any]:
    """JSON Schema of one task line."""
    return _TASK.json_schema()


def header_json_schema() -> dict[str, Any]:
    """JSON Schema of the header line."""
    return {
        "type": "object",
        "properties": {
            HEADER_KEY: {"const": VERSION, "description": "format version"},
            "provenance": _PROVENANCE.json_schema(),
        },
        "required": [HEADER_KEY],
    }


def _describe(error: ValidationError) -> tuple[str, str, str]:
    """(JSON path, field, message) of the first problem pydantic found."""
    first = error.errors()[0]
    loc = [str(p) for p in first["loc"] if not str(p).startswith("function-")]
    path = "$" + "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in loc)
    field = next((p for p in reversed(loc) if not p.isdigit()), "")
    return path, field, first["msg"]


def read(path: Path, policy: ErrorPolicy) -> Workload:
    """Read a native JSONL file."""
    name = str(path)
    tasks: list[Task] = []
    provenance: tuple[Provenance, ...] = ()
    with open(path, "rb") as fh:
        header_line = fh.readline()
        try:
            header = json.loads(header_line)
        except ValueError as exc:
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
            try:
                tasks.append(_TASK.validate_json(raw))
            except ValidationError as exc:
                where, field, msg = _describe(exc)
                policy.bad(InputError(msg, file=name, line=number, path=where, field=field))
    return Workload(tuple(tasks), provenance)


def write(workload: Workload, out: IO[bytes] | Path | str) -> None:
    """Write a workload as native JSONL (to a path or a binary stream)."""
    if isinstance(out, (str, Path)):
        with open(out, "wb") as fh:
            write(workload, fh)
        return
    header = {HEADER_KEY: VERSION, "provenance": _PROVENANCE.dump_python(list(workload.provenance), mode="json")}
    out.write(json.dumps(header).encode() + b"\n")
    for task in workload.tasks:
        out.write(_TASK.dump_json(task, exclude_defaults=True) + b"\n")

