"""BurstGPT traces (HPMLL/BurstGPT): CSV of ChatGPT / GPT-4 requests served on Azure.

Columns ``Timestamp`` (seconds from 0:00 of the trace's first day), ``Model``, ``Request tokens``,
``Response tokens``, ``Total tokens``, ``Log Type`` (``Conversation log`` or ``API log``), and in newer
releases a ``Session ID`` column. Headers are matched ignoring case, spaces and underscores.

Without a session id every row is a task of one call (id ``burstgpt-<row>``, rows counted from 0 after the
header). Rows sharing a non-empty session id form one task (id ``burstgpt-s<session id>``), its calls in
time order; the gap before a call is the time between its send and the previous send of the session
(only send times are recorded, so it includes the previous call's service time). Arrival is seconds since
the first row; task class is the log type (``conversation``, ``api``).

Failed requests: the BurstGPT README says failures are the rows whose ``Response tokens`` are 0 (its
``*_without_fails`` files drop them). They carry no generation to replay, so they are left out and
counted in the provenance notes.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

from ..errors import ErrorPolicy, InputError
from ..workload import DEFAULT_CLASS, MAX_SECONDS, Call, Provenance, Task, Workload
from .csvfields import check_width, tokens
from .text import TextFile, first_line

FORMAT = "burstgpt"
REQUIRED = ("timestamp", "requesttokens", "responsetokens")


def _norm(column: str) -> str:
    return "".join(ch for ch in column.lower() if ch.isalnum())


def sniff(path: Path, head: bytes) -> bool:
    """True when the CSV header names BurstGPT's timestamp and token columns."""
    names = {_norm(c) for c in first_line(head).split(",")}
    return all(c in names for c in REQUIRED)


def _class(log_type: str) -> str:
    words = log_type.strip().lower().split()
    if words and words[-1] == "log":
        words = words[:-1]
    return "_".join(words) or DEFAULT_CLASS


def read(path: Path, policy: ErrorPolicy) -> Workload:
    """Read a BurstGPT CSV: single-call tasks, or one task per session where a session id is given."""
    name = str(path)
    singles: list[Task] = []
    sessions: dict[str, list[tuple[float, int, int, Optional[str], str]]] = {}
    failed = 0
    text = TextFile(path)
    with text:
        rows = text.csv_rows(name)
        header = next(rows, (1, None))[1]
        if not header:
            raise InputError("empty file: no CSV header", file=name, line=1)
        where = {_norm(c): i for i, c in enumerate(header)}
        label = {_norm(c): c.strip() for c in header}
        for column, shown in zip(REQUIRED, ("Timestamp", "Request tokens", "Response tokens")):
            if column not in where:
                raise InputError(f"missing column (header has: {', '.join(header)})", file=name, line=1, field=shown)
        i_time, i_in, i_out = (where[c] for c in REQUIRED)
        i_model, i_type = where.get("model"), where.get("logtype")
        i_session = where.get("sessionid")
        width = max(i_time, i_in, i_out) + 1
        origin: Optional[float] = None
        last = -math.inf
        for row_number, (line, row) in enumerate(rows):
            if not row:
                continue
            try:
                check_width(row, width, header, name, line)
                ts = _number(row[i_time], name, line, label["timestamp"])
                n_in = tokens(row[i_in], name, line, label["requesttokens"])
                n_out = tokens(row[i_out], name, line, label["responsetokens"])
                if ts < last:
                    raise InputError("goes backwards: earlier than the row before it",
                                     file=name, line=line, field=label["timestamp"])
                if origin is not None and ts - origin > MAX_SECONDS:
                    raise InputError(f"more than {MAX_SECONDS:g} s after the first row", file=name, line=line,
                                     field=label["timestamp"])
            except InputError as exc:
                policy.bad(exc)
                continue
            last = ts
            if origin is None:
                origin = ts
            if n_out == 0:
                failed += 1
                continue
            model = None
            if i_model is not None and i_model < len(row):
                model = row[i_model].strip() or None
            task_class = _class(row[i_type]) if i_type is not None and i_type < len(row) else DEFAULT_CLASS
            session = row[i_session].strip() if i_session is not None and i_session < len(row) else ""
            if session:
                sessions.setdefault(session, []).append((ts, n_in, n_out, model, task_class))
            else:
                call = Call(n_in, n_out, model=model)
                singles.append(Task(f"burstgpt-{row_number:06d}", (call,), round(ts - origin, 6), task_class))
    if origin is None:
        raise InputError("no requests found", file=name)
    tasks = sorted(singles + [_session_task(sid, rows, origin) for sid, rows in sessions.items()],
                   key=lambda t: t.arrival)
    if not tasks:
        raise InputError(f"no requests found: all {failed} rows are failed requests (Response tokens 0)", file=name)
    notes = []
    if sessions:
        calls = sum(map(len, sessions.values()))
        notes.append(f"grouped {calls} requests into {len(sessions)} sessions by Session ID; gaps are times "
                     "between sends, so they include the previous call's service time")
    if failed:
        notes.append(f"left out {failed} failed requests (Response tokens 0)")
    if text.note():
        notes.append(text.note())
    return Workload(tuple(tasks), (Provenance(name, FORMAT, {"on_error": policy.on_error}, tuple(notes)),))


def _session_task(sid: str, rows: list[tuple[float, int, int, Optional[str], str]], origin: float) -> Task:
    first = previous = rows[0][0]
    calls = []
    for ts, n_in, n_out, model, _ in rows:
        calls.append(Call(n_in, n_out, gap=round(ts - previous, 6), sent_at=round(ts - first, 6), model=model))
        previous = ts
    return Task(f"burstgpt-s{sid}", tuple(calls), round(first - origin, 6), rows[0][4])


def _number(text: str, name: str, line: int, field: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not abs(value) <= MAX_SECONDS:
        raise InputError(f"expected a number of seconds (at most {MAX_SECONDS:g} either way)", file=name, line=line,
                         field=field)
    return value
