"""Generate a synthetic `Workload` from a `WorkloadModel`.

A SimPy model runs the arrivals: one arrival process per task class waits out its class's
inter-arrival times (drawn from the class's fitted process) and starts a task process at each arrival;
the order in which task processes start, over all classes, is the workload's task order. What a task
contains (its calls, gaps, prefixes and sub-agents) is drawn vectorised with numpy across all the tasks
of its class and taken by its task process: one SimPy event per call would cost more than everything
else together (about 2 us a call), while one process per task costs about 2 us a task.

Prompts carry hash ids that grow turn by turn: a call's ids are the reused leading part of the
previous call's ids plus fresh ids, so a prefix cache sees the modelled reuse; fresh ids come from one
counter and are unique across the workload. One seed gives one workload, bit for bit.

`write_generated` writes the same workload straight to a native file, each call with only its fresh
ids after a `hash_keep`, so it never builds the whole id tuples that a `Workload` holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterator, NamedTuple, Optional

import numpy as np
import orjson
import simpy

from ..errors import InputError
from ..gcpause import gc_paused
from ..traces import native
from ..workload import DEFAULT_CLASS, Call, Provenance, SubTask, Task, Workload
from .arrivals import GammaRenewal, gamma_renewal
from .fit import START, UNKNOWN
from .schema import Cell, Structure, WorkloadModel

SUBAGENT_CLASS = "subagent"
_MAX_DEPTH = 3
"""Sub-agents of sub-agents nest at most this deep (sub-tasks at this depth start none)."""
_DIRECT_WRITE = 1 << 16
"""Native lines at least this long (bytes) are written on their own rather than joined into a batch."""


@dataclass
class _Drawn:
    """The calls of a batch of tasks as columns (one entry per call, tasks contiguous): Python lists
    for the values that end up in every call, numpy arrays for the bookkeeping."""

    offsets: np.ndarray  # first row of each task, plus the total at the end
    input: list[int]
    output: list[int]
    gap: list[float]
    stops: list[Optional[str]]
    keep: list[int]  # leading ids kept from the previous call's (its `hash_keep` on the wire)
    fresh: list[int]  # new ids after those
    local: np.ndarray  # first new id of each call, counted from its task's first new id
    own_fresh: np.ndarray  # per task: new ids of its own calls
    tree_fresh: np.ndarray  # per task: new ids of its calls and of all its sub-tasks'
    block_size: int
    # Sub-tasks, one entry each, grouped by owner in task order (siblings in spawn order).
    sub_owner: np.ndarray
    sub_after: list[int]
    sub_wait: list[bool]
    sub: Optional["_Drawn"]


def _stop_chain(structure: Structure, ncalls: np.ndarray, offsets: np.ndarray, rng: np.random.Generator):
    """Stop-reason codes per call (a Markov chain per task, drawn position by position across tasks)."""
    st = structure.stops
    labels = sorted(set(st.first) | set(st.after) | {k for row in st.after.values() for k in row})
    code = {label: i for i, label in enumerate(labels)}
    first = np.zeros(len(labels))
    for k, p in st.first.items():
        first[code[k]] = p
    marginal = first.copy()
    for row in st.after.values():
        for k, p in row.items():
            marginal[code[k]] += p
    marginal /= marginal.sum()
    trans = np.tile(marginal, (len(labels), 1))
    for prev, row in st.after.items():
        trans[code[prev]] = 0.0
        for k, p in row.items():
            trans[code[prev], code[k]] = p
    cum_first = np.cumsum(first)
    cum_trans = np.cumsum(trans, axis=1)
    total = int(offsets[-1])
    stops = np.zeros(total, dtype=np.int64)
    alive = np.arange(len(ncalls))
    for k in range(int(ncalls.max(initial=0))):
        alive = alive[ncalls[alive] > k]
        rows = offsets[alive] + k
        u = rng.random(len(rows))
        if k == 0:
            stops[rows] = np.minimum(np.searchsorted(cum_first, u, side="right"), len(labels) - 1)
        else:
            prev = stops[rows - 1]
            stops[rows] = np.minimum((u[:, None] >= cum_trans[prev]).sum(axis=1), len(labels) - 1)
    return stops, labels


def _cell_index(structure: Structure) -> dict[tuple[Optional[int], Optional[int], Optional[str]], Cell]:
    return {(c.task_length, c.from_call, c.after_stop): c for c in structure.cells}


def _lookup(cells, length: int, bucket: int, prev: str) -> Cell:
    """The most specific cell. The previous stop reason comes first (it decides whether a gap is tool
    time or human think time), then the task's own length class before any length, then the position:
    (length, position, stop), (length, stop), (any length, position, stop), (stop); then the same
    without the stop reason. A first call only ever takes a first-call cell."""
    if prev == START:
        keys: tuple = ((length, 0, START), (None, 0, START))
    else:
        keys = ((length, bucket, prev), (length, None, prev), (None, bucket, prev), (None, None, prev),
                (length, bucket, None), (length, None, None), (None, bucket, None), (None, None, None))
    for key in keys:
        if key in cells:
            return cells[key]
    raise InputError(f"the model has no cell for calls from index {bucket} after {prev!r} (and no catch-all cell)")


def _buckets_of(buckets: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Start of the bucket holding each value (`fit.bucket_of`, vectorised; values are at least
    `buckets[0]`)."""
    return buckets[np.searchsorted(buckets, values, side="right") - 1]


def _cell_draws(structure: Structure, ncalls: np.ndarray, position: np.ndarray, prev_code: np.ndarray,
                labels: list[str], rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per call: appended tokens, output tokens and the gap before it, from the cell `_lookup` picks for
    its task's length class, its position bucket and the previous call's stop reason (`prev_code`: an
    index into `labels`, -1 for a first call). Drawn cell by cell, in the order of their keys."""
    total = len(position)
    appended = np.zeros(total)
    output = np.zeros(total)
    gap = np.zeros(total)
    cells = _cell_index(structure)
    buckets = np.asarray(structure.position_buckets)
    bucket = _buckets_of(buckets, position)
    length = np.repeat(_buckets_of(np.asarray(structure.length_buckets), ncalls), ncalls)
    # One integer per (length class, position bucket, previous stop), to group the calls by.
    width = int(buckets.max()) + 1
    stride = len(labels) + 1
    key = (length * width + bucket) * stride + (prev_code + 1)
    uniq, inverse = np.unique(key, return_inverse=True)
    for j, k in enumerate(uniq.tolist()):
        rows = np.flatnonzero(inverse == j)
        lb, p = divmod(k, stride)
        ln, b = divmod(lb, width)
        cell = _lookup(cells, int(ln), int(b), START if p == 0 else labels[p - 1])
        appended[rows] = cell.appended.sample(rng, len(rows))
        output[rows] = cell.output.sample(rng, len(rows))
        gap[rows] = cell.gap.sample(rng, len(rows))
    return appended, output, gap


class _ReuseDraws(NamedTuple):
    """Per call, what `_reuse_draws` drew."""

    fraction: np.ndarray
    """Fraction of the previous prompt's blocks a partial reuse keeps."""
    appended: np.ndarray
    """Tokens a partial reuse appends."""
    full: np.ndarray
    """Whether the call keeps the whole previous prompt (and appends its cell's draw)."""


def _reuse_draws(structure: Structure, prev_code: np.ndarray, labels: list[str], appended: np.ndarray,
                 rng: np.random.Generator) -> _ReuseDraws:
    """Per call: the fraction of the previous prompt's blocks kept by a partial reuse, the tokens it
    appends, and whether the whole previous prompt is kept; by the previous stop reason where the
    model has a row for it (`reuse.after_stop`), else pooled. The kept fraction and the appended
    tokens are drawn as one recorded pair where the model has `partial_pairs`, else each from its own
    distribution (where the model has neither, a partial reuse appends the call's `appended`)."""
    reuse = structure.reuse
    total = len(prev_code)
    full_p = np.full(total, reuse.full_prob)
    overrides = []
    for label, row in sorted(reuse.after_stop.items()):
        if label in labels:
            rows = np.flatnonzero(prev_code == labels.index(label))
            full_p[rows] = row.full_prob
            overrides.append((rows, row))
    full = rng.random(total) < full_p
    frac = np.zeros(total)
    part_app = appended.copy()
    _partial_into(reuse, np.arange(total), frac, part_app, rng)
    for rows, row in overrides:
        _partial_into(row, rows, frac, part_app, rng)
    return _ReuseDraws(frac, part_app, full)


def _partial_into(source, rows: np.ndarray, frac: np.ndarray, part_app: np.ndarray, rng: np.random.Generator) -> None:
    """Write `source`'s partial-reuse draws (a `Reuse` or a `StopReuse`) for `rows` into `frac` and
    `part_app`: jointly, through its recorded pairs, when it has them; else from whichever of its two
    distributions it has (what it lacks stays as drawn for the pooled rows)."""
    if source.partial_pairs is not None:
        kept, app = source.partial_pairs.sample(rng, len(rows), source.partial_fraction, source.partial_appended)
        frac[rows], part_app[rows] = np.clip(kept, 0.0, 1.0), app
        return
    if source.partial_fraction is not None:
        frac[rows] = np.clip(source.partial_fraction.sample(rng, len(rows)), 0.0, 1.0)
    if source.partial_appended is not None:
        part_app[rows] = source.partial_appended.sample(rng, len(rows))


def _peak_growth(structure: Structure, ncalls: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Per task, the multiple of its first prompt its prompt may grow to (at least 1), from the model's
    `peak_growth` for its length class; infinite where the model has none."""
    growth = np.full(len(ncalls), np.inf)
    if structure.peak_growth:
        task_length = _buckets_of(np.asarray(structure.length_buckets), ncalls)
        for ln in np.unique(task_length).tolist():
            dist = structure.peak_growth.get(ln, structure.peak_growth.get(0))
            if dist is not None:
                these = np.flatnonzero(task_length == ln)
                growth[these] = np.maximum(dist.sample(rng, len(these)), 1.0)
    return growth


def _prompt_sizes(structure: Structure, ncalls: np.ndarray, offsets: np.ndarray, appended: np.ndarray,
                  reuse: _ReuseDraws, growth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per call: its input tokens and the blocks of the previous call's prompt it starts with (no
    random draws). A first call's prompt is its `appended` tokens, and sets its task's peak (`growth`
    times it, within the context limit); a later call keeps the whole previous prompt or, on a partial
    reuse, the drawn fraction of its blocks, and appends its tokens. Computed position by position
    across tasks, since each prompt builds on the previous one."""
    bs = structure.block_size
    n = len(ncalls)
    limit_of = np.full(n, structure.context_limit, dtype=np.int64)
    inputs = np.zeros(int(offsets[-1]), dtype=np.int64)
    shared = np.zeros(int(offsets[-1]), dtype=np.int64)
    alive = np.arange(n)
    for k in range(int(ncalls.max(initial=0))):
        alive = alive[ncalls[alive] > k]
        rows = offsets[alive] + k
        limit = limit_of[alive]
        if k == 0:
            inputs[rows] = np.clip(appended[rows], 1, structure.context_limit)
            peak = np.minimum(inputs[rows] * growth[alive], structure.context_limit)
            limit_of[alive] = np.maximum(peak, inputs[rows]).astype(np.int64)
            continue
        prev_blocks = inputs[rows - 1] // bs
        is_full = reuse.full[rows]
        sh = np.where(is_full, prev_blocks, np.floor(reuse.fraction[rows] * prev_blocks).astype(np.int64))
        add = np.minimum(np.where(is_full, appended[rows], reuse.appended[rows]), structure.context_limit).astype(np.int64)
        inp = sh * bs + add
        # A turn that would pass the task's peak keeps only the head of the previous prompt that
        # leaves room for what it appends (a partial reuse): the prompt stays near its peak, the
        # appended tokens stay as drawn.
        over = inp > limit
        if over.any():
            room = np.maximum(limit - add, 0) // bs
            sh = np.where(over, np.minimum(sh, room), sh)
            inp = np.where(over, sh * bs + add, inp)
        shared[rows] = sh
        inputs[rows] = np.maximum(inp, 1)
    return inputs, shared


class _Spawned(NamedTuple):
    """Sub-tasks drawn for a batch of tasks: per sub-task, grouped by owner in task order (siblings in
    spawn order), its owner task, the call it follows and whether its owner waits for it."""

    drawn: Optional["_Drawn"]
    owner: np.ndarray
    after: np.ndarray
    wait: np.ndarray


def _subtasks(structure: Structure, ncalls: np.ndarray, offsets: np.ndarray, position: np.ndarray,
              rng: np.random.Generator, depth: int) -> _Spawned:
    """The sub-tasks the tasks start: after each call but its task's last, a group of `fan_out`
    sub-tasks with the model's `spawn_prob`; all of them drawn as one batch (none at `_MAX_DEPTH`)."""
    none = _Spawned(None, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool))
    sa = structure.subagents
    if sa is None or sa.spawn_prob <= 0 or depth >= _MAX_DEPTH:
        return none
    not_last = position < np.repeat(ncalls, ncalls) - 1
    spawn_rows = np.flatnonzero((rng.random(len(position)) < sa.spawn_prob) & not_last)
    if not len(spawn_rows):
        return none
    fan = np.maximum(1, sa.fan_out.sample(rng, len(spawn_rows)).astype(np.int64))
    count = int(fan.sum())
    waits = rng.random(count) < sa.wait_prob
    owner = np.searchsorted(offsets, spawn_rows, side="right") - 1
    return _Spawned(_draw(sa.structure, count, rng, depth + 1), np.repeat(owner, fan),
                    np.repeat(spawn_rows - offsets[owner], fan), waits)


def _kept_and_fresh(inputs: np.ndarray, shared: np.ndarray, position: np.ndarray,
                    bs: int) -> tuple[np.ndarray, np.ndarray]:
    """Per call: the leading hash ids it keeps of the previous call's (the blocks it shares, never more
    than either prompt has) and its fresh ids after them; a prompt has input // `bs` blocks."""
    blocks = inputs // bs
    prev_blocks = np.concatenate([[0], blocks[:-1]])
    keep = np.where(position == 0, 0, np.minimum(shared, np.minimum(prev_blocks, blocks)))
    return keep, blocks - keep


def _fresh_counts(fresh: np.ndarray, offsets: np.ndarray, ncalls: np.ndarray,
                  spawned: _Spawned) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`_Drawn`'s `local`, `own_fresh` and `tree_fresh` from each call's number of fresh ids."""
    total = len(fresh)
    before = np.cumsum(fresh) - fresh
    starts = offsets[:-1]
    local = before - np.repeat(before[starts], ncalls) if total else before
    own = np.add.reduceat(fresh, starts) if total else np.zeros(0, dtype=np.int64)
    tree = own.copy()
    if spawned.drawn is not None:
        np.add.at(tree, spawned.owner, spawned.drawn.tree_fresh)
    return local, own, tree


def _draw(structure: Structure, n: int, rng: np.random.Generator, depth: int = 0) -> _Drawn:
    """Draw `n` tasks' calls with their stop reasons, sizes, gaps, prefix reuse and sub-agents.

    The random draws come in a fixed order, which keeps a seed's workload the same: calls per task,
    stop reasons, per-cell sizes and gaps, prefix reuse, first prompts, peak growth, sub-tasks."""
    ncalls = np.maximum(1, structure.calls_per_task.sample(rng, n).astype(np.int64))
    offsets = np.concatenate([[0], np.cumsum(ncalls)]).astype(np.int64)
    position = np.arange(int(offsets[-1])) - np.repeat(offsets[:-1], ncalls)
    stops, labels = _stop_chain(structure, ncalls, offsets, rng)
    prev_code = np.where(position == 0, -1, np.concatenate([[0], stops[:-1]]))
    appended, output, gap = _cell_draws(structure, ncalls, position, prev_code, labels, rng)
    reuse = _reuse_draws(structure, prev_code, labels, appended, rng)
    if structure.starts is not None:
        appended[offsets[:-1]] = structure.starts.sample(rng, ncalls)
    growth = _peak_growth(structure, ncalls, rng)
    inputs, shared = _prompt_sizes(structure, ncalls, offsets, appended, reuse, growth)
    spawned = _subtasks(structure, ncalls, offsets, position, rng, depth)
    keep, fresh = _kept_and_fresh(inputs, shared, position, structure.block_size)
    local, own, tree = _fresh_counts(fresh, offsets, ncalls, spawned)

    stop_names = [None if s == UNKNOWN else s for s in labels]
    return _Drawn(
        offsets=offsets,
        input=inputs.tolist(),
        output=np.maximum(output, 0).astype(np.int64).tolist(),
        gap=np.maximum(gap, 0.0).tolist(),
        stops=[stop_names[s] for s in stops.tolist()],
        keep=keep.tolist(),
        fresh=fresh.tolist(),
        local=local,
        own_fresh=own,
        tree_fresh=tree,
        block_size=structure.block_size,
        sub_owner=spawned.owner,
        sub_after=spawned.after.tolist(),
        sub_wait=spawned.wait.tolist(),
        sub=spawned.drawn,
    )


def _calls(drawn: _Drawn, lo: int, hi: int, first: list[int]) -> list[Call]:
    """Calls of rows lo..hi; `first`: each call's first fresh id. A task's first call keeps nothing,
    which starts its chain afresh."""
    bs = drawn.block_size
    calls = []
    chain: tuple[int, ...] = ()
    for inp, out, gp, stop, k, f, s in zip(
        drawn.input[lo:hi], drawn.output[lo:hi], drawn.gap[lo:hi], drawn.stops[lo:hi],
        drawn.keep[lo:hi], drawn.fresh[lo:hi], first,
    ):
        if k < len(chain):
            chain = chain[:k]
        if f:
            chain += tuple(range(s, s + f))
        calls.append(Call(inp, out, gp, chain, bs, None, None, stop))
    return calls


def _call_records(drawn: _Drawn, lo: int, hi: int, first: np.ndarray, pool: np.ndarray) -> list[dict]:
    """What `native.write` writes for the calls `_calls` builds (a test checks they match), without
    their whole id tuples: each call has only its `hash_keep` and its fresh ids, as a view into
    `pool` (consecutive ids from `pool[0]` on; orjson writes numpy arrays without Python ints).
    `first`: each call's first fresh id. Keys are in `native.write`'s order; the usual later call,
    which has every key, is built as one literal."""
    bs = drawn.block_size
    keep_key = native.KEEP_KEY
    start = first - (int(pool[0]) if len(pool) else 0)
    fresh = drawn.fresh[lo:hi]
    calls = []
    append = calls.append
    for inp, out, gp, stop, k, f, s, e in zip(
        drawn.input[lo:hi], drawn.output[lo:hi], drawn.gap[lo:hi], drawn.stops[lo:hi],
        drawn.keep[lo:hi], fresh, start.tolist(), (start + np.asarray(fresh, dtype=np.int64)).tolist(),
    ):
        if gp and k and f and bs and stop is not None:
            append({"input_tokens": inp, "output_tokens": out, "gap": gp, keep_key: k, "hash_ids": pool[s:e],
                    "block_size": bs, "stop_reason": stop})
            continue
        rec: dict = {"input_tokens": inp, "output_tokens": out}
        if gp:
            rec["gap"] = gp
        if k:
            rec[keep_key] = k
        if f:
            rec["hash_ids"] = pool[s:e]
        if bs:
            rec["block_size"] = bs
        if stop is not None:
            rec["stop_reason"] = stop
        append(rec)
    return calls


def _materialise(drawn: _Drawn, t0: int, t1: int, ids: list[str], bases: np.ndarray, task_class: str,
                 arrivals: Optional[list[float]], pool: Optional[np.ndarray]) -> list:
    """Tasks t0..t1 of `drawn` (with their sub-tasks) as `Task`s, or as native-file records when
    given the `pool` of their fresh ids; `ids`, `bases` (first fresh hash id) and `arrivals` are per task."""
    records = pool is not None
    offsets = drawn.offsets
    lo, hi = int(offsets[t0]), int(offsets[t1])
    first = np.repeat(bases, np.diff(offsets[t0:t1 + 1])) + drawn.local[lo:hi]
    calls = _calls(drawn, lo, hi, first.tolist()) if pool is None else _call_records(drawn, lo, hi, first, pool)

    subs: list[list] = [[]] * (t1 - t0)  # replaced by a list of its own where a task has sub-tasks
    if drawn.sub is not None:
        j0, j1 = np.searchsorted(drawn.sub_owner, [t0, t1]).tolist()
        if j1 > j0:
            owner = drawn.sub_owner[j0:j1]
            sub_tree = drawn.sub.tree_fresh[j0:j1]
            group = np.flatnonzero(np.concatenate([[True], owner[1:] != owner[:-1]]))  # first sibling
            sizes = np.diff(np.append(group, j1 - j0))
            nth = np.arange(j1 - j0) - np.repeat(group, sizes)
            # A sub-task's fresh ids follow those of its parent's own calls and its elder siblings'.
            before = np.cumsum(sub_tree) - sub_tree
            sub_bases = bases[owner - t0] + drawn.own_fresh[owner] + before - np.repeat(before[group], sizes)
            rel = (owner - t0).tolist()
            sub_ids = [f"{ids[o]}.sub{n}" for o, n in zip(rel, nth.tolist())]
            built = _materialise(drawn.sub, j0, j1, sub_ids, sub_bases, SUBAGENT_CLASS, None, pool)
            for o, after, wait, task in zip(rel, drawn.sub_after[j0:j1], drawn.sub_wait[j0:j1], built):
                if records:
                    entry: Any = {"after_call": after, "task": task}
                    if not wait:
                        entry["wait"] = False
                else:
                    entry = SubTask(after, task, wait)
                if not subs[o]:
                    subs[o] = []
                subs[o].append(entry)

    out = []
    starts = (offsets[t0:t1 + 1] - lo).tolist()
    zero = [0.0] * (t1 - t0)
    for tid, a, b, arrival, sub in zip(ids, starts, starts[1:], arrivals or zero, subs):
        if records:
            rec: dict = {"id": tid, "calls": calls[a:b]}
            if arrival:
                rec["arrival"] = arrival
            if task_class != DEFAULT_CLASS:
                rec["task_class"] = task_class
            if sub:
                rec["subtasks"] = sub
            out.append(rec)
        else:
            out.append(Task(tid, tuple(calls[a:b]), arrival, task_class, tuple(sub)))
    return out


def _counts(drawn: Optional[_Drawn]) -> tuple[int, int]:
    """(calls, sub-tasks) of every task drawn here and below."""
    if drawn is None:
        return 0, 0
    calls, subs = _counts(drawn.sub)
    return calls + int(drawn.offsets[-1]), subs + len(drawn.sub_after)


@dataclass
class _Plan:
    """Everything drawn for one workload, and the order its tasks are materialised in."""

    drawn: list[_Drawn]  # per class, in class-name order
    classes: list[str]
    times: list[np.ndarray]  # per class, sorted: a class's tasks arrive in index order
    rank_class: np.ndarray  # class of the k-th task to start in the SimPy model (over all classes)
    provenance: Provenance

    def tasks(self, records: bool, window: int = 4096) -> Iterator[Any]:
        """Every top-level task (a `Task`, or its native record) in arrival order, which is also the
        order of their ids (`task-000`, ...) and of their fresh hash ids (unique across the workload),
        materialised `window` tasks at a time."""
        total = len(self.rank_class)
        width = len(str(max(1, total - 1)))
        tree = np.zeros(total, dtype=np.int64)
        for c, drawn in enumerate(self.drawn):
            mine = np.flatnonzero(self.rank_class == c)
            tree[mine] = drawn.tree_fresh
        base = 1 + np.cumsum(tree) - tree
        done = [0] * len(self.drawn)
        for k0 in range(0, total, window):
            k1 = min(total, k0 + window)
            cls = self.rank_class[k0:k1]
            # The window's tasks and sub-tasks own one run of consecutive fresh ids.
            # Stored as uint32 where the ids fit: orjson writes the same digits twice as fast.
            end = int(base[k1 - 1] + tree[k1 - 1])
            pool = np.arange(base[k0], end, dtype=np.uint32 if end <= 2**32 else np.int64) if records else None
            built: list[Iterator[Any]] = []
            for c, drawn in enumerate(self.drawn):
                ranks = np.flatnonzero(cls == c) + k0
                t0, t1 = done[c], done[c] + len(ranks)
                done[c] = t1
                ids = [f"task-{k:0{width}d}" for k in ranks.tolist()]
                arrivals = self.times[c][t0:t1].tolist()
                built.append(iter(_materialise(drawn, t0, t1, ids, base[ranks], self.classes[c], arrivals, pool)))
            if len(built) == 1:
                yield from built[0]
            else:
                for c in cls.tolist():
                    yield next(built[c])


def _gamma_times(process: GammaRenewal, shares: list[float], names: list[str], rng: np.random.Generator,
                 tasks: Optional[int], duration: Optional[float]) -> dict[str, np.ndarray]:
    """Arrival times per class from one `process` for all classes together (`tasks` of them, or all
    within `duration`), each arrival's class drawn by `shares`: the stream as a whole has the process's
    burstiness, which independent processes per class would smooth out."""
    together = process.sample(rng, n=tasks) if tasks is not None else process.sample(rng, duration=duration)
    which = rng.choice(len(names), size=len(together), p=np.asarray(shares) / sum(shares))
    return {name: together[which == c] for c, name in enumerate(names)}


def _start_order(times: list[np.ndarray]) -> np.ndarray:
    """Run the SimPy arrival model: per class, an arrival process that starts a task process at each of
    `times[c]` (sorted). Returns the class of each task process in the order they started (tasks
    arriving at the same instant start in the order SimPy schedules them: deterministic)."""
    env = simpy.Environment()
    started: list[int] = []

    def task(c: int):
        # Takes its content from the class's draws: the k-th task of class c to start is its k-th drawn.
        started.append(c)
        return
        yield  # a generator, so that SimPy runs it as a process

    def arrivals(c: int, at: list[float]):
        for t in at:
            yield env.timeout(max(0.0, t - env.now))
            env.process(task(c))

    for c, at in enumerate(times):
        env.process(arrivals(c, at.tolist()))
    env.run()
    return np.asarray(started, dtype=np.int64)


def _plan(
    model: WorkloadModel,
    *,
    tasks: Optional[int] = None,
    duration: Optional[float] = None,
    seed: int = 0,
    rate: Optional[float] = None,
    burstiness: Optional[float] = None,
    source: str = "<model>",
) -> _Plan:
    """Draw a workload: `tasks` tasks, or every task arriving within `duration` seconds.

    `rate` (tasks per second, all classes together) replaces the fitted mean rate, keeping each
    process's burstiness; it is required when a class's arrivals come from the user. `burstiness`
    replaces the fitted processes by one gamma renewal process of that shape for all classes together
    (`arrivals.gamma_renewal`), at `rate` or the fitted rates' sum; each arrival's class is drawn by
    the classes' shares."""
    if (tasks is None) == (duration is None):
        raise InputError("give either a number of tasks or a duration")
    if (tasks is not None and tasks < 0) or (duration is not None and duration <= 0):
        raise InputError("tasks must be >= 0 and duration > 0")
    if rate is not None and rate <= 0:
        raise InputError("rate must be > 0", field="rate")
    if burstiness is not None and not burstiness > 0:
        raise InputError("burstiness must be > 0", field="burstiness")
    names = sorted(model.classes)
    root = np.random.SeedSequence(seed)
    streams = dict(zip(names, root.spawn(len(names))))

    # Arrival times per class; with a task count, the earliest `tasks` over all classes are kept.
    times: dict[str, np.ndarray] = {}
    procs = {}
    for name in names:
        cls = model.classes[name]
        try:
            procs[name] = cls.arrivals.process(None if rate is None else rate * cls.share)
        except ValueError as exc:
            raise InputError(f"class {name}: {exc}", file=source, path=f"$.classes.{name}.arrivals", field="use") from None
        rng = np.random.default_rng(streams[name].spawn(1)[0])  # drawn either way: the tasks stay the same
        if burstiness is None:
            proc = procs[name]
            times[name] = proc.sample(rng, n=tasks) if tasks is not None else proc.sample(rng, duration=duration)
    if burstiness is not None:
        total = rate if rate is not None else sum(p.mean_rate() for p in procs.values())
        times = _gamma_times(gamma_renewal(total, burstiness), [model.classes[n].share for n in names], names,
                             np.random.default_rng(root.spawn(1)[0]), tasks, duration)
    elif tasks is not None and len(names) > 1:
        merged = np.sort(np.concatenate(list(times.values())), kind="stable")[:tasks]
        cutoff = merged[-1] if len(merged) else -1.0
        left = tasks
        for name in names:
            keep = times[name][times[name] <= cutoff][:left]
            left -= len(keep)
            times[name] = keep

    # A class's tasks are drawn in its arrival order; tasks are materialised in the order the SimPy
    # model starts them, which is also the order of their ids.
    for name in names:
        times[name] = np.sort(times[name], kind="stable")
    rank_class = _start_order([times[name] for name in names])

    drawn = []
    for name in names:
        rng = np.random.default_rng(streams[name].spawn(1)[0])
        drawn.append(_draw(model.classes[name].structure, len(times[name]), rng))
    options = {"seed": seed, "tasks": tasks, "duration": duration, "rate": rate, "burstiness": burstiness}
    prov = Provenance(source=source, format="generated", options={k: v for k, v in options.items() if v is not None})
    return _Plan(drawn, names, [times[name] for name in names], rank_class, prov)


def generate(
    model: WorkloadModel,
    *,
    tasks: Optional[int] = None,
    duration: Optional[float] = None,
    seed: int = 0,
    rate: Optional[float] = None,
    burstiness: Optional[float] = None,
    source: str = "<model>",
) -> Workload:
    """A synthetic workload: `tasks` tasks, or every task arriving within `duration` seconds.

    `rate` (tasks per second, all classes together) replaces the fitted mean rate, keeping each
    process's burstiness; it is required when a class's arrivals come from the user. `burstiness`
    (gamma shape: 1 Poisson, lower burstier) replaces the fitted arrival processes by a gamma renewal
    process at `rate` or the fitted rate; the tasks drawn are the same either way."""
    with gc_paused():
        plan = _plan(model, tasks=tasks, duration=duration, seed=seed, rate=rate, burstiness=burstiness,
                     source=source)
        final = tuple(plan.tasks(records=False))
    return Workload(final, (plan.provenance,))


def write_generated(
    model: WorkloadModel,
    out: IO[bytes] | Path | str,
    *,
    tasks: Optional[int] = None,
    duration: Optional[float] = None,
    seed: int = 0,
    rate: Optional[float] = None,
    burstiness: Optional[float] = None,
    source: str = "<model>",
) -> tuple[int, int, int]:
    """Generate straight into a native file (a path or a binary stream), with `generate`'s arguments:
    the same bytes as `native.write(generate(...))`, much faster, since no whole hash-id tuples are
    built. Returns (tasks, calls, sub-tasks)."""
    if isinstance(out, (str, Path)):
        with open(out, "wb") as fh:
            return write_generated(model, fh, tasks=tasks, duration=duration, seed=seed, rate=rate,
                                   burstiness=burstiness, source=source)
    with gc_paused():
        plan = _plan(model, tasks=tasks, duration=duration, seed=seed, rate=rate, burstiness=burstiness,
                     source=source)
        out.write(native.header_line([plan.provenance]))
        dumps, option = orjson.dumps, native.DUMP_OPTIONS | orjson.OPT_APPEND_NEWLINE
        write = out.write
        batch: list[bytes] = []
        for record in plan.tasks(records=True):
            line = dumps(record, option=option)  # ids are below 2**63: orjson writes them all
            if len(line) >= _DIRECT_WRITE:  # a long task: copying it into a batch costs more than a write
                if batch:
                    write(b"".join(batch))
                    batch.clear()
                write(line)
                continue
            batch.append(line)
            if len(batch) >= 4096:
                write(b"".join(batch))
                batch.clear()
        write(b"".join(batch))
    calls = subs = 0
    for d in plan.drawn:
        c, s = _counts(d)
        calls += c
        subs += s
    return len(plan.rank_class), calls, subs
