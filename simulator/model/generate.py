"""Generate a synthetic `Workload` from a `WorkloadModel`.

SimPy runs the orchestration: one arrival process per task class waits out the inter-arrival gaps and
starts a task process at each arrival, which materialises its task (and the sub-agents it forks) at
that simulated time. What a task contains is drawn beforehand, vectorised with numpy across all the
tasks of a class (a Python-level SimPy process per call would be far too slow for millions of calls).

Prompts carry hash ids that grow turn by turn: a call's ids are the reused leading part of the
previous call's ids plus fresh ids, so a prefix cache sees the modelled reuse; fresh ids come from one
counter and are unique across the workload. One seed gives one workload, bit for bit.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Optional

import numpy as np
import simpy

from ..errors import InputError
from ..workload import Call, Provenance, SubTask, Task, Workload
from .fit import START
from .schema import Cell, Structure, WorkloadModel


@dataclass
class _Drawn:
    """The calls of a batch of tasks as columns (one entry per call, tasks contiguous), as Python lists
    because every value ends up in a `Call` anyway."""

    offsets: list[int]  # first row of each task, plus the total at the end
    input: list[int]
    output: list[int]
    gap: list[float]
    shared: list[int]  # blocks kept from the previous call's ids
    stops: list[Optional[str]]
    subtasks: list[list[tuple[int, int, bool]]]  # per task: (after_call, index into `sub`, wait)
    sub: Optional["_Drawn"]
    block_size: int


class _Ids:
    """The source of fresh hash ids (unique across one generated workload)."""

    __slots__ = ("next",)

    def __init__(self) -> None:
        self.next = 1


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
    """The most specific cell: own length class first, then any length; within each, position and
    previous stop, previous stop alone, position alone, neither."""
    for ln in (length, None):
        if prev == START:  # a first call only ever takes a first-call cell
            keys: tuple = ((ln, 0, START),)
        else:
            keys = ((ln, bucket, prev), (ln, None, prev), (ln, bucket, None), (ln, None, None))
        for key in keys:
            if key in cells:
                return cells[key]
    raise InputError(f"the model has no cell for calls from index {bucket} after {prev!r} (and no catch-all cell)")


def _draw(structure: Structure, n: int, rng: np.random.Generator, depth: int = 0) -> _Drawn:
    """Draw `n` tasks' calls with their stop reasons, sizes, gaps, prefix reuse and sub-agents."""
    ncalls = np.maximum(1, structure.calls_per_task.sample(rng, n).astype(np.int64))
    offsets = np.concatenate([[0], np.cumsum(ncalls)]).astype(np.int64)
    total = int(offsets[-1])
    position = np.arange(total) - np.repeat(offsets[:-1], ncalls)
    stops, labels = _stop_chain(structure, ncalls, offsets, rng)
    prev_code = np.where(position == 0, -1, np.concatenate([[0], stops[:-1]]))
    buckets = np.asarray(structure.position_buckets)
    bucket = buckets[np.searchsorted(buckets, position, side="right") - 1]

    appended = np.zeros(total)
    output = np.zeros(total)
    gap = np.zeros(total)
    cells = _cell_index(structure)
    lbuckets = np.asarray(structure.length_buckets)
    length = np.repeat(lbuckets[np.searchsorted(lbuckets, ncalls, side="right") - 1], ncalls)
    stride = len(labels) + 1
    key = (length * (int(buckets.max()) + 1) + bucket) * stride + (prev_code + 1)
    uniq, inverse = np.unique(key, return_inverse=True)
    for j, k in enumerate(uniq.tolist()):
        rows = np.flatnonzero(inverse == j)
        lb, p = divmod(k, stride)
        ln, b = divmod(lb, int(buckets.max()) + 1)
        cell = _lookup(cells, int(ln), int(b), START if p == 0 else labels[p - 1])
        appended[rows] = cell.appended.sample(rng, len(rows))
        output[rows] = cell.output.sample(rng, len(rows))
        gap[rows] = cell.gap.sample(rng, len(rows))

    reuse = structure.reuse
    full = rng.random(total) < reuse.full_prob
    if reuse.partial_fraction is not None and reuse.partial_appended is not None:
        frac = np.clip(reuse.partial_fraction.sample(rng, total), 0.0, 1.0)
        part_app = reuse.partial_appended.sample(rng, total)
    else:
        frac = np.zeros(total)
        part_app = appended
    bs = structure.block_size
    growth = np.full(n, np.inf)
    if structure.peak_growth:
        task_length = lbuckets[np.searchsorted(lbuckets, ncalls, side="right") - 1]
        for ln in np.unique(task_length).tolist():
            dist = structure.peak_growth.get(ln, structure.peak_growth.get(0))
            if dist is not None:
                these = np.flatnonzero(task_length == ln)
                growth[these] = np.maximum(dist.sample(rng, len(these)), 1.0)
    limit_of = np.full(n, structure.context_limit, dtype=np.int64)
    inputs = np.zeros(total, dtype=np.int64)
    shared = np.zeros(total, dtype=np.int64)
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
        is_full = full[rows]
        sh = np.where(is_full, prev_blocks, np.floor(frac[rows] * prev_blocks).astype(np.int64))
        add = np.minimum(np.where(is_full, appended[rows], part_app[rows]), structure.context_limit).astype(np.int64)
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

    subtasks: list[list[tuple[int, int, bool]]] = [[] for _ in range(n)]
    sub = None
    sa = structure.subagents
    if sa is not None and sa.spawn_prob > 0 and depth < 3:
        spawn_rows = np.flatnonzero((rng.random(total) < sa.spawn_prob) & (position < np.repeat(ncalls, ncalls) - 1))
        if len(spawn_rows):
            fan = np.maximum(1, sa.fan_out.sample(rng, len(spawn_rows)).astype(np.int64))
            count = int(fan.sum())
            waits = rng.random(count) < sa.wait_prob
            owner = np.searchsorted(offsets, spawn_rows, side="right") - 1
            j = 0
            for row, t, f in zip(spawn_rows.tolist(), owner.tolist(), fan.tolist()):
                after = row - int(offsets[t])
                for _ in range(f):
                    subtasks[t].append((after, j, bool(waits[j])))
                    j += 1
            sub = _draw(sa.structure, count, rng, depth + 1)
    stop_names = [None if s == "unknown" else s for s in labels]
    return _Drawn(
        offsets=offsets.tolist(),
        input=inputs.tolist(),
        output=np.maximum(output, 0).astype(np.int64).tolist(),
        gap=np.maximum(gap, 0.0).tolist(),
        shared=shared.tolist(),
        stops=[stop_names[s] for s in stops.tolist()],
        subtasks=subtasks,
        sub=sub,
        block_size=bs,
    )


def _build(drawn: _Drawn, index: int, task_id: str, task_class: str, arrival: float, ids: _Ids) -> Task:
    """Materialise one drawn task as a `Task`, giving its prompts hash ids."""
    lo, hi = drawn.offsets[index], drawn.offsets[index + 1]
    bs = drawn.block_size
    calls = []
    chain: tuple[int, ...] = ()
    nxt = ids.next
    for inp, out, gp, sh, stop in zip(drawn.input[lo:hi], drawn.output[lo:hi], drawn.gap[lo:hi], drawn.shared[lo:hi], drawn.stops[lo:hi]):
        blocks = inp // bs
        keep = chain if sh >= len(chain) else chain[:sh]
        fresh = blocks - len(keep)
        if fresh > 0:
            chain = keep + tuple(range(nxt, nxt + fresh))
            nxt += fresh
        else:
            chain = keep[:blocks]
        calls.append(Call(inp, out, gp, chain, bs, None, None, stop))
    ids.next = nxt
    subs = ()
    if drawn.subtasks[index]:
        assert drawn.sub is not None
        subs = tuple(
            SubTask(after_call=after, task=_build(drawn.sub, k, f"{task_id}.sub{j}", "subagent", 0.0, ids), wait=wait)
            for j, (after, k, wait) in enumerate(drawn.subtasks[index])
        )
    return Task(task_id, tuple(calls), arrival, task_class, subs)


def generate(
    model: WorkloadModel,
    *,
    tasks: Optional[int] = None,
    duration: Optional[float] = None,
    seed: int = 0,
    rate: Optional[float] = None,
    source: str = "<model>",
) -> Workload:
    """A synthetic workload: `tasks` tasks, or every task arriving within `duration` seconds.

    `rate` (tasks per second, all classes together) replaces the fitted mean rate, keeping each
    process's burstiness; it is required when a class's arrivals come from the user."""
    if (tasks is None) == (duration is None):
        raise InputError("give either a number of tasks or a duration")
    if (tasks is not None and tasks < 0) or (duration is not None and duration <= 0):
        raise InputError("tasks must be >= 0 and duration > 0")
    if rate is not None and rate <= 0:
        raise InputError("rate must be > 0", field="rate")
    names = sorted(model.classes)
    streams = dict(zip(names, np.random.SeedSequence(seed).spawn(len(names))))

    # Arrival times per class; with a task count, the earliest `tasks` over all classes are kept.
    times: dict[str, np.ndarray] = {}
    for name in names:
        cls = model.classes[name]
        try:
            proc = cls.arrivals.process(None if rate is None else rate * cls.share)
        except ValueError as exc:
            raise InputError(f"class {name}: {exc}", file=source, path=f"$.classes.{name}.arrivals", field="use") from None
        rng = np.random.default_rng(streams[name].spawn(1)[0])
        times[name] = proc.sample(rng, n=tasks) if tasks is not None else proc.sample(rng, duration=duration)
    if tasks is not None and len(names) > 1:
        merged = np.sort(np.concatenate(list(times.values())), kind="stable")[:tasks]
        cutoff = merged[-1] if len(merged) else -1.0
        left = tasks
        for name in names:
            keep = times[name][times[name] <= cutoff][:left]
            left -= len(keep)
            times[name] = keep

    # Task ids follow arrival order over all classes (ties: class name, then draw order).
    order = sorted((float(t), c, i) for c, name in enumerate(names) for i, t in enumerate(times[name].tolist()))
    width = len(str(max(1, len(order) - 1)))
    task_ids: dict[str, list[str]] = {name: [""] * len(times[name]) for name in names}
    for k, (_, c, i) in enumerate(order):
        task_ids[names[c]][i] = f"task-{k:0{width}d}"

    env = simpy.Environment()
    built: list[tuple[float, int, Task]] = []
    ids = _Ids()

    def task_process(name: str, drawn: _Drawn, i: int):
        """One task: it exists from its arrival on (its calls' timing is the driver's business)."""
        task = _build(drawn, i, task_ids[name][i], name, float(env.now), ids)
        built.append((task.arrival, len(built), task))
        return
        yield  # a SimPy process is a generator

    def arrival_process(name: str, arrivals: list[float], drawn: _Drawn):
        last = 0.0
        for i, t in enumerate(arrivals):
            if t > last:
                yield env.timeout(t - last)
                last = t
            env.process(task_process(name, drawn, i))

    for name in names:
        rng = np.random.default_rng(streams[name].spawn(1)[0])
        drawn = _draw(model.classes[name].structure, len(times[name]), rng)
        env.process(arrival_process(name, times[name].tolist(), drawn))
    # Millions of fresh hash-id tuples would trigger the cyclic collector over and over (3x slower);
    # they hold no cycles, so it is paused while they are built.
    paused = gc.isenabled()
    gc.disable()
    try:
        env.run()
        built.sort(key=lambda r: r[2].id)  # ids are zero-padded, in arrival order
        final = tuple(task for _, _, task in built)
    finally:
        if paused:
            gc.enable()
    options = {"seed": seed, "tasks": tasks, "duration": duration, "rate": rate}
    prov = Provenance(source=source, format="generated", options={k: v for k, v in options.items() if v is not None})
    return Workload(final, (prov,))
