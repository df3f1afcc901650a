"""Claude Code sessions in the kv-cache-tester JSON format (callanjfox/kv-cache-tester, traces/), also as
SemiAnalysis republishes them (the ``cc-traces-weka-*`` corpora that aiperf replays).

One file is one session and becomes one `Task` (id: the file's ``id``, else its stem; class
``claude-code``; arrival 0). Each request of ``requests`` (``type`` ``n`` or ``s``: not streamed or
streamed, read alike) becomes a `Call`:

================  ================================================================================
trace field        what it becomes
================  ================================================================================
``in``/``out``     input_tokens / output_tokens (required, non-negative integers)
``hash_ids``       hash_ids, with the file's ``block_size`` (default 64); missing or null: no ids
``think_time``     gap: client/tool delay before the request (0 when missing)
``t``              sent_at: seconds from the (sub-)agent's start (required, never decreasing)
``api_time``       server_time: the whole request on the server
``ttft``           counted in the notes only: a call has no time-to-first-token field, and its
                   server_time stays ``api_time``
``stop``           stop_reason (an empty string counts as unknown)
``model``          model
================  ================================================================================

``input_types``, ``output_types``, ``tool_tokens`` and ``system_tokens`` are not read. The file's
``totals`` (parent and sub-agent tokens, ``subagent_count``) are checked against what was read: a
difference (records skipped, a cut file) is said in the notes.

Hash ids: with ``hash_id_scope: "local"`` (the default) ids are only meaningful inside one file, so
each file's ids are moved into a namespace of their own (`prefix.namespace` of the file id): two
files never share blocks by accident, whatever order they are loaded in. A file's sub-agents share
its namespace (they do share blocks with each other: the same tool definitions and system prompt).
With any other scope (``"global"``) the ids are kept as they are.

Sub-agents: an entry with ``type: "subagent"`` holds its own ``requests`` and becomes a `SubTask`
whose task has id ``<parent id>/<agent_id>`` and class ``subagent_type``; sub-agents may nest. Its
``duration_ms`` places it in time; ``tool_use_count`` (tool calls it made, by its own count) is summed
in the notes, as is its ``status``; ``total_tokens`` is not read. Two layouts exist:

- kv-cache-tester's: the requests' ``t`` count from the sub-agent's own start. The entry's ``t`` is when
  the sub-agent *finished*: ``t - duration_ms/1000`` falls within a second of the end of the parent call
  that spawned it (trace_0277 shows this for all four sub-agents), and kv-cache-tester's own replayer
  pauses the parent until its sub-agents complete. So it runs from ``t - duration_ms/1000`` to ``t``.
  A ``status: "async_launched"`` entry (a sub-agent launched in the background, whose ``duration_ms`` is
  null) is the exception: its ``t`` is the launch, right after the parent call that spawned it.
- SemiAnalysis's (aiperf's ``WekaSubagentEntry``): the entry's ``t`` is the spawn and its requests' ``t``
  count from the session's start, like the parent's. An entry whose requests all start at or after its
  own ``t`` is read this way (in kv-cache-tester's layout they start at 0, before the entry's ``t``).

Without ``duration_ms`` the duration is estimated from the sub-agent's last request (its ``t`` plus
``api_time``). `SubTask.after_call` is the last parent call sent at or before the sub-agent's start (-1
if none); `SubTask.wait` is true when no parent call was sent while it ran, and never for an
``async_launched`` one (the parent does not wait for a background agent).

The recorded ``think_time`` of the parent call that follows waited sub-agents includes the time
spent waiting for them, while the agent behaviour starts that call's gap only after they are
joined; that gap is therefore reduced by the longest waited sub-agent's duration (never below 0),
so a replay at recorded speed sends the call when the recording did.

Bad requests (missing or non-numeric fields, negative tokens, ``t`` going backwards) raise an
`InputError` with the file, the JSON path (``$.requests[12].in``) and the field; under the skip
policy the request is left out and counted.
"""

from __future__ import annotations

import dataclasses
import math
from bisect import bisect_right
from pathlib import Path
from typing import Any, NamedTuple, Optional

import orjson

from ..errors import ErrorPolicy, InputError
from ..hash_ids import BadHashId, HashIds, checked, common_prefix
from ..workload import MAX_SECONDS, MAX_TOKENS, Call, Provenance, SubTask, Task, Workload
from .prefix import LOCAL_ID_LIMIT, namespace

FORMAT = "claude-code"
TASK_CLASS = "claude-code"
DEFAULT_BLOCK_SIZE = 64
SUBAGENT_CLASS = "subagent"
BACKGROUND_STATUS = "async_launched"
"""A sub-agent's ``status`` when it was launched in the background: the parent does not wait for it."""
MAX_DEPTH = 32
"""Deepest nesting of sub-agents read (a sub-agent of a sub-agent ... ); deeper is bad input."""


def sniff(path: Path, head: bytes) -> bool:
    """A JSON object with a ``requests`` list and a ``block_size`` or ``hash_id_scope`` key."""
    text = head.lstrip()
    if not text.startswith(b"{") or text.startswith(b'{"agentload_trace'):
        return False
    return b'"requests"' in head and (b'"block_size"' in head or b'"hash_id_scope"' in head)


class _IdMap(dict):
    """Local hash id -> namespaced id, computed once per distinct id (which also validates it).

    Consecutive prompts repeat most of their ids, so sharing the int objects keeps memory low."""

    def __init__(self, base: int) -> None:
        super().__init__()
        self.base = base

    def __missing__(self, key: Any) -> int:
        if type(key) is not int or not 0 <= key < LOCAL_ID_LIMIT:
            raise ValueError("must be integers in [0, 2**32)")
        value = self.base | key
        self[key] = value
        return value


def _is_number(value: Any, limit: float = MAX_SECONDS) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and abs(value) <= limit


class _Spawn(NamedTuple):
    """A sub-agent entry read, before it is placed after a parent call: times on the parent's clock."""

    task: Task
    start: float
    end: float
    duration: float
    background: bool


class _Tally:
    """What a file held beyond the calls, for its notes."""

    def __init__(self) -> None:
        self.calls = 0
        self.ttft = 0
        self.no_ids = 0
        self.subagents = 0
        self.background = 0
        self.spawn_layout = 0  # sub-agents in SemiAnalysis's layout (spawn time, session clock)
        self.tool_uses = 0
        self.tool_counts = 0  # sub-agents that report tool_use_count

    def notes(self) -> list[str]:
        out = []
        if self.ttft:
            out.append(f"{self.ttft} of {self.calls} calls record a ttft (time to first token); a call keeps "
                       "its api_time as server_time and has no field for the ttft, which is not imported")
        if self.no_ids:
            out.append(f"{self.no_ids} calls carry no hash_ids: no prefix blocks for them")
        if self.subagents:
            line = f"{self.subagents} sub-agents"
            if self.background:
                line += f" ({self.background} launched in the background: the parent does not wait for them)"
            if self.tool_counts:
                line += f"; {self.tool_uses:,} tool uses by the count of the {self.tool_counts} that report one"
            if self.spawn_layout:
                line += f"; {self.spawn_layout} timed on the session's clock from their spawn (SemiAnalysis layout)"
            out.append(line)
        return out


class _Reader:
    """Reads the requests of one file (and its nested sub-agents) into tasks."""

    def __init__(self, file: str, policy: ErrorPolicy, block_size: int, ids: _IdMap) -> None:
        self.file = file
        self.policy = policy
        self.block_size = block_size
        self.ids = ids
        self.last: tuple[list, HashIds] = ([], HashIds.run(0, 0))
        self.depth = 0
        self.tally = _Tally()

    def translate(self, raw: list) -> HashIds:
        """Namespaced ids of `raw`, sharing the previous prompt's ids as far as `raw` repeats them."""
        last_raw, last = self.last
        shared = common_prefix(raw, last_raw) if last_raw else 0
        new = raw[shared:]
        try:
            checked(new)  # ints, not bools or floats (a float equal to a known id would pass the map)
        except BadHashId as exc:
            bad = raw[shared + (exc.index or 0)]
            raise ValueError(f"must be integers in [0, 2**32), item {shared + (exc.index or 0)} is {bad!r:.40}") from None
        ids = last.extend(shared, list(map(self.ids.__getitem__, new)))
        self.last = (raw, ids)
        return ids

    def error(self, message: str, path: str, field: Optional[str]) -> InputError:
        return InputError(message, file=self.file, path=path, field=field)

    def tokens(self, req: dict, key: str, where: str) -> int:
        value = req.get(key)
        if type(value) is not int or not 0 <= value <= MAX_TOKENS:
            what = "missing" if value is None else f"must be an integer from 0 to {MAX_TOKENS:,}"
            raise self.error(what, f"{where}.{key}", key)
        return value

    def seconds(self, req: dict, key: str, where: str, required: bool = False,
                limit: float = MAX_SECONDS) -> Optional[float]:
        """A time field (seconds, or milliseconds with `limit` raised to match), None when missing."""
        value = req.get(key)
        if value is None:
            if required:
                raise self.error("missing", f"{where}.{key}", key)
            return None
        if not _is_number(value, limit) or value < 0:
            raise self.error(f"must be a finite number from 0 to {limit:,.0f}", f"{where}.{key}", key)
        return float(value)

    def task(self, task_id: str, task_class: str, requests: Any, where: str, origin: float = 0.0) -> Task:
        """The task made of `requests` (the list at JSON path `where`), whose ``t`` count from `origin`."""
        if not isinstance(requests, list):
            raise self.error("must be a list of requests", where, "requests")
        if self.depth > MAX_DEPTH:
            raise self.error(f"sub-agents nested more than {MAX_DEPTH} deep", where, "requests")
        calls: list[Call] = []
        sent: list[float] = []
        spawns: list[_Spawn] = []
        last_t = 0.0
        for index, req in enumerate(requests):
            at = f"{where}[{index}]"
            try:
                if not isinstance(req, dict):
                    raise self.error("must be an object", at, None)
                t = self.seconds(req, "t", at, required=True)
                if t < last_t:
                    raise self.error("goes backwards (earlier than the request before)", f"{at}.t", "t")
                if req.get("type") == "subagent":
                    spawns.append(self.subagent(req, at, task_id, t))
                else:
                    calls.append(self.call(req, at, round(t - origin, 6) if origin else t))
                    sent.append(t)
            except InputError as exc:
                self.policy.bad(exc)
                continue
            last_t = t
        subtasks = []
        waited_for: dict[int, float] = {}  # after_call -> longest waited sub-agent, in seconds
        for spawn in spawns:
            after = bisect_right(sent, spawn.start) - 1
            wait = not spawn.background and all(s >= spawn.end for s in sent[after + 1 :])
            subtasks.append(SubTask(after, spawn.task, wait))
            if wait:
                waited_for[after] = max(waited_for.get(after, 0.0), spawn.duration)
        for after, waited in waited_for.items():
            if after + 1 < len(calls) and waited:
                call = calls[after + 1]
                calls[after + 1] = dataclasses.replace(call, gap=round(max(0.0, call.gap - waited), 6))
        self.tally.calls += len(calls)
        return Task(task_id, tuple(calls), 0.0, task_class, tuple(subtasks))

    def call(self, req: dict, at: str, sent_at: float) -> Call:
        inp = self.tokens(req, "in", at)
        out = self.tokens(req, "out", at)
        raw_ids = req.get("hash_ids")
        if raw_ids is None:
            raw_ids = []
            self.tally.no_ids += 1
        elif not isinstance(raw_ids, list):
            raise self.error("must be a list of integers", f"{at}.hash_ids", "hash_ids")
        try:
            hash_ids = self.translate(raw_ids)
        except (ValueError, TypeError) as exc:
            raise self.error(str(exc), f"{at}.hash_ids", "hash_ids") from None
        think = self.seconds(req, "think_time", at) or 0.0
        api = self.seconds(req, "api_time", at)
        if self.seconds(req, "ttft", at) is not None:
            self.tally.ttft += 1
        stop = req.get("stop")
        model = req.get("model")
        return Call(
            inp,
            out,
            think,
            hash_ids,
            self.block_size,
            api,
            sent_at,
            stop if isinstance(stop, str) and stop else None,
            model if isinstance(model, str) else None,
        )

    def subagent(self, req: dict, at: str, parent_id: str, t: float) -> _Spawn:
        """The sub-agent entry at `at`, whose ``t`` is `t`, with its times on the parent's clock."""
        agent_id = req.get("agent_id")
        if not isinstance(agent_id, str) or not agent_id:
            raise self.error("missing or not a string", f"{at}.agent_id", "agent_id")
        kind = req.get("subagent_type")
        requests = req.get("requests")
        from_spawn = _starts_at_or_after(requests, t)
        self.depth += 1
        try:
            task = self.task(
                f"{parent_id}/{agent_id}",
                kind if isinstance(kind, str) and kind else SUBAGENT_CLASS,
                requests,
                f"{at}.requests",
                t if from_spawn else 0.0,
            )
        finally:
            self.depth -= 1
        if not task.calls:
            raise self.error("sub-agent has no usable requests", f"{at}.requests", "requests")
        duration_ms = self.seconds(req, "duration_ms", at, limit=MAX_SECONDS * 1000)
        if duration_ms is not None:
            duration = duration_ms / 1000.0
        else:
            last = task.calls[-1]
            duration = (last.sent_at or 0.0) + (last.server_time or 0.0)
        background = req.get("status") == BACKGROUND_STATUS
        tools = req.get("tool_use_count")
        if tools is not None and (type(tools) is not int or not 0 <= tools <= MAX_TOKENS):
            raise self.error(f"must be an integer from 0 to {MAX_TOKENS:,}", f"{at}.tool_use_count", "tool_use_count")
        tally = self.tally
        tally.subagents += 1
        tally.background += background
        tally.spawn_layout += from_spawn
        if tools is not None:
            tally.tool_uses += tools
            tally.tool_counts += 1
        if from_spawn or background:  # t is when it was spawned
            return _Spawn(task, t, t + duration, duration, background)
        return _Spawn(task, max(0.0, t - duration), t, duration, background)


def _starts_at_or_after(requests: Any, t: float) -> bool:
    """Whether every request of a sub-agent entry (whose ``t`` is `t`) has a ``t`` of at least `t`: its
    times then count on its parent's clock (SemiAnalysis's layout), not from its own start."""
    if not isinstance(requests, list):
        return False
    times = [r.get("t") for r in requests if isinstance(r, dict)]
    times = [x for x in times if _is_number(x)]
    return bool(times) and min(times) >= t


def _totals_note(totals: Any, task: Task) -> Optional[str]:
    """A note when the file's ``totals`` disagree with the requests read (None when they agree or
    the file has none)."""
    if not isinstance(totals, dict):
        return None
    try:
        stated = (totals["parent_tokens"]["input"], totals["parent_tokens"]["output"],
                  totals["subagent_tokens"]["input"], totals["subagent_tokens"]["output"], totals["subagent_count"])
    except (KeyError, TypeError):
        return None
    sub_calls = [c for s in task.subtasks for sub in s.task.walk() for c in sub.calls]
    read = (sum(c.input_tokens for c in task.calls), sum(c.output_tokens for c in task.calls),
            sum(c.input_tokens for c in sub_calls), sum(c.output_tokens for c in sub_calls), len(task.subtasks))
    if read == stated:
        return None
    names = ("parent input", "parent output", "sub-agent input", "sub-agent output", "sub-agents")
    differ = [f"{n}: {a:,} stated, {b:,} read" if type(a) is int else f"{n}: {a!r:.20} stated, {b:,} read"
              for n, a, b in zip(names, stated, read) if a != b]
    return "the file's totals disagree with the requests read: " + "; ".join(differ)


def _parse(path: Path) -> Any:
    raw = path.read_bytes()
    if not raw.strip():
        raise InputError("empty file", file=str(path))
    try:
        return orjson.loads(raw)  # refuses nesting deeper than 1024 (stdlib json would recurse until it fails)
    except orjson.JSONDecodeError as exc:
        raise InputError(f"invalid JSON: {exc.msg} (column {exc.colno})", file=str(path), line=exc.lineno) from None


def read(path: Path, policy: ErrorPolicy) -> Workload:
    """Read one kv-cache-tester JSON session file."""
    path = Path(path)
    name = str(path)
    doc = _parse(path)
    if not isinstance(doc, dict):
        raise InputError("expected a JSON object", file=name, path="$")
    file_id = doc.get("id", path.stem)
    if not isinstance(file_id, str) or not file_id:
        raise InputError("must be a non-empty string", file=name, path="$.id", field="id")
    block_size = doc.get("block_size", DEFAULT_BLOCK_SIZE)
    if type(block_size) is not int or not 0 < block_size <= MAX_TOKENS:
        raise InputError(
            f"must be a positive integer, got {block_size!r}", file=name, path="$.block_size", field="block_size"
        )
    scope = doc.get("hash_id_scope", "local")
    if not isinstance(scope, str):
        raise InputError(f"must be a string ('local' or 'global'), got {scope!r:.40}", file=name,
                         path="$.hash_id_scope", field="hash_id_scope")
    ids = _IdMap(namespace(file_id) if scope == "local" else 0)
    reader = _Reader(name, policy, block_size, ids)
    task = reader.task(file_id, TASK_CLASS, doc.get("requests"), "$.requests")
    notes = reader.tally.notes()
    totals = _totals_note(doc.get("totals"), task)
    if totals:
        notes.append(totals)
    provenance = (Provenance(name, FORMAT, {"block_size": block_size, "hash_id_scope": scope}, tuple(notes)),)
    if not task.calls:
        policy.bad(InputError("no usable requests", file=name, path="$.requests", field="requests"))
        return Workload((), provenance)
    return Workload((task,), provenance)
