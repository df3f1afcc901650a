"""NVIDIA Dynamo agent traces (ai-dynamo/dynamo, ``DYN_AGENT_TRACE=1``): JSON Lines of ``dynamo.agent.trace.v1``.

Dynamo's frontend writes one record per finished request (``event_type: request_end``), and the agent
harness may send tool records (``tool_start``, ``tool_end``, ``tool_error``) that Dynamo writes beside
them. The ``jsonl`` and ``jsonl_gz`` sinks wrap each record as ``{"timestamp": ms, "event": {...}}``;
bare records (as ``jq -c .event`` leaves them) read the same, and gzip files (one or several members,
as the ``jsonl_gz`` sink appends them) are read directly.

Every record has an ``agent_context``: ``session_id`` (the agent run), ``trajectory_id`` (one chain of
calls within it), ``parent_trajectory_id`` (the trajectory that spawned it, for sub-agents) and
``session_type_id`` (the kind of run). Dynamo versions before the rename call them ``workflow_id``,
``program_id``, ``parent_program_id`` and ``workflow_type_id``; both spellings are read.

What each field becomes:

- A trajectory's ``request_end`` records, in order of start, are a task's calls: input tokens from
  ``request.input_tokens`` (else ``replay.input_length``), output tokens from ``output_tokens``, the model,
  the finish reason (``finish_reason_metadata.finish_reason``) as the stop reason. A call starts at
  ``request_received_ms`` and ends ``total_time_ms`` later, as Dynamo's own trace converter reads them
  (without ``request_received_ms`` it ends at ``event_time_unix_ms``); its server time is the difference.
- Hash ids: ``replay.input_sequence_hashes`` with ``replay.trace_block_size``. They are 64-bit sequence
  hashes (each one stands for its block and every block before it) and stay meaningful across files of
  one deployment; the top bit is cleared to fit a workload's ids in [0, 2**63). A request without
  ``replay`` has no ids (the import notes count them).
- A trajectory without a parent (or whose parent has no requests in the file) is a task, with id its
  ``session_id`` (``<session_id>/<trajectory_id>`` when the session has several such trajectories), class
  its ``session_type_id``, arrival its first call's start from the file's earliest start.
- A trajectory with a parent is a sub-task of the parent's task (id ``<parent id>/<trajectory_id>``),
  spawned after the parent's last call that ended before its first call started (``after_call``; -1 when
  none had); the parent waits for it when none of the parent's later calls started before its last call
  ended. This is how Dynamo's own converter links them (``agent_trace_to_mooncake --agentic``).
- Gaps: a call's gap is its start minus the end of the call before it, or minus the end of the sub-tasks
  it waited for when they ended later (for a sub-task's first call: minus its spawning call's end). This
  is Dynamo's ``delay + tool_wait_ms``. Tool records do not change it: the import notes say how much of
  the gap time their spans cover (overlapping spans counted once), that is, how much was tool time rather
  than think time. Calls of one trajectory that overlapped (sent before the previous one ended) get gap 0
  and are counted in the notes: a replay sends them one after the other.

Dynamo rolls its gzip output into numbered segments (``prefix.000000.jsonl.gz``, ...). The Dynamo files
of one folder are read together (`read_files`), so a trajectory that runs across segments stays one task;
files named one by one on the command line are read one by one.

Bad records (not JSON, another schema, missing or wrong-typed fields, negative numbers, a request id seen
twice, parent links that loop) raise an `InputError` naming the file, the line and the field (with its
JSON path); under the skip policy the record is left out and counted. Records of event types this
importer does not know are passed over and counted in the notes.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Iterator, Optional

import orjson

from . import compressed
from ..errors import ErrorPolicy, InputError
from ..hash_ids import HashIds, common_prefix
from ..workload import MAX_DEPTH, MAX_SECONDS, MAX_TOKENS, Call, Provenance, SubTask, Task, Workload

FORMAT = "dynamo"
SCHEMA = "dynamo.agent.trace.v1"
DEFAULT_CLASS = "dynamo"
TOOL_EVENTS = frozenset({"tool_start", "tool_end", "tool_error"})
TERMINAL_TOOL_EVENTS = frozenset({"tool_end", "tool_error"})
_U64 = 1 << 64
_ID_MASK = (1 << 63) - 1
_SCHEMA_KEY = re.compile(rb'"schema"\s*:\s*"' + re.escape(SCHEMA.encode()) + rb'"')
"""The schema key and value as a record has them (not as a string inside another file's text, where the
quotes are escaped)."""
# current name -> the name before Dynamo renamed the agent context's fields
_CONTEXT_NAMES = {"session_id": "workflow_id", "trajectory_id": "program_id",
                  "parent_trajectory_id": "parent_program_id", "session_type_id": "workflow_type_id"}


def sniff(path: Path, head: bytes) -> bool:
    """True when the file (gzip or not) starts with a record of Dynamo's agent trace schema."""
    start = compressed.plain_head(head, 8192).lstrip()[:4096]
    return start.startswith(b"{") and _SCHEMA_KEY.search(start) is not None


def _lines(path: Path, name: str, policy: ErrorPolicy) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes) of each line, from a plain or a gzip file; a damaged gzip stream ends the file
    (the lines read before it are kept under the skip policy)."""
    try:
        yield from compressed.lines(path)
    except compressed.DamagedGzip as exc:
        what = "ends early (a truncated gzip file)" if exc.truncated else f"is not valid gzip: {exc}"
        policy.bad(InputError(f"the compressed stream {what}", file=name, line=exc.line + 1))


class _Request:
    """One `request_end` record, validated."""

    __slots__ = ("rid", "session", "trajectory", "parent", "kind", "start", "end", "n_in", "n_out", "server",
                 "hashes", "block_size", "model", "stop", "file", "line")

    def __init__(self, **values: Any) -> None:
        for key, value in values.items():
            setattr(self, key, value)


class _Record:
    """Field readers for one line, whose errors name the file, the line, the JSON path and the field."""

    def __init__(self, name: str, line: int, prefix: str) -> None:
        self.name = name
        self.line = line
        self.prefix = prefix

    def error(self, message: str, where: str, field: str) -> InputError:
        return InputError(message, file=self.name, line=self.line, path=f"{self.prefix}{where}", field=field)

    def obj(self, parent: dict, key: str, where: str, required: bool = True) -> Optional[dict]:
        value = parent.get(key)
        if value is None and not required:
            return None
        if not isinstance(value, dict):
            raise self.error("missing" if value is None else "must be an object", f"{where}.{key}", key)
        return value

    def text(self, parent: dict, key: str, where: str, required: bool = True,
             old: Optional[str] = None) -> Optional[str]:
        value = parent.get(key)
        if value is None and old is not None:
            value = parent.get(old)
        if value is None and not required:
            return None
        if not isinstance(value, str) or not value.strip():
            raise self.error("missing" if value is None else "must be a non-empty string", f"{where}.{key}", key)
        return value

    def tokens(self, parent: dict, key: str, where: str) -> Optional[int]:
        value = parent.get(key)
        if value is None:
            return None
        if type(value) is not int or not 0 <= value <= MAX_TOKENS:
            raise self.error(f"must be a whole number of tokens from 0 to {MAX_TOKENS:,}", f"{where}.{key}", key)
        return value

    def millis(self, parent: dict, key: str, where: str, required: bool = False) -> Optional[float]:
        value = parent.get(key)
        if value is None:
            if required:
                raise self.error("missing", f"{where}.{key}", key)
            return None
        if type(value) not in (int, float) or not math.isfinite(value) or not 0 <= value < _U64:
            raise self.error("must be a non-negative number of milliseconds", f"{where}.{key}", key)
        return float(value)


def _context(rec: _Record, event: dict) -> tuple[str, str, Optional[str], str]:
    """(session, trajectory, parent trajectory, session type) of a record."""
    ctx = rec.obj(event, "agent_context", "")
    session = rec.text(ctx, "session_id", ".agent_context", old=_CONTEXT_NAMES["session_id"])
    trajectory = rec.text(ctx, "trajectory_id", ".agent_context", old=_CONTEXT_NAMES["trajectory_id"])
    parent = rec.text(ctx, "parent_trajectory_id", ".agent_context", required=False,
                      old=_CONTEXT_NAMES["parent_trajectory_id"])
    kind = rec.text(ctx, "session_type_id", ".agent_context", required=False, old=_CONTEXT_NAMES["session_type_id"])
    return session, trajectory, parent, kind or DEFAULT_CLASS


def _request(rec: _Record, event: dict, event_ms: float) -> _Request:
    session, trajectory, parent, kind = _context(rec, event)
    req = rec.obj(event, "request", "")
    where = ".request"
    rid = rec.text(req, "request_id", where)
    replay = rec.obj(req, "replay", where, required=False)
    hashes: tuple[int, ...] = ()
    block_size = 0
    replay_length = None
    if replay is not None:
        at = f"{where}.replay"
        block_size = replay.get("trace_block_size")
        if type(block_size) is not int or not 0 < block_size <= MAX_TOKENS:
            raise rec.error("must be a positive whole number of tokens", f"{at}.trace_block_size", "trace_block_size")
        replay_length = rec.tokens(replay, "input_length", at)
        raw = replay.get("input_sequence_hashes")
        if type(raw) is not list or not all(type(h) is int and 0 <= h < _U64 for h in raw):
            raise rec.error("must be a list of 64-bit unsigned integers", f"{at}.input_sequence_hashes",
                            "input_sequence_hashes")
        hashes = tuple(h & _ID_MASK for h in raw)
    n_in = rec.tokens(req, "input_tokens", where)
    if n_in is None:
        n_in = replay_length
    if n_in is None:
        raise rec.error("missing (and no replay.input_length)", f"{where}.input_tokens", "input_tokens")
    n_out = rec.tokens(req, "output_tokens", where)
    if n_out is None:
        raise rec.error("missing", f"{where}.output_tokens", "output_tokens")
    received = rec.millis(req, "request_received_ms", where)
    total = rec.millis(req, "total_time_ms", where)
    if total is not None and total > MAX_SECONDS * 1000:
        raise rec.error(f"longer than {MAX_SECONDS:g} s", f"{where}.total_time_ms", "total_time_ms")
    if received is not None:
        start, end = received, received + total if total is not None else event_ms
    else:
        end, start = event_ms, event_ms - (total or 0.0)
    if end < start:
        raise rec.error("ends before the request was received", ".event_time_unix_ms", "event_time_unix_ms")
    model = req.get("model")
    finish = req.get("finish_reason_metadata")
    stop = finish.get("finish_reason") if isinstance(finish, dict) else None
    return _Request(rid=rid, session=session, trajectory=trajectory, parent=parent, kind=kind, start=start, end=end,
                    n_in=n_in, n_out=n_out, server=(end - start) / 1000 if received is not None or total is not None
                    else None, hashes=hashes, block_size=block_size if hashes else 0,
                    model=model if isinstance(model, str) and model else None,
                    stop=stop if isinstance(stop, str) and stop else None, file=rec.name, line=rec.line)


def _tool(rec: _Record, event: dict, event_ms: float) -> tuple[str, float, float]:
    """(trajectory, start ms, end ms) of a terminal tool record."""
    _, trajectory, _, _ = _context(rec, event)
    tool = rec.obj(event, "tool", "")
    end = rec.millis(tool, "ended_at_unix_ms", ".tool")
    end = event_ms if end is None else end
    start = rec.millis(tool, "started_at_unix_ms", ".tool")
    duration = rec.millis(tool, "duration_ms", ".tool")
    if start is None:
        start = end - duration if duration is not None else end
    if end < start:
        raise rec.error("ends before it started", ".tool.ended_at_unix_ms", "ended_at_unix_ms")
    return trajectory, start, end


class _Trace:
    """The records of one file: requests by trajectory, terminal tool spans by trajectory."""

    def __init__(self) -> None:
        self.requests: dict[str, list[_Request]] = {}
        self.tools: dict[str, list[tuple[float, float]]] = {}
        self.request_lines: dict[str, str] = {}
        self.ignored: dict[str, int] = {}
        self.tool_records = 0

    def add_line(self, name: str, line: int, raw: bytes) -> None:
        """Validate one line and file it; InputError when it is bad."""
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise InputError("not JSON (truncated or malformed line)", file=name, line=line) from None
        if not isinstance(doc, dict):
            raise InputError("expected a JSON object", file=name, line=line, path="$")
        wrapped = isinstance(doc.get("event"), dict)
        event = doc["event"] if wrapped else doc
        rec = _Record(name, line, "$.event" if wrapped else "$")
        schema = event.get("schema")
        if schema != SCHEMA:
            raise rec.error("missing" if schema is None else f"is {schema!r:.60}, not {SCHEMA!r}", ".schema", "schema")
        kind = event.get("event_type")
        if not isinstance(kind, str) or not kind:
            raise rec.error("missing" if kind is None else "must be a string", ".event_type", "event_type")
        event_ms = rec.millis(event, "event_time_unix_ms", "", required=True)
        if kind == "request_end":
            req = _request(rec, event, event_ms)
            if req.rid in self.request_lines:
                raise rec.error(f"request id seen twice (first at {self.request_lines[req.rid]})",
                                ".request.request_id", "request_id")
            self.request_lines[req.rid] = f"{name}:{line}"
            self.requests.setdefault(req.trajectory, []).append(req)
        elif kind in TOOL_EVENTS:
            self.tool_records += 1
            if kind in TERMINAL_TOOL_EVENTS:
                trajectory, start, end = _tool(rec, event, event_ms)
                self.tools.setdefault(trajectory, []).append((start, end))
        else:
            self.ignored[kind] = self.ignored.get(kind, 0) + 1


def _merged_overlap(spans: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Time in [lo, hi] covered by `spans` (sorted by start), overlapping spans counted once."""
    covered = 0.0
    cur_start = cur_end = None
    for start, end in spans:
        start, end = max(start, lo), min(end, hi)
        if end <= start:
            continue
        if cur_end is not None and start <= cur_end:
            cur_end = max(cur_end, end)
            continue
        if cur_end is not None:
            covered += cur_end - cur_start
        cur_start, cur_end = start, end
    if cur_end is not None:
        covered += cur_end - cur_start
    return covered


class _Builder:
    """Makes tasks of trajectories and sub-tasks of their children (see the module docstring)."""

    def __init__(self, trace: _Trace, children: dict[str, list[str]], origin: float) -> None:
        self.trace = trace
        self.children = children
        self.origin = origin
        self.overlapping = 0
        self.without_hashes = 0
        self.gap_ms = 0.0
        self.tool_ms = 0.0
        self.subtasks = 0
        self.flattened: list[str] = []

    def task(self, task_id: str, trajectory: str, spawned_at: float, depth: int) -> tuple[Task, float]:
        """The task of `trajectory`, which starts at `spawned_at` (ms), and when its last call ends (ms)."""
        reqs = self.trace.requests[trajectory]
        spans = sorted(self.trace.tools.get(trajectory, ()))
        starts = [r.start for r in reqs]
        ends = [r.end for r in reqs]
        # sub-tasks first: each call's gap depends on the waited sub-tasks that end before it
        subtasks: list[SubTask] = []
        joined: dict[int, float] = {}  # call index -> latest end of the sub-tasks its successor waits for
        for child in self.children.get(trajectory, ()):
            if depth >= MAX_DEPTH:
                self.flattened.append(child)
                continue
            child_start = self.trace.requests[child][0].start
            after = max((i for i, e in enumerate(ends) if e <= child_start), default=-1)
            begin = ends[after] if after >= 0 else spawned_at
            sub, child_end = self.task(f"{task_id}/{child}", child, begin, depth + 1)
            wait = all(s >= child_end for s in starts[after + 1:])
            if wait:
                joined[after] = max(joined.get(after, child_end), child_end)
            subtasks.append(SubTask(after, sub, wait))
            self.subtasks += 1
        calls: list[Call] = []
        previous: tuple[tuple[int, ...], HashIds] = ((), HashIds.run(0, 0))
        for i, req in enumerate(reqs):
            ready = spawned_at if i == 0 else max(ends[i - 1], joined.get(i - 1, ends[i - 1]))
            gap_ms = req.start - ready
            if gap_ms < 0:
                self.overlapping += i > 0
                gap_ms = 0.0
            elif i > 0:
                self.gap_ms += gap_ms
                self.tool_ms += _merged_overlap(spans, ready, req.start)
            ids: Any = ()
            if req.hashes:
                shared = common_prefix(req.hashes, previous[0])
                previous = (req.hashes, previous[1].extend(shared, req.hashes[shared:]))
                ids = previous[1]
            else:
                self.without_hashes += 1
            calls.append(Call(req.n_in, req.n_out, round(gap_ms / 1000, 6), ids, req.block_size,
                              None if req.server is None else round(req.server, 6),
                              round((req.start - spawned_at) / 1000, 6), req.stop, req.model))
        arrival = round((reqs[0].start - self.origin) / 1000, 6)
        return Task(task_id, tuple(calls), arrival, reqs[0].kind, tuple(subtasks)), max(ends)


def _lineage(trace: _Trace, policy: ErrorPolicy) -> tuple[list[str], dict[str, list[str]], int]:
    """(root trajectories, children by trajectory, how many trajectories name a parent not in the file).

    A trajectory's parent is the one its requests name; two different parents, or links that loop, are bad
    input (the trajectory is left out under the skip policy)."""
    parent_of: dict[str, Optional[str]] = {}
    for trajectory, reqs in list(trace.requests.items()):
        named = {r.parent for r in reqs if r.parent is not None}
        if len(named) > 1:
            bad = next(r for r in reqs if r.parent is not None and r.parent != reqs[0].parent)
            policy.bad(InputError(f"names parent trajectories {' and '.join(sorted(named))!s:.200}", file=bad.file,
                                  line=bad.line, field="parent_trajectory_id"))
            del trace.requests[trajectory]
            continue
        parent_of[trajectory] = named.pop() if named else None
    roots, missing = [], 0
    children: dict[str, list[str]] = {}
    for trajectory, parent in parent_of.items():
        if parent is None or parent not in parent_of:
            roots.append(trajectory)
            missing += parent is not None
        else:
            children.setdefault(parent, []).append(trajectory)
    reached: set[str] = set()
    stack = list(roots)
    while stack:
        t = stack.pop()
        reached.add(t)
        stack.extend(children.get(t, ()))
    for trajectory in parent_of:
        if trajectory not in reached:
            first = trace.requests[trajectory][0]
            policy.bad(InputError("its parent trajectories lead back to itself (a loop of parent links)",
                                  file=first.file, line=first.line, field="parent_trajectory_id"))
    for kids in children.values():
        kids[:] = [k for k in kids if k in reached]
        kids.sort(key=lambda k: (trace.requests[k][0].start, k))
    return roots, children, missing


def read(path: Path, policy: ErrorPolicy) -> Workload:
    """Read a Dynamo agent trace (JSONL or JSONL.GZ): trajectories become tasks and sub-tasks."""
    return read_files([path], policy)


def read_files(paths: list[Path], policy: ErrorPolicy) -> Workload:
    """Read the files of one trace (the segments Dynamo rolls its output into) as one: a trajectory may
    run across files."""
    paths = [Path(p) for p in paths]
    name = str(paths[0]) if len(paths) == 1 else str(paths[0].parent)
    trace = _Trace()
    for path in paths:
        for line, raw in _lines(path, str(path), policy):
            if not raw.strip():
                continue
            try:
                trace.add_line(str(path), line, raw)
            except InputError as exc:
                policy.bad(exc)
    _drop_far(trace, policy)
    if not trace.requests:
        raise InputError("no request_end records found", file=name)
    for reqs in trace.requests.values():
        reqs.sort(key=lambda r: (r.start, r.end, r.rid))
    roots, children, missing = _lineage(trace, policy)
    builder = _Builder(trace, children, min(reqs[0].start for reqs in trace.requests.values()))
    roots.sort(key=lambda t: (trace.requests[t][0].start, t))
    roots_of_session: dict[str, int] = {}
    for t in roots:
        session = trace.requests[t][0].session
        roots_of_session[session] = roots_of_session.get(session, 0) + 1
    tasks = []
    queue = [(t, roots_of_session[trace.requests[t][0].session] == 1) for t in roots]
    while queue:  # sub-agents nested deeper than a workload holds come back as tasks of their own
        for trajectory, alone in queue:
            first = trace.requests[trajectory][0]
            task_id = first.session if alone else f"{first.session}/{trajectory}"
            tasks.append(builder.task(task_id, trajectory, first.start, 0)[0])
        queue = [(t, False) for t in builder.flattened]
        builder.flattened = []
    notes = _notes(trace, builder, tasks, missing)
    return Workload(tuple(tasks), (Provenance(name, FORMAT, {"on_error": policy.on_error}, tuple(notes)),))


def _drop_far(trace: _Trace, policy: ErrorPolicy) -> None:
    """Leave out requests that end more than a workload's longest time after the file's first start."""
    if not trace.requests:
        return
    origin = min(r.start for reqs in trace.requests.values() for r in reqs)
    limit = origin + MAX_SECONDS * 1000
    for trajectory, reqs in list(trace.requests.items()):
        for req in [r for r in reqs if r.end > limit]:
            policy.bad(InputError(f"ends more than {MAX_SECONDS:g} s after the trace's first request",
                                  file=req.file, line=req.line, field="event_time_unix_ms"))
            reqs.remove(req)
        if not reqs:
            del trace.requests[trajectory]


def _notes(trace: _Trace, builder: _Builder, tasks: list[Task], missing: int) -> list[str]:
    calls = sum(len(t.calls) for task in tasks for t in task.walk())
    sessions = len({r.session for reqs in trace.requests.values() for r in reqs})
    notes = [
        f"{calls} requests of {sessions} sessions in {len(tasks)} tasks and {builder.subtasks} sub-tasks "
        "(by trajectory_id and parent_trajectory_id); a gap runs from the end of the call (or waited sub-tasks) "
        "before it to the call's start"
    ]
    if trace.tool_records:
        share = f"{100 * builder.tool_ms / builder.gap_ms:.1f}%" if builder.gap_ms > 0 else "none"
        notes.append(f"{trace.tool_records} tool records; tool spans cover {share} of the time between the calls "
                     f"of a trajectory ({builder.tool_ms / 1000:,.3f} of {builder.gap_ms / 1000:,.3f} s), the rest "
                     "is think time")
    if builder.overlapping:
        notes.append(f"{builder.overlapping} calls started before the previous call of their trajectory ended: "
                     "gap 0, a replay sends them one after the other")
    if builder.without_hashes:
        notes.append(f"{builder.without_hashes} requests have no replay hashes: their prompts replay cold")
    if missing:
        notes.append(f"{missing} trajectories name a parent trajectory with no requests in the file: each is a task")
    if trace.ignored:
        kinds = ", ".join(f"{k} ({n})" for k, n in sorted(trace.ignored.items()))
        notes.append(f"records of event types not read: {kinds}")
    return notes
