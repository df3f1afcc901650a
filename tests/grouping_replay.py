"""What the task grouping's tests and benchmark share: replaying a workload on a simple clock as the recorder
would see it (each call's arrival and end, and its prompt as the recorder's chained 16-token block ids), feeding
it to a `TaskGrouper`, and scoring the tasks found against the true ones
(`benchmarks/recorder_grouping.py` describes the clock and the scores)."""

from __future__ import annotations

import dataclasses
import time
from typing import Optional

import numpy as np
from scipy.optimize import linear_sum_assignment

from simulator.hash_ids import common_prefix
from simulator.recorder.grouping import TaskGrouper
from simulator.workload import Call, SubTask, Task, Workload

BLOCK = 16
_MASK63 = (1 << 63) - 1
SYSTEM_ID, SUB_SYSTEM_ID = -1, -2
"""Content of the shared system prompts' blocks (workload ids are >= 0)."""


@dataclasses.dataclass
class Clock:
    """How long calls take and how late the client sends them."""

    ttft: float = 0.02
    prefill: float = float("inf")
    """Prompt tokens per second."""
    itl: float = 0.002
    lag: float = 0.002
    """Mean client lag of a send (exponential), seconds."""


@dataclasses.dataclass
class SentCall:
    send: float
    end: float
    top: str
    own: str
    ids: tuple


def with_system_prompt(workload: Workload, tokens: int) -> Workload:
    """Every top-level task's prompts start with one shared `tokens`-token prompt, every sub-agent's with another."""
    if tokens <= 0:
        return workload

    def call(c: Call, system: int) -> Call:
        bs = c.block_size or 64
        blocks = tokens // bs
        head = tuple(system * 10**9 - k for k in range(blocks))  # negative: no workload id is
        return dataclasses.replace(c, input_tokens=c.input_tokens + blocks * bs, block_size=bs,
                                   hash_ids=head + tuple(c.hash_ids))

    def task(t: Task, system: int) -> Task:
        subs = tuple(SubTask(s.after_call, task(s.task, SUB_SYSTEM_ID), s.wait) for s in t.subtasks)
        return dataclasses.replace(t, calls=tuple(call(c, system) for c in t.calls), subtasks=subs)

    return Workload(tuple(task(t, SYSTEM_ID) for t in workload.tasks), workload.provenance)


class PromptIds:
    """The recorder's chained 16-token block ids of a replayed call's prompt, reusing the ids a task's
    previous prompt already has."""

    def __init__(self) -> None:
        self._fresh = 0

    def of(self, call: Call, previous: Optional[tuple[Call, tuple]]) -> tuple:
        bs = call.block_size or BLOCK
        per = max(1, bs // BLOCK)
        full = call.input_tokens // BLOCK
        traced = min(len(call.hash_ids) * bs, call.input_tokens) // BLOCK
        ids: list[int] = []
        prev = 0
        if previous is not None and previous[0].block_size == call.block_size:
            pcall, pids = previous
            shared = common_prefix(call.hash_ids, pcall.hash_ids)
            ptraced = min(len(pcall.hash_ids) * bs, pcall.input_tokens) // BLOCK
            keep = min(shared * per, traced, ptraced)
            ids = list(pids[:keep])
            prev = ids[-1] if ids else 0
        hash_ids = call.hash_ids
        for k in range(len(ids), traced):
            prev = hash((prev, hash_ids[k // per], k % per)) & _MASK63
            ids.append(prev)
        self._fresh += 1
        for k in range(traced, full):
            prev = hash((prev, -self._fresh - 10, k)) & _MASK63
            ids.append(prev)
        return tuple(ids)


def replay(workload: Workload, clock: Clock, seed: int) -> list[SentCall]:
    """Every call of `workload` as the client sends it, with its prompt's block ids."""
    rng = np.random.default_rng(seed)
    ids = PromptIds()
    out: list[SentCall] = []

    def run(task: Task, start: float, top: str) -> float:
        spawns: dict[int, list[SubTask]] = {}
        for sub in task.subtasks:
            spawns.setdefault(sub.after_call, []).append(sub)

        def fork(at: float, subs: list[SubTask]) -> float:
            join = at
            for sub in subs:
                end = run(sub.task, at, top)
                if sub.wait:
                    join = max(join, end)
            return join

        t = fork(start, spawns[-1]) if -1 in spawns else start
        previous = None
        for index, call in enumerate(task.calls):
            send = t + call.gap + rng.exponential(clock.lag)
            took = (clock.ttft + call.input_tokens / clock.prefill + call.output_tokens * clock.itl) * rng.lognormal(0, 0.3)
            prompt = ids.of(call, previous)
            previous = (call, prompt)
            out.append(SentCall(send, send + took, top, task.id, prompt))
            t = send + took
            if index in spawns:
                t = fork(t, spawns[index])
        return t

    for task in workload.tasks:
        run(task, task.arrival, task.id)
    return out


def events(calls: list[SentCall]) -> list[tuple[float, int, int]]:
    """(time, 0 for an end / 1 for an arrival, call number), in time order (an end before an arrival at
    the same moment)."""
    evs = [(c.send, 1, i) for i, c in enumerate(calls)] + [(c.end, 0, i) for i, c in enumerate(calls)]
    evs.sort()
    return evs


@dataclasses.dataclass
class Grouped:
    own: list[str]
    """Found (sub-)task of each call."""
    top: list[str]
    """Found top-level task of each call, revisions applied."""
    us_per_call: float
    most_chains: int
    revisions: int


def group(calls: list[SentCall], evs: list[tuple[float, int, int]], keys: bool, close: bool = True,
          **settings: float) -> Grouped:
    """Feed the calls' arrivals and ends to a `TaskGrouper` (with each call's true top-level task as key,
    or no key)."""
    grouper = TaskGrouper(**settings)
    found: list[Optional[tuple[str, int]]] = [None] * len(calls)
    most = 0
    parent_of: dict[str, Optional[str]] = {}
    revised = 0
    place, end, revisions = grouper.place, grouper.end, grouper.revisions
    started = time.perf_counter()
    for t, kind, i in evs:
        call = calls[i]
        if kind:
            p = place(t, call.top if keys else None, call.ids)
            found[i] = (p.task, p.index)
            if p.index == 0:
                parent_of[p.task] = p.parent
            for r in revisions():
                parent_of[r.task] = r.parent
                revised += 1
        else:
            task, index = found[i]
            end(task, index, t, 0)
            if grouper.live_chains > most:
                most = grouper.live_chains
    if close:
        grouper.close()
        for r in revisions():
            parent_of[r.task] = r.parent
            revised += 1
    took = time.perf_counter() - started
    own = [f[0] for f in found]
    return Grouped(own, [_top(task, parent_of) for task in own], took / len(calls) * 1e6, most, revised)


def _top(task: str, parent_of: dict[str, Optional[str]]) -> str:
    """The top-level task of (sub-)task `task`, following the (revised) parents."""
    while parent_of.get(task) is not None:
        task = parent_of[task]
    return task


def matched_pairs(truth: list[str], found: list[str]) -> tuple[int, dict[str, str]]:
    """One-to-one matching of true and found labels maximising the calls they share: (calls of matched
    pairs, true label -> found label)."""
    t_names = sorted(set(truth))
    f_names = sorted(set(found))
    t_index = {n: i for i, n in enumerate(t_names)}
    f_index = {n: i for i, n in enumerate(f_names)}
    overlap = np.zeros((len(t_names), len(f_names)), dtype=np.int64)
    for a, b in zip(truth, found):
        overlap[t_index[a], f_index[b]] += 1
    rows, cols = linear_sum_assignment(overlap, maximize=True)
    pairs = {t_names[r]: f_names[c] for r, c in zip(rows, cols) if overlap[r, c] > 0}
    return int(overlap[rows, cols].sum()), pairs


def score(calls: list[SentCall], grouped: Grouped) -> dict[str, float]:
    """``right`` (share of calls in the right top-level task), ``subs`` (true sub-tasks), ``found``,
    ``made`` (found sub-tasks), ``wrong`` (see the module docstring)."""
    true_top = [c.top for c in calls]
    found, found_top = grouped.own, grouped.top
    right, tops = matched_pairs(true_top, found_top)
    subs_true = {c.own for c in calls if c.own != c.top}
    subs_found = {f for f, top in zip(found, found_top) if f != top}
    by_top: dict[str, list[int]] = {}
    for i, c in enumerate(calls):
        by_top.setdefault(c.top, []).append(i)
    size_true: dict[str, int] = {}
    size_found: dict[str, int] = {}
    for c, f in zip(calls, found):
        size_true[c.own] = size_true.get(c.own, 0) + 1
        size_found[f] = size_found.get(f, 0) + 1
    hit = made_right = 0
    for top, rows in by_top.items():
        if top not in tops:
            continue
        inside = [i for i in rows if found_top[i] == tops[top]]
        _, pairs = matched_pairs([calls[i].own for i in inside], [found[i] for i in inside])
        shared: dict[tuple[str, str], int] = {}
        for i in inside:
            key = (calls[i].own, found[i])
            shared[key] = shared.get(key, 0) + 1
        for own, f in pairs.items():
            n = shared.get((own, f), 0)
            if own in subs_true and f in subs_found:
                hit += 2 * n > size_true[own]
                made_right += 2 * n > size_found[f]
    return {"right": right / len(calls), "subs": len(subs_true), "found": hit,
            "made": len(subs_found), "wrong": len(subs_found) - made_right}
