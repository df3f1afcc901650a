"""LMCache's agent traces (LMCache/lmcache-agent-trace: mini-SWE-agent, tau-bench, Magentic-One and more):
JSON Lines of LLM calls with their text.

One line is one call: ``{"timestamp": t, "input": "<prompt text>", "output": "<answer text>",
"session_id": "<id>"}``; the prompt is the whole context sent, flattened to one text. A file holds one
session or several.

Tasks. The calls of one ``session_id`` form a task (id: the session id; class ``lmcache``), in the order
of their timestamps (the files do not list calls in time order; ties keep the file's order).

Time. ``timestamp`` is a send time, in a unit the trace does not name: the published files use
microseconds since the epoch, a few use seconds from the trace's start. The unit is read from the file's
largest timestamp: from 10^14 on microseconds, from 10^11 on milliseconds, below that seconds (10^11 s
is over 3,000 years; 10^14 ms is 1973 in microseconds). ``sent_at`` is a call's send from its session's
first; ``arrival`` is a session's first send from the file's earliest. Only send times are recorded, so
a call's ``gap`` runs from the previous call's send: it includes that call's service time (the notes
say so), and ``server_time`` is unknown.

Tokens. The trace has text, not token counts: a call's input and output tokens are estimated at one
token per `BYTES_PER_TOKEN` bytes of UTF-8 text (rounded up), the size a tokenizer gives English text
and code within tens of percent; the notes say so.

Prefix hash ids come from the text (`simulator.traces.content`, as for OpenTelemetry spans that carry
messages), with the prompt split into paragraphs at blank lines standing for its messages: two prompts
share a block's id exactly when they start with the same paragraphs up to that block. Agents that
append to their context (mini-SWE-agent appends each command's output to the previous prompt) so share
their whole previous prompt, less the paragraph the new text continues, if any. A paragraph's size is
its estimated tokens; no text is kept.

Bad lines (not JSON, a field missing or of the wrong type, a negative or non-finite timestamp) raise
an `InputError` naming the file, the line and the field; under the skip policy they are left out and
counted.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from ..errors import ErrorPolicy, InputError
from ..hash_ids import HashIds, common_prefix
from ..workload import MAX_SECONDS, MAX_TOKENS, Call, Provenance, Task, Workload
from .content import BYTES_PER_TOKEN, ContentHasher, Estimate

FORMAT = "lmcache"
TASK_CLASS = "lmcache"
PARAGRAPH = "\n\n"
"""Where a prompt is split into the pieces that stand for its messages."""
UNITS = ((1e14, 1e6, "microseconds"), (1e11, 1e3, "milliseconds"), (0.0, 1.0, "seconds"))
"""(smallest largest-timestamp, per second, name): how a file's timestamps are read (module doc)."""
_TEXT_FIELDS = ("input", "output")
_SNIFF = (re.compile(rb'"input"\s*:\s*"'), re.compile(rb'"timestamp"\s*:\s*[0-9]'))


def sniff(path: Path, head: bytes) -> bool:
    """A JSON Lines file whose first object has a ``timestamp`` number and an ``input`` text (its line may
    run past the head, so the keys are looked for rather than the line parsed)."""
    text = head.lstrip()
    if not text.startswith(b"{") or text.startswith(b'{"agentload_'):
        return False
    first = text.split(b"\n", 1)[0]
    return all(pattern.search(first) for pattern in _SNIFF)


class _Row(NamedTuple):
    line: int
    timestamp: float
    session: str
    input: str
    output: str


def _row(obj: Any, name: str, line: int) -> _Row:
    """One validated line, or an InputError naming its field."""
    if not isinstance(obj, dict):
        raise InputError("expected a JSON object", file=name, line=line)
    t = obj.get("timestamp")
    if type(t) not in (int, float) or not math.isfinite(t) or t < 0:
        what = "missing" if t is None else "must be a finite non-negative number"
        raise InputError(what, file=name, line=line, field="timestamp")
    session = obj.get("session_id")
    if not isinstance(session, str) or not session:
        raise InputError("missing or not a non-empty string", file=name, line=line, field="session_id")
    texts = []
    for key in _TEXT_FIELDS:
        value = obj.get(key)
        if not isinstance(value, str):
            raise InputError("missing" if value is None else "must be a string", file=name, line=line, field=key)
        if _tokens(value) > MAX_TOKENS:
            raise InputError(f"longer than the {MAX_TOKENS:,} tokens a call may have", file=name, line=line,
                             field=key)
        texts.append(value)
    return _Row(line, t, session, texts[0], texts[1])


def _tokens(text: str) -> int:
    """Estimated tokens of a text (module doc)."""
    return -(-len(text.encode("utf-8", "replace")) // BYTES_PER_TOKEN)


def _paragraphs(text: str) -> list[str]:
    """The prompt cut after each blank line; the pieces joined give the text back."""
    pieces = text.split(PARAGRAPH)
    return [p + PARAGRAPH for p in pieces[:-1]] + ([pieces[-1]] if pieces[-1] else [])


def _rows(path: Path, name: str, policy: ErrorPolicy) -> list[_Row]:
    rows = []
    empty = True
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            empty = False
            try:
                try:
                    obj = orjson.loads(raw)
                except orjson.JSONDecodeError as exc:
                    raise InputError(f"invalid JSON: {exc}", file=name, line=number) from None
                rows.append(_row(obj, name, number))
            except InputError as exc:
                policy.bad(exc)
    if empty:
        raise InputError("empty file", file=name)
    return rows


def _unit(rows: list[_Row]) -> tuple[float, str]:
    """(timestamps per second, name of the unit) for a file's rows."""
    largest = max(r.timestamp for r in rows)
    return next((scale, unit) for low, scale, unit in UNITS if largest >= low)


def _seconds(value: float, row: _Row, name: str, what: str) -> float:
    if value > MAX_SECONDS:
        raise InputError(f"{what} of {value:.3g} s is longer than {MAX_SECONDS:g} s", file=name, line=row.line,
                         field="timestamp")
    return round(value, 6)


def _task(session: str, rows: list[_Row], origin: float, scale: float, hasher: ContentHasher, name: str) -> Task:
    rows.sort(key=lambda r: (r.timestamp, r.line))
    start = rows[0].timestamp
    calls = []
    previous = start
    ids = HashIds.run(0, 0)
    for row in rows:
        n_in = _tokens(row.input)
        new = hasher.hash_ids(_paragraphs(row.input), n_in)
        if new:  # the calls of a session share their ids' storage (simulator.hash_ids)
            shared = common_prefix(ids, new)
            new = ids = ids.extend(shared, new[shared:])
        calls.append(Call(
            n_in,
            _tokens(row.output),
            _seconds((row.timestamp - previous) / scale, row, name, "the gap before this call"),
            new,
            hasher.block_size if new else 0,
            None,
            _seconds((row.timestamp - start) / scale, row, name, "the send time"),
        ))
        previous = row.timestamp
    arrival = _seconds((start - origin) / scale, rows[0], name, "the session's arrival after the file's first call")
    return Task(session, tuple(calls), arrival, TASK_CLASS)


def read(path: Path, policy: ErrorPolicy) -> Workload:
    """Read one file of LMCache's agent traces."""
    path = Path(path)
    name = str(path)
    rows = _rows(path, name, policy)
    provenance = Provenance(name, FORMAT, {"on_error": policy.on_error})
    if not rows:
        return Workload((), (provenance,))
    scale, unit = _unit(rows)
    origin = min(r.timestamp for r in rows)
    sessions: dict[str, list[_Row]] = {}
    for row in rows:
        sessions.setdefault(row.session, []).append(row)
    hasher = ContentHasher()
    hasher.estimate = Estimate(per_message=0.0, per_byte=1.0 / BYTES_PER_TOKEN)  # no template: the text is all
    tasks = []
    for session, members in sessions.items():
        try:
            tasks.append(_task(session, members, origin, scale, hasher, name))
        except InputError as exc:
            policy.bad(exc)
    notes = [
        f"sessions: {len(sessions):,}, calls: {len(rows):,}; the trace has text, not token counts: input and output "
        f"tokens are estimated at 1 per {BYTES_PER_TOKEN} bytes of text, and prompts get hash ids from their text "
        f"cut into paragraphs at blank lines ({hasher.block_size}-token blocks; no text is kept)",
        f"timestamps read as {unit} (the file's largest is {max(r.timestamp for r in rows):,}); only send times are "
        "recorded, so each gap includes the previous call's service time",
    ]
    if hasher.relaid:
        notes.append(f"{hasher.relaid} calls were shorter than the leading paragraphs they share with an earlier "
                     "call and were laid out afresh (they share less)")
    return Workload(tuple(tasks), (Provenance(name, FORMAT, provenance.options, tuple(notes)),))
