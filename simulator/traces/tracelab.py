"""TraceLab round traces (uw-syfi/TraceLab): one row per LLM round, as JSON Lines (``round_trace.jsonl``,
the repository's examples) or gzip-compressed JSON Lines (``syfi_coding_trace.jsonl.gz``, the dataset's
release asset from v0.0.1 on, read as it is).

Rows are grouped into one `Task` per ``session_id`` (class: the row's ``provider``, e.g.
``claude`` or ``codex``, else ``tracelab``) and ordered by ``round_index``. Each round is a `Call`:

- input_tokens = ``input_tokens_total``; output_tokens = ``output_tokens``; model = ``model``.
- Prefix reuse: ``prefix_tokens`` of the prompt were cached. The trace has no block hashes, so ids
  are synthesised with `prefix.extend_prefix` (block size 64): the first ``prefix_tokens // 64``
  ids repeat the previous round's, the rest are new ids in the session's own namespace. A first
  round's cached tokens (from earlier sessions) are not modelled: its ids are all new.
- Timing comes from ``timing_events[]`` (ISO timestamps). A round is *sent* at its latest input
  event (``user_message`` / ``tool_result``: the request goes out once every tool result is in)
  and *ends* at its latest output event (``reasoning``, ``text``, ``tool_call``, ``usage_report``).
  So sent_at = send time minus the session's first timestamp, server_time = end minus send, and the
  gap before a round = its send time minus the previous round's end: the tools' wall time (parallel
  tools overlap, so the longest one counts) plus any user think time, which the tool latencies alone
  would miss. When a round lacks timestamps, the gap falls back to the longest tool latency of the
  previous round (0 without tools): ``tools[].tool_wall_latency_ms``, the wall time the trace observed,
  else ``tool_internal_latency_ms``, the time the tool reported.
- arrival = the session's first timestamp minus the earliest first timestamp in the file (0 for
  sessions without timestamps).

Duplicates. The released trace merges every session file it found, and a round copied into two session
files (a resumed session) appears twice under one ``session_id`` and ``round_index`` with the same
``round_id``: the copies after the first are left out and counted in the notes. Two different rounds
(another ``round_id``, or none) under one ``session_id`` and ``round_index`` are bad input.

Fields not read: the Claude cache split (``claude_*_input_tokens``), ``newly_append_tokens`` (the
prompt less ``prefix_tokens``), ``reasoning_output_tokens``, the ``current_*`` input summaries, and the
provenance fields (``project``, ``user``, ``store``, ``trace_key``, ``turn_id``).

Errors name the file, the line and the field (as a JSON path within the line: ``$.output_tokens``).
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import orjson

from . import compressed
from ..errors import ErrorPolicy, InputError
from ..workload import MAX_SECONDS, MAX_TOKENS, Call, Provenance, Task, Workload
from .prefix import extend_prefix, fresh_ids

FORMAT = "tracelab"
BLOCK_SIZE = 64
DEFAULT_CLASS = "tracelab"
INPUT_EVENTS = frozenset({"user_message", "tool_result"})
TOOL_LATENCIES = ("tool_wall_latency_ms", "tool_internal_latency_ms")
"""A tool's latency fields, in order of preference (see the module doc)."""


def sniff(path: Path, head: bytes) -> bool:
    """JSON lines with ``round_index`` and ``input_tokens_total``, plain or gzip-compressed."""
    head = compressed.plain_head(head)
    return head.lstrip()[:1] == b"{" and b'"round_index"' in head and b'"input_tokens_total"' in head


class _Round:
    """One validated row, before rounds are chained into calls."""

    __slots__ = ("session", "index", "round_id", "provider", "model", "total", "prefix", "output", "send", "end", "first",
                 "tool_wait", "line")

    def __init__(self, **values: Any) -> None:
        for key, value in values.items():
            setattr(self, key, value)


def _rows(path: Path, name: str) -> Iterator[tuple[Any, int]]:
    """(row, line number) for each non-blank line of a JSONL file, gzip-compressed or not."""
    empty = True
    try:
        for number, raw in compressed.lines(path):
            if not raw.strip():
                continue
            empty = False
            try:
                row = orjson.loads(raw)  # nesting deeper than 1024 is a decode error, not a RecursionError
            except orjson.JSONDecodeError as exc:
                raise InputError(f"invalid JSON: {exc}", file=name, line=number) from None
            yield row, number
    except compressed.DamagedGzip as exc:  # a cut or damaged gzip file
        raise InputError(f"damaged gzip data after line {exc.line}: {exc}", file=name, line=exc.line + 1) from None
    if empty:
        raise InputError("empty file", file=name)


def _time(value: Any) -> float:
    """Seconds since the epoch of an ISO-8601 timestamp."""
    if not isinstance(value, str):
        raise ValueError(f"not a timestamp: {value!r:.40}")
    try:
        return datetime.fromisoformat(value).timestamp()
    except (OverflowError, OSError):  # a year the platform's clock cannot convert
        raise ValueError(f"timestamp out of range: {value!r:.40}") from None


class _RowReader:
    def __init__(self, name: str) -> None:
        self.name = name

    def error(self, message: str, line: Optional[int], where: str, field: str) -> InputError:
        return InputError(message, file=self.name, line=line, path=f"{where}.{field}", field=field)

    def count(self, row: dict, key: str, line: Optional[int], where: str, default: Optional[int] = None) -> int:
        value = row.get(key)
        if value is None and default is not None:
            return default
        if type(value) is not int or not 0 <= value <= MAX_TOKENS:
            what = "missing" if value is None else f"must be an integer from 0 to {MAX_TOKENS:,}"
            raise self.error(what, line, where, key)
        return value

    def round(self, row: Any, line: Optional[int], where: str) -> _Round:
        if not isinstance(row, dict):
            raise InputError("expected a JSON object", file=self.name, line=line, path=where)
        session = row.get("session_id")
        if not isinstance(session, str) or not session:
            raise self.error("missing or not a string", line, where, "session_id")
        total = self.count(row, "input_tokens_total", line, where)
        prefix = self.count(row, "prefix_tokens", line, where, default=0)
        if prefix > total:
            raise self.error("exceeds input_tokens_total", line, where, "prefix_tokens")
        send = end = first = None
        events = row.get("timing_events") or []
        if not isinstance(events, list):
            raise self.error("must be a list", line, where, "timing_events")
        for i, event in enumerate(events):
            if not isinstance(event, dict):
                raise self.error("must be an object", line, f"{where}.timing_events[{i}]", "timing_events")
            try:
                at = _time(event.get("timestamp"))
            except ValueError:
                raise self.error("not an ISO-8601 timestamp", line, f"{where}.timing_events[{i}]", "timestamp") from None
            kind = event.get("event_type")
            if kind is not None and not isinstance(kind, str):
                raise self.error("must be a string", line, f"{where}.timing_events[{i}]", "event_type")
            first = at if first is None else min(first, at)
            if kind in INPUT_EVENTS:
                send = at if send is None else max(send, at)
            else:
                end = at if end is None else max(end, at)
        if send is None:
            send = first
        tool_wait = 0.0
        tools = row.get("tools") or []
        if not isinstance(tools, list):
            raise self.error("must be a list", line, where, "tools")
        for i, tool in enumerate(tools):
            for key in TOOL_LATENCIES:
                ms = tool.get(key) if isinstance(tool, dict) else None
                if ms is None:
                    continue
                if type(ms) not in (int, float) or not 0 <= ms <= MAX_SECONDS * 1000:
                    raise self.error(f"must be a number of milliseconds from 0 to {MAX_SECONDS * 1000:g}", line,
                                     f"{where}.tools[{i}]", key)
                tool_wait = max(tool_wait, ms / 1000.0)
                break
        provider, model, round_id = row.get("provider"), row.get("model"), row.get("round_id")
        return _Round(
            session=session,
            index=self.count(row, "round_index", line, where),
            round_id=round_id if isinstance(round_id, str) and round_id else None,
            provider=provider if isinstance(provider, str) and provider else DEFAULT_CLASS,
            model=model if isinstance(model, str) else None,
            total=total,
            prefix=prefix,
            output=self.count(row, "output_tokens", line, where),
            send=send,
            end=end,
            first=first,
            tool_wait=tool_wait,
            line=line,
        )


def _seconds(value: float, name: str, r: _Round, what: str) -> float:
    """A non-negative duration, rounded to microseconds (epoch floats carry noise below that); an InputError
    naming the round's line when it is longer than a workload may hold."""
    if value > MAX_SECONDS:
        raise InputError(f"{what} of {value:.3g} s is longer than {MAX_SECONDS:g} s", file=name, line=r.line,
                         path="$.timing_events", field="timestamp")
    return max(0.0, round(value, 6))


def _session_task(name: str, session: str, rounds: list[_Round], origin: Optional[float]) -> Task:
    rounds.sort(key=lambda r: r.index)
    starts = [r.first for r in rounds if r.first is not None]
    start = min(starts) if starts else None
    fresh = fresh_ids(f"tracelab:{session}")
    calls: list[Call] = []
    ids: Sequence[int] = ()
    previous: Optional[_Round] = None
    for r in rounds:
        ids = extend_prefix(ids, r.prefix, r.total, BLOCK_SIZE, fresh)
        if previous is None:
            gap = r.send - start if r.send is not None else 0.0
        elif r.send is not None and previous.end is not None:
            gap = r.send - previous.end
        else:
            gap = previous.tool_wait
        server = r.end - r.send if r.send is not None and r.end is not None else None
        calls.append(
            Call(
                r.total,
                r.output,
                _seconds(gap, name, r, "the gap before this round"),
                ids,
                BLOCK_SIZE,
                _seconds(server, name, r, "the server time") if server is not None else None,
                _seconds(r.send - start, name, r, "the send time") if r.send is not None else None,
                None,
                r.model,
            )
        )
        previous = r
    arrival = 0.0
    if start is not None and origin is not None:
        arrival = _seconds(start - origin, name, rounds[0], "the session's arrival after the file's first")
    return Task(session, tuple(calls), arrival, rounds[0].provider)


def read(path: Path, policy: ErrorPolicy) -> Workload:
    """Read a TraceLab ``round_trace.jsonl``."""
    path = Path(path)
    name = str(path)
    reader = _RowReader(name)
    sessions: dict[str, list[_Round]] = {}
    seen: dict[tuple[str, int], _Round] = {}
    copies = 0
    for row, line in _rows(path, name):
        where = "$"
        try:
            r = reader.round(row, line, where)
            first = seen.get((r.session, r.index))
            if first is not None:
                if r.round_id is not None and r.round_id == first.round_id:
                    copies += 1
                    continue
                raise reader.error(f"this round of the session appears twice (first on line {first.line})", line,
                                   where, "round_index")
        except InputError as exc:
            policy.bad(exc)
            continue
        seen[(r.session, r.index)] = r
        sessions.setdefault(r.session, []).append(r)
    firsts = [r.first for rounds in sessions.values() for r in rounds if r.first is not None]
    origin = min(firsts) if firsts else None
    tasks = []
    for session, rounds in sessions.items():
        try:
            tasks.append(_session_task(name, session, rounds, origin))
        except InputError as exc:
            policy.bad(exc)
    notes = ("rows repeating a round already read (same session_id, round_index and round_id), left out: "
             f"{copies:,}",) if copies else ()
    return Workload(tuple(tasks), (Provenance(name, FORMAT, {"block_size": BLOCK_SIZE}, notes),))
