"""TraceLab replay workloads (uw-syfi/TraceLab, ``replay/examples/*.csv``): one row per round.

Both header forms of TraceLab's session runner are read:
``session_id,[arrival_time,]round_idx,prefix_len,input_len,output_len,tool_wait_after_ms`` and the
canonical ``id,input_len,output_len,arrival_time,round_idx,tool_wait_after_ms,prefix_len``.

Rows are grouped into one `Task` per session (id ``<file stem>:<session>``, since the examples
number their sessions 0, 1, 2 in every file; class ``tracelab``), ordered by ``round_idx``:

- input_tokens = ``prefix_len + input_len`` (the prefix kept from earlier rounds plus the new input);
  output_tokens = ``output_len``.
- Prefix reuse: ``prefix_len`` tokens, synthesised as hash ids with `prefix.extend_prefix`
  (block size 64) in a namespace of the file and session.
- gap before round k = ``tool_wait_after_ms`` of round k-1 / 1000 (the runner sleeps that long after
  a round completes); the last round's wait has nothing to delay and is dropped.
- arrival = ``arrival_time`` / 1000 (milliseconds; a missing or empty value is 0), from the session's
  first round.

Errors name the file, the line and the column.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Optional

from ..errors import ErrorPolicy, InputError
from ..workload import MAX_SECONDS, MAX_TOKENS, Call, Provenance, Task, Workload
from .prefix import extend_prefix, fresh_ids
from .text import TextFile, first_line

FORMAT = "tracelab-csv"
BLOCK_SIZE = 64
TASK_CLASS = "tracelab"
REQUIRED = ("round_idx", "prefix_len", "input_len", "output_len", "tool_wait_after_ms")
SESSION_COLUMNS = ("session_id", "id")


def _header(line: str) -> list[str]:
    try:
        return [c.strip() for c in next(csv.reader([line]), [])]
    except csv.Error:
        return []


def sniff(path: Path, head: bytes) -> bool:
    """A CSV whose header has a session column and every round column of the replay format."""
    columns = set(_header(first_line(head)))
    return bool(columns & set(SESSION_COLUMNS)) and all(c in columns for c in REQUIRED)


def _int(value: str) -> int:
    number = int(value)
    if not 0 <= number <= MAX_TOKENS:
        raise ValueError(f"not a whole number from 0 to {MAX_TOKENS:,}")
    return number


def _float(value: str) -> float:
    number = float(value) if value.strip() else 0.0
    if not 0 <= number <= MAX_SECONDS * 1000:
        raise ValueError(f"not a number of milliseconds from 0 to {MAX_SECONDS * 1000:g}")
    return number


def read(path: Path, policy: ErrorPolicy) -> Workload:
    """Read a TraceLab replay CSV."""
    path = Path(path)
    name = str(path)
    text = TextFile(path)
    with text:
        rows = text.csv_rows(name)
        header = next(rows, (1, None))[1]
        if not header or not any(c.strip() for c in header):
            raise InputError("empty file", file=name)
        header = [c.strip() for c in header]
        session_col = next((c for c in SESSION_COLUMNS if c in header), None)
        for column in (session_col or "session_id",) + REQUIRED:
            if column not in header:
                raise InputError("missing column in the header", file=name, line=1, field=column)
        col = {c: header.index(c) for c in (session_col,) + REQUIRED}
        arrival_col: Optional[int] = header.index("arrival_time") if "arrival_time" in header else None
        sessions: dict[str, list[tuple[int, int, int, int, float, float]]] = {}
        seen: set[tuple[str, int]] = set()
        for line, row in rows:
            if not row or not any(v.strip() for v in row):
                continue
            try:
                if len(row) != len(header):
                    raise InputError(f"{len(row)} values for {len(header)} columns", file=name, line=line)
                values = []
                for column, parse in (
                    ("round_idx", _int), ("prefix_len", _int), ("input_len", _int),
                    ("output_len", _int), ("tool_wait_after_ms", _float),
                ):
                    values.append(_cell(row, col[column], column, parse, name, line))
                arrival = _cell(row, arrival_col, "arrival_time", _float, name, line) if arrival_col is not None else 0.0
                if values[1] + values[2] > MAX_TOKENS:
                    raise InputError(f"prefix_len + input_len is more than the {MAX_TOKENS:,} tokens a call may have",
                                     file=name, line=line, field="input_len")
                session = row[col[session_col]].strip()
                if not session:
                    raise InputError(f"empty (column {col[session_col] + 1})", file=name, line=line, field=session_col)
                if (session, values[0]) in seen:
                    raise InputError("this round of the session appears twice", file=name, line=line, field="round_idx")
            except InputError as exc:
                policy.bad(exc)
                continue
            seen.add((session, values[0]))
            sessions.setdefault(session, []).append((*values, arrival))
    tasks = tuple(_task(path.stem, s, rounds) for s, rounds in sessions.items())
    notes = (text.note(),) if text.note() else ()
    return Workload(tasks, (Provenance(name, FORMAT, {"block_size": BLOCK_SIZE}, notes),))


def _cell(row: list[str], index: int, column: str, parse, name: str, line: int):
    try:
        return parse(row[index].strip())
    except ValueError:
        reason = f"not a whole number from 0 to {MAX_TOKENS:,}" if parse is _int else \
            f"not a number of milliseconds from 0 to {MAX_SECONDS * 1000:g}"
        raise InputError(f"{reason} (column {index + 1})", file=name, line=line, field=column) from None


def _task(stem: str, session: str, rounds: list[tuple[int, int, int, int, float, float]]) -> Task:
    rounds.sort(key=lambda r: r[0])
    fresh = fresh_ids(f"tracelab-csv:{stem}:{session}")
    ids: tuple[int, ...] = ()
    calls = []
    wait_before = 0.0
    for _, prefix, new, output, wait_after, _ in rounds:
        total = prefix + new
        ids = extend_prefix(ids, prefix, total, BLOCK_SIZE, fresh)
        calls.append(Call(total, output, wait_before, ids, BLOCK_SIZE))
        wait_before = wait_after / 1000.0
    return Task(f"{stem}:{session}", tuple(calls), rounds[0][5] / 1000.0, TASK_CLASS)
