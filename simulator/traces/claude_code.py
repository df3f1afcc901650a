"""Claude Code sessions in the kv-cache-tester JSON format (callanjfox/kv-cache-tester, traces/).

One file is one session and becomes one `Task` (id: the file's ``id``, else its stem; class
``claude-code``; arrival 0). Each entry of ``requests`` becomes a `Call`:

==============  ==================================================================
trace field      Call field
==============  ==================================================================
``in``/``out``   input_tokens / output_tokens (required, non-negative integers)
``hash_ids``     hash_ids (required), with the file's ``block_size`` (default 64)
``think_time``   gap: client/tool delay before the request (0 when missing)
``t``            sent_at: seconds from the session's start (required, never decreasing)
``api_time``     server_time
``stop``         stop_reason (an empty string counts as unknown)
``model``        model
==============  ==================================================================

Hash ids: with ``hash_id_scope: "local"`` (the default) ids are only meaningful inside one file, so
each file's ids are moved into a namespace of their own (`prefix.namespace` of the file id): two
files never share blocks by accident, whatever order they are loaded in. A file's sub-agents share
its namespace (they do share blocks with each other: the same tool definitions and system prompt).
With any other scope (``"global"``) the ids are kept as they are.

Sub-agents: an entry with ``type: "subagent"`` holds its own ``requests`` (with ``t`` counted from
the sub-agent's start) and becomes a `SubTask` whose task has id ``<parent id>/<agent_id>`` and
class ``subagent_type``; sub-agents may nest. In the published traces the entry's ``t`` is when the
sub-agent *finished*: ``t - duration_ms/1000`` falls within a second of the end of the parent call
that spawned it (trace_0277 shows this for all four sub-agents), and kv-cache-tester's own replayer
pauses the parent until its sub-agents complete. So the sub-agent runs from
``t - duration_ms/1000`` to ``t``; `SubTask.after_call` is the last parent call sent at or before
that start (-1 if none) and `SubTask.wait` is true when no parent call was sent while it ran. Without
``duration_ms`` the duration is estimated from the sub-agent's last request (its ``t`` plus
``api_time``).

The recorded ``think_time`` of the parent call that follows waited sub-agents includes the time
spent waiting for them, while the agent behaviour starts that call's gap only after they are
joined; that gap is therefore reduced by the longest waited sub-agent's duration (never below 0),
so a replay at recorded speed sends the call when the recording did.

Bad requests (missing or non-numeric fields, negative tokens, ``t`` going backwards) raise an
`InputError` with the file, the JSON path (``$.requests[12].in``) and the field; under the skip
policy the request is left out and counted.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from pathlib import Path
from typing import Any, Optional

import orjson

from ..errors import ErrorPolicy, InputError
from ..hash_ids import BadHashId, HashIds, checked, common_prefix
from ..workload import MAX_SECONDS, MAX_TOKENS, Call, Provenance, SubTask, Task, Workload
from .prefix import LOCAL_ID_LIMIT, namespace

FORMAT = "claude-code"
TASK_CLASS = "claude-code"
DEFAULT_BLOCK_SIZE = 64
SUBAGENT_CLASS = "subagent"
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


def _is_number(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and abs(value) <= MAX_SECONDS * 1000


class _Reader:
    """Reads the requests of one file (and its nested sub-agents) into tasks."""

    def __init__(self, file: str, policy: ErrorPolicy, block_size: int, ids: _IdMap) -> None:
        self.file = file
        self.policy = policy
        self.block_size = block_size
        self.ids = ids
        self.last: tuple[list, HashIds] = ([], HashIds.run(0, 0))
        self.depth = 0

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

    def seconds(self, req: dict, key: str, where: str, required: bool = False) -> Optional[float]:
        value = req.get(key)
        if value is None:
            if required:
                raise self.error("missing", f"{where}.{key}", key)
            return None
        if not _is_number(value) or value < 0:
            raise self.error("must be a finite non-negative number", f"{where}.{key}", key)
        return float(value)

    def task(self, task_id: str, task_class: str, requests: Any, where: str) -> Task:
        """The task made of `requests` (the list at JSON path `where`)."""
        if not isinstance(requests, list):
            raise self.error("must be a list of requests", where, "requests")
        if self.depth > MAX_DEPTH:
            raise self.error(f"sub-agents nested more than {MAX_DEPTH} deep", where, "requests")
        calls: list[Call] = []
        sent: list[float] = []
        subtasks: list[SubTask] = []
        waited_for: dict[int, float] = {}  # after_call -> longest waited sub-agent, in seconds
        last_t = 0.0
        for index, req in enumerate(requests):
            at = f"{where}[{index}]"
            try:
                if not isinstance(req, dict):
                    raise self.error("must be an object", at, None)
                t = self.seconds(req, "t", at, required=True)
                if t < last_t:
                    raise self.error("goes backwards (earlier than the request before)", f"{at}.t", "t")
                is_sub = req.get("type") == "subagent"
                if is_sub:
                    sub, duration = self.subagent(req, at, task_id, t, sent)
                else:
                    call = self.call(req, at, t, waited_for.get(len(calls) - 1, 0.0))
            except InputError as exc:
                self.policy.bad(exc)
                continue
            last_t = t
            if is_sub:
                subtasks.append(sub)
                if sub.wait:
                    waited_for[sub.after_call] = max(waited_for.get(sub.after_call, 0.0), duration)
            else:
                calls.append(call)
                sent.append(t)
        return Task(task_id, tuple(calls), 0.0, task_class, tuple(subtasks))

    def call(self, req: dict, at: str, t: float, waited: float) -> Call:
        inp = self.tokens(req, "in", at)
        out = self.tokens(req, "out", at)
        raw_ids = req.get("hash_ids")
        if not isinstance(raw_ids, list):
            what = "missing" if raw_ids is None else "must be a list of integers"
            raise self.error(what, f"{at}.hash_ids", "hash_ids")
        try:
            hash_ids = self.translate(raw_ids)
        except (ValueError, TypeError) as exc:
            raise self.error(str(exc), f"{at}.hash_ids", "hash_ids") from None
        think = self.seconds(req, "think_time", at) or 0.0
        api = self.seconds(req, "api_time", at)
        stop = req.get("stop")
        model = req.get("model")
        return Call(
            inp,
            out,
            round(max(0.0, think - waited), 6) if waited else think,
            hash_ids,
            self.block_size,
            api,
            t,
            stop if isinstance(stop, str) and stop else None,
            model if isinstance(model, str) else None,
        )

    def subagent(
        self, req: dict, at: str, parent_id: str, t: float, sent: list[float]
    ) -> tuple[SubTask, float]:
        """The sub-agent entry at `at` (which ended at `t`) and its duration in seconds."""
        agent_id = req.get("agent_id")
        if not isinstance(agent_id, str) or not agent_id:
            raise self.error("missing or not a string", f"{at}.agent_id", "agent_id")
        kind = req.get("subagent_type")
        self.depth += 1
        try:
            task = self.task(
                f"{parent_id}/{agent_id}",
                kind if isinstance(kind, str) and kind else SUBAGENT_CLASS,
                req.get("requests"),
                f"{at}.requests",
            )
        finally:
            self.depth -= 1
        if not task.calls:
            raise self.error("sub-agent has no usable requests", f"{at}.requests", "requests")
        duration_ms = self.seconds(req, "duration_ms", at)
        if duration_ms is not None:
            duration = duration_ms / 1000.0
        else:
            last = task.calls[-1]
            duration = (last.sent_at or 0.0) + (last.server_time or 0.0)
        start = max(0.0, t - duration)
        after = bisect_right(sent, start) - 1
        wait = all(s >= t for s in sent[after + 1 :])
        return SubTask(after, task, wait), duration


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
    provenance = (Provenance(name, FORMAT, {"block_size": block_size, "hash_id_scope": scope}),)
    if not task.calls:
        policy.bad(InputError("no usable requests", file=name, path="$.requests", field="requests"))
        return Workload((), provenance)
    return Workload((task,), provenance)
