"""Mooncake traces (kvcache-ai/Mooncake, FAST'25 release): JSON Lines of requests with 512-token block hashes.

One line is one request: ``{"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [...]}``.
The trace has no session ids, so multi-turn conversations are rebuilt from shared leading hash chains.

Joining rule. A request's *key* is the chain of its *full* blocks, ``hash_ids[:input_length // 512]``: the
last block of a prompt is nearly always partial, and the next turn, whose prompt goes on past it, hashes
that block again with more tokens in it, so the next turn shares every block but that one. A later request
B continues an earlier request A when A's key is a proper prefix of B's chain, the key has at least
`MIN_JOIN_BLOCKS` blocks, and B's prompt is longer than A's (an equal or shorter prompt is a retry or a
new question on the same document, not the next turn). When several earlier keys fit, the longest wins.
The first block alone never joins: in the Mooncake traces every request starts with the same block (the
system prompt), so one shared block says nothing about the conversation.

Each request is continued at most once: B joins A's task only while A is that task's latest call. A
request that extends an already-continued one (a regenerated or edited turn, a branch) starts a new task;
its hash ids still share the prefix, so the prefix cache sees the reuse either way.

Timing. Only send times are known, so a call's ``gap`` is the time between its send and the previous
call's send: it includes the previous call's service time (the provenance notes say so). ``sent_at`` is
the send time from the task's first request; ``arrival`` is the task's first send from the file's first.
"""

from __future__ import annotations

import math
from pathlib import Path

import orjson

from ..errors import ErrorPolicy, InputError
from ..hash_ids import BadHashId, HashIds, checked, common_prefix
from ..workload import MAX_SECONDS, MAX_TOKENS, Call, Provenance, Task, Workload

FORMAT = "mooncake"
BLOCK_SIZE = 512
MIN_JOIN_BLOCKS = 2
"""Fewest full blocks an earlier request's key needs to be continued (see the module docstring)."""
MAX_CANDIDATES = 8
"""Earlier keys compared in full per request, at most: caps the work when many keys share block ids."""
_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
_NUMBER = (int, float)


def sniff(path: Path, head: bytes) -> bool:
    """True when the first line is a JSON object with the four Mooncake fields."""
    first = head.lstrip().split(b"\n", 1)[0]
    try:
        obj = orjson.loads(first)
    except ValueError:
        return False
    return isinstance(obj, dict) and all(k in obj for k in _FIELDS)


def _parse(obj: object, name: str, number: int) -> tuple[float, int, int, tuple[int, ...]]:
    """(timestamp ms, input, output, hash ids) of one line, or InputError naming the field."""
    if not isinstance(obj, dict):
        raise InputError("expected a JSON object", file=name, line=number)
    for key in _FIELDS:
        if key not in obj:
            raise InputError("missing field", file=name, line=number, field=key)
    ts = obj["timestamp"]
    if type(ts) not in _NUMBER or not math.isfinite(ts):
        raise InputError("expected a number of milliseconds", file=name, line=number, field="timestamp")
    for key in ("input_length", "output_length"):
        value = obj[key]
        if type(value) is not int:
            raise InputError("expected a whole number of tokens", file=name, line=number, field=key)
        if value < 0:
            raise InputError("negative token count", file=name, line=number, field=key)
        if value > MAX_TOKENS:
            raise InputError(f"more than the {MAX_TOKENS:,} tokens a call may have", file=name, line=number, field=key)
    hashes = obj["hash_ids"]
    if type(hashes) is not list:
        raise InputError("expected a list of integer block ids", file=name, line=number, field="hash_ids")
    try:
        checked(hashes)
    except BadHashId as exc:
        raise InputError(f"expected a list of integer block ids: {exc}", file=name, line=number,
                         field="hash_ids") from None
    return ts, obj["input_length"], obj["output_length"], tuple(hashes)


class _Sessions:
    """Assigns each request to a task by the joining rule of the module docstring."""

    def __init__(self) -> None:
        # last block id of an open key -> the latest request with that key. With Mooncake's ids (a block id
        # stands for its whole prefix) equal last ids mean equal keys, so keeping the latest loses nothing.
        self.open: dict[int, int] = {}
        self.info: list[tuple[tuple[int, ...], int, int]] = []  # per request: (key, input length, task)
        self.continued: set[int] = set()
        self.tasks: list[list[int]] = []
        self.branches = 0

    def add(self, input_length: int, hashes: tuple[int, ...]) -> None:
        """Place the next request: continue an earlier one's task or start a new task."""
        number = len(self.info)
        common = self.open.keys() & hashes  # set intersection in C: open keys ending at one of our blocks
        parent = self._parent(common, input_length, hashes) if common else None
        if parent is None:
            task = len(self.tasks)
            self.tasks.append([number])
        else:
            self.continued.add(parent)
            task = self.info[parent][2]
            self.tasks[task].append(number)
        key = hashes[: input_length // BLOCK_SIZE]
        self.info.append((key, input_length, task))
        if len(key) >= MIN_JOIN_BLOCKS:
            self.open[key[-1]] = number

    def _parent(self, common: set[int], input_length: int, hashes: tuple[int, ...]) -> int | None:
        """The earlier request this one continues, or None (a new task)."""
        open_, info = self.open, self.info
        if len(common) == 1:
            cand = open_[common.pop()]
            found = [(len(info[cand][0]), cand)]
        else:
            found = sorted(((len(info[open_[last]][0]), open_[last]) for last in common), reverse=True)
        for k, cand in found[:MAX_CANDIDATES]:  # longest keys first
            key, length, _ = info[cand]
            if k < len(hashes) and length < input_length and hashes[:k] == key:
                if cand in self.continued:
                    self.branches += 1
                    return None
                return cand
        return None


def read(path: Path, policy: ErrorPolicy) -> Workload:
    """Read a Mooncake JSONL trace, rebuilding multi-turn sessions from shared hash chains."""
    name = str(path)
    records: list[tuple[float, int, int, tuple[int, ...]]] = []
    sessions = _Sessions()
    add = sessions.add
    last_ts = -math.inf
    loads = orjson.loads
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            try:
                obj = loads(raw)
                # fast path for well-formed lines; anything odd goes through _parse for a precise error
                ts, n_in, n_out, hashes = obj["timestamp"], obj["input_length"], obj["output_length"], obj["hash_ids"]
                if not (type(n_in) is int and 0 <= n_in <= MAX_TOKENS and type(n_out) is int and 0 <= n_out <= MAX_TOKENS
                        and type(ts) in _NUMBER and type(hashes) is list):
                    raise TypeError
                checked(hashes)
                hashes = tuple(hashes)
            except orjson.JSONDecodeError:
                if raw.strip():
                    policy.bad(InputError("not JSON (truncated or malformed line)", file=name, line=number))
                continue
            except (KeyError, TypeError, ValueError):
                try:
                    ts, n_in, n_out, hashes = _parse(obj, name, number)
                except InputError as exc:
                    policy.bad(exc)
                    continue
            if ts < last_ts:
                policy.bad(InputError("goes backwards: earlier than the line before it", file=name, line=number,
                                      field="timestamp"))
                continue
            if records and ts - records[0][0] > MAX_SECONDS * 1000:
                policy.bad(InputError(f"more than {MAX_SECONDS:g} s after the first line", file=name, line=number,
                                      field="timestamp"))
                continue
            last_ts = ts
            records.append((ts, n_in, n_out, hashes))
            add(n_in, hashes)
    if not records:
        raise InputError("no requests found", file=name)
    tasks = _tasks(sessions.tasks, records)
    joined = [members for members in sessions.tasks if len(members) > 1]
    notes = [
        f"joined {sum(map(len, joined))} of {len(records)} requests into {len(joined)} multi-turn sessions "
        f"by shared leading hash chains (key = full {BLOCK_SIZE}-token blocks, at least {MIN_JOIN_BLOCKS})",
        "Mooncake records send times only: each gap is the time between two sends of a session, so it "
        "includes the previous call's service time",
    ]
    if sessions.branches:
        notes.append(f"{sessions.branches} requests extended an already-continued request and started new tasks")
    options = {"block_size": BLOCK_SIZE, "min_join_blocks": MIN_JOIN_BLOCKS, "on_error": policy.on_error}
    return Workload(tuple(tasks), (Provenance(name, FORMAT, options, tuple(notes)),))


def _tasks(groups: list[list[int]], records: list[tuple[float, int, int, tuple[int, ...]]]) -> list[Task]:
    t0 = records[0][0]
    tasks = []
    for number, members in enumerate(groups):
        first = previous = records[members[0]][0]
        calls = []
        ids: HashIds = HashIds.run(0, 0)
        for r in members:
            ts, n_in, n_out, hashes = records[r]
            # a turn repeats the previous turn's blocks: its ids share the previous call's (simulator.hash_ids)
            shared = common_prefix(ids, hashes)
            ids = ids.extend(shared, hashes[shared:])
            # positional arguments: input, output, gap, hash_ids, block_size, server_time, sent_at
            calls.append(Call(n_in, n_out, (ts - previous) / 1000.0, ids if ids else (), BLOCK_SIZE, None,
                              (ts - first) / 1000.0))
            previous = ts
        tasks.append(Task(f"mooncake-{number:06d}", tuple(calls), (first - t0) / 1000.0))
    return tasks
