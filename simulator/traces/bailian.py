"""Alibaba Bailian usage traces (alibaba-edu/qwen-bailian-usagetraces-anon): JSON Lines of requests.

One line is one request to a Qwen model on Alibaba Cloud Model Studio ("Bailian"):
``{"chat_id": 159, "parent_chat_id": 55, "timestamp": 61.114, "input_length": 521, "output_length": 132,
"type": "text", "turn": 2, "hash_ids": [...]}``. ``chat_id`` names the request, ``parent_chat_id`` the
request it follows (-1 for a conversation's first request), ``timestamp`` is its arrival in seconds from
the start of the file, ``hash_ids`` one salted hash per 16 tokens of its prompt (remapped to small
integers, so they mean something only within one file), ``type`` the kind of request (``text``,
``search``, ``image``, ``file``; the later files also ``api``, ``thinking``, ``coder``) and ``turn`` its
turn number in the conversation.

Tasks. The parent ids form trees. A request with no parent (or whose parent is not in the file, as in an
excerpt that starts in the middle of conversations) starts a task (id ``bailian-<chat_id>``, class its
``type``). A request's first child, by timestamp, is the task's next call. A request that already has a
child gets any later child as a sub-task (id ``<task id>/<chat_id>``, class its ``type``) that starts after
that request's call and that the task does not wait for: the format does not say why one request has two
children (a regenerated answer, an edited question, or requests sent side by side), and a branch is
what all of those look like to a server. A sub-task's own first child continues it the same way.

Timing. Only arrival times are recorded, not when a response ended, so a call's ``gap`` is the time
between its parent's arrival and its own: it includes the parent's service time (the import notes say
so). ``sent_at`` is the arrival from the (sub-)task's first request; a task's ``arrival`` is its first
request's timestamp minus the earliest timestamp of the file.

Hash ids are kept, block size 16, each file's ids moved into a namespace of their own
(`prefix.namespace` of the file's name): the published files number their blocks from 0 each, so two
files must not share blocks by accident. A call's ids share the previous call's where they repeat them.

Bad lines (missing fields, wrong types, negative numbers, a chat id seen twice, a request sent before its
parent, parent links that loop) raise an `InputError` naming the file, the line and the field; under the
skip policy the line is left out and counted (a request whose parent was left out starts a task).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

import orjson

from ..errors import ErrorPolicy, InputError
from ..hash_ids import BadHashId, HashIds, checked, common_prefix
from ..workload import MAX_DEPTH, MAX_SECONDS, MAX_TOKENS, Call, Provenance, SubTask, Task, Workload
from .prefix import LOCAL_ID_LIMIT, namespace

FORMAT = "bailian"
BLOCK_SIZE = 16
NO_PARENT = -1
_REQUIRED = ("chat_id", "parent_chat_id", "timestamp", "input_length", "output_length", "hash_ids")


def sniff(path: Path, head: bytes) -> bool:
    """True when the first line is a JSON object with Bailian's chat and parent chat ids and lengths."""
    first = head.lstrip().split(b"\n", 1)[0]
    if not first.startswith(b"{") or b'"parent_chat_id"' not in first or b'"chat_id"' not in first:
        return False
    try:
        obj = orjson.loads(first)
    except ValueError:
        return False
    return isinstance(obj, dict) and all(k in obj for k in _REQUIRED)


class _Request:
    """One validated line."""

    __slots__ = ("chat", "parent", "ts", "n_in", "n_out", "kind", "hashes", "line", "children")

    def __init__(self, chat: int, parent: int, ts: float, n_in: int, n_out: int, kind: str,
                 hashes: list, line: int) -> None:
        self.chat, self.parent, self.ts, self.n_in, self.n_out = chat, parent, ts, n_in, n_out
        self.kind, self.hashes, self.line = kind, hashes, line
        self.children: list[_Request] = []


def _whole(obj: dict, key: str, name: str, line: int, lowest: int, highest: int, what: str) -> int:
    value = obj[key]
    if type(value) is not int:
        raise InputError(f"expected a whole number ({what})", file=name, line=line, field=key)
    if value < lowest:
        raise InputError(f"negative {what}" if lowest == 0 else f"must be {lowest} or more", file=name, line=line,
                         field=key)
    if value > highest:
        raise InputError(f"more than {highest:,}", file=name, line=line, field=key)
    return value


def _parse(obj: Any, name: str, line: int) -> _Request:
    """A line's request, or an InputError naming the field."""
    if not isinstance(obj, dict):
        raise InputError("expected a JSON object", file=name, line=line)
    for key in _REQUIRED:
        if key not in obj:
            raise InputError("missing field", file=name, line=line, field=key)
    chat = _whole(obj, "chat_id", name, line, 0, 2**63 - 1, "chat id")
    parent = _whole(obj, "parent_chat_id", name, line, NO_PARENT, 2**63 - 1, "chat id")
    if parent == chat:
        raise InputError("a request cannot be its own parent", file=name, line=line, field="parent_chat_id")
    ts = obj["timestamp"]
    if type(ts) not in (int, float) or not math.isfinite(ts):
        raise InputError("expected a number of seconds", file=name, line=line, field="timestamp")
    if not 0 <= ts <= MAX_SECONDS:
        raise InputError(f"must be from 0 to {MAX_SECONDS:g} seconds", file=name, line=line, field="timestamp")
    n_in = _whole(obj, "input_length", name, line, 0, MAX_TOKENS, "token count")
    n_out = _whole(obj, "output_length", name, line, 0, MAX_TOKENS, "token count")
    kind = obj.get("type", "")
    if not isinstance(kind, str):
        raise InputError("expected a string", file=name, line=line, field="type")
    turn = obj.get("turn")
    if turn is not None and (type(turn) is not int or turn < 0):
        raise InputError("expected a whole number of turns", file=name, line=line, field="turn")
    hashes = obj["hash_ids"]
    what = f"expected a list of integer block ids from 0 to {LOCAL_ID_LIMIT - 1:,}"
    if type(hashes) is not list:
        raise InputError(what, file=name, line=line, field="hash_ids")
    try:
        if hashes and max(checked(hashes)) >= LOCAL_ID_LIMIT:
            raise BadHashId("an id is too large")
    except BadHashId as exc:
        raise InputError(f"{what}: {exc}", file=name, line=line, field="hash_ids") from None
    return _Request(chat, parent, float(ts), n_in, n_out, kind or FORMAT, hashes, line)


def _requests(path: Path, name: str, policy: ErrorPolicy) -> list[_Request]:
    """Every valid line, a chat id seen twice being bad input."""
    found: list[_Request] = []
    first_line: dict[int, int] = {}
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError:
                policy.bad(InputError("not JSON (truncated or malformed line)", file=name, line=number))
                continue
            try:
                req = _parse(obj, name, number)
                if req.chat in first_line:
                    raise InputError(f"chat id {req.chat} appears twice (first on line {first_line[req.chat]})",
                                     file=name, line=number, field="chat_id")
            except InputError as exc:
                policy.bad(exc)
                continue
            first_line[req.chat] = number
            found.append(req)
    return found


class _Builder:
    """Turns the parent links into tasks and sub-tasks (see the module docstring)."""

    def __init__(self, base: int, origin: float) -> None:
        self.base = base
        self.origin = origin
        self.subtasks = 0
        self.too_deep: list[tuple[_Request, tuple[list, HashIds]]] = []

    def ids(self, previous: tuple[list, HashIds], raw: list) -> tuple[list, HashIds]:
        """(raw ids, namespaced view) of `raw`, sharing `previous`'s view as far as the raw ids repeat."""
        last_raw, last = previous
        shared = common_prefix(raw, last_raw) if last_raw else 0
        base = self.base
        return raw, last.extend(shared, [base | h for h in raw[shared:]])

    def task(self, task_id: str, first: _Request, previous: tuple[list, HashIds], gap: float, depth: int) -> Task:
        """The (sub-)task whose chain starts at `first`, `gap` being its first call's and `depth` its nesting."""
        calls: list[Call] = []
        subtasks: list[SubTask] = []
        req: Optional[_Request] = first
        while req is not None:
            previous = self.ids(previous, req.hashes)
            # positional arguments: input, output, gap, hash_ids, block_size, server_time, sent_at
            calls.append(Call(req.n_in, req.n_out, round(gap, 6), previous[1] if req.hashes else (), BLOCK_SIZE,
                              None, round(req.ts - first.ts, 6)))
            for child in req.children[1:]:
                if depth >= MAX_DEPTH:
                    self.too_deep.append((child, previous))
                    continue
                self.subtasks += 1
                sub = self.task(f"{task_id}/{child.chat}", child, previous, child.ts - req.ts, depth + 1)
                subtasks.append(SubTask(len(calls) - 1, sub, wait=False))
            nxt = req.children[0] if req.children else None
            if nxt is not None:
                gap = nxt.ts - req.ts
            req = nxt
        return Task(task_id, tuple(calls), round(first.ts - self.origin, 6), first.kind, tuple(subtasks))


def _link(requests: list[_Request], name: str, policy: ErrorPolicy) -> tuple[list[_Request], int]:
    """Attach each request to its parent's children; (the requests that start tasks, how many of them name a
    parent that is not in the file). A request sent before its parent, or in a loop of parent links, is bad."""
    by_chat = {r.chat: r for r in requests}
    left_out: set[int] = set()
    for req in requests:
        parent = by_chat.get(req.parent)
        if parent is not None and req.ts < parent.ts:
            policy.bad(InputError(f"earlier than its parent chat {req.parent} (line {parent.line})", file=name,
                                  line=req.line, field="timestamp"))
            left_out.add(req.chat)
    kept = [r for r in requests if r.chat not in left_out]
    by_chat = {r.chat: r for r in kept}
    roots: list[_Request] = []
    orphans = 0
    for req in sorted(kept, key=lambda r: (r.ts, r.line)):
        parent = by_chat.get(req.parent)
        if parent is None:
            roots.append(req)
            orphans += req.parent != NO_PARENT
        else:
            parent.children.append(req)
    reached: set[int] = set()
    stack = list(roots)
    while stack:
        req = stack.pop()
        reached.add(req.chat)
        stack.extend(req.children)
    for req in kept:
        if req.chat not in reached:  # only a loop of equal timestamps gets here
            policy.bad(InputError("its parent chat ids lead back to itself (a loop of parent links)", file=name,
                                  line=req.line, field="parent_chat_id"))
    return roots, orphans


def read(path: Path, policy: ErrorPolicy) -> Workload:
    """Read a Bailian JSONL trace: parent chat ids become tasks, their turns and their branches."""
    path = Path(path)
    name = str(path)
    requests = _requests(path, name, policy)
    if not requests:
        raise InputError("no requests found", file=name)
    roots, orphans = _link(requests, name, policy)
    builder = _Builder(namespace(f"bailian:{path.name}"), min(r.ts for r in requests))
    empty = ([], HashIds.run(0, 0))
    tasks = [builder.task(f"{FORMAT}-{r.chat}", r, empty, 0.0, 0) for r in roots]
    too_deep = 0
    while builder.too_deep:  # branches nested deeper than a workload holds start tasks of their own
        child, previous = builder.too_deep.pop()
        too_deep += 1
        tasks.append(builder.task(f"{FORMAT}-{child.chat}", child, previous, 0.0, 0))
    calls = sum(1 for t in tasks for s in t.walk() for _ in s.calls)
    notes = [
        f"{calls} requests in {len(tasks)} tasks and {builder.subtasks} sub-tasks by parent chat id; a request's "
        "first child continues its task, a later child starts a sub-task the task does not wait for",
        "Bailian records arrival times only: each gap is the time between a request's arrival and its parent's, "
        "so it includes the parent's service time",
    ]
    if orphans:
        notes.append(f"{orphans} requests name a parent chat that is not in the file: each starts a task")
    if too_deep:
        notes.append(f"{too_deep} branches nested more than {MAX_DEPTH} deep start tasks of their own")
    options = {"block_size": BLOCK_SIZE, "on_error": policy.on_error}
    return Workload(tuple(tasks), (Provenance(name, FORMAT, options, tuple(notes)),))
