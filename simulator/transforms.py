"""Workload transforms: pure functions Workload -> Workload, and a declarative `TransformSpec` for them.

Each transform returns a new workload and leaves its input untouched:

- `time_scale`: multiply arrival times (and, separately, `gap_scale`: the gaps before calls).
- `rate_scale`: r times as many tasks per second, burstiness kept. ``compress`` (default) divides
  arrival times by r: the same tasks, the same burst shapes, in 1/r of the time. ``overlay`` keeps
  the time span: for r > 1 it lays ceil(r) copies of the arrival pattern over each other, each shifted
  circularly by a seeded random offset, then keeps a seeded sample of round(r × n) tasks; for r < 1
  it keeps a seeded sample of round(r × n) tasks (thinning).
- `gap_cap`: no gap longer than the cap (hour-long human pauses in a 10-minute test).
- `token_scale` with `context_cap`: scale input and output tokens (a call keeps at least one output
  token, as a live server needs); cap input + output per call (for a small-context test model: output
  first kept up to half the cap, the prompt keeps its head). Without a cap, a scale that takes a call
  past `workload.MAX_TOKENS` is an InputError.
  Hash ids are rebuilt so prefix sharing survives: a new block is identified by the original
  block holding its last token and its own position, so any two prompts that shared a prefix still
  share it, scaled (block size unchanged).
- `filter_classes`, `sample`: keep some task classes; keep N tasks (seeded, arrival order kept).
- `rate` (in a `TransformSpec`): tasks per second instead of a factor: the rate scale that takes the
  workload's own rate (`task_rate`) to it. A workload whose arrivals span no time has no rate to scale:
  its arrivals are then re-spaced as a Poisson process at that rate (`respace`, burstiness 1).
- `respace`: top-level arrivals re-spaced as a gamma renewal process, seeded: independent gaps of mean
  1 / rate and shape `burstiness`, as `vllm bench serve --burstiness` draws them (1: Poisson; lower:
  burstier, the gaps' coefficient of variation is 1 / sqrt(burstiness); higher: more even). Tasks keep
  their order, the first keeps its arrival.

`apply(workload, spec, seed)` runs the spec's transforms in a fixed order (filter, sample, rate,
arrivals, time, gaps, gap cap, tokens) and records what it did in the workload's provenance.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Annotated, Literal, Optional, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from .errors import InputError
from .hash_ids import ID_LIMIT, HashIds, common_prefix
from .workload import MAX_SECONDS, MAX_TOKENS, Call, Provenance, Task, Workload

MAX_OVERLAY_TASKS = 10_000_000
"""Most tasks an overlay rate scale may lay out (copies × tasks): beyond, memory runs out first."""


class TransformSpec(BaseModel):
    """What to change in a workload (every field optional; the defaults change nothing)."""

    model_config = ConfigDict(extra="forbid")

    classes: Optional[list[str]] = None
    """Keep only tasks of these classes."""
    sample: Optional[Annotated[int, Field(ge=0)]] = None
    """Keep this many tasks, drawn with the seed."""
    rate_scale: Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)] = 1.0
    """Tasks per second × this, burst shape kept (see `rate_mode`)."""
    rate: Optional[Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)]] = None
    """Tasks per second (top-level arrivals): scales the workload's own rate to this, as `rate_scale`
    does (arrivals that span no time are re-spaced as a Poisson process at this rate instead)."""
    rate_mode: Literal["compress", "overlay"] = "compress"
    burstiness: Optional[Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)]] = None
    """Re-space top-level arrivals as a gamma renewal process of this shape (1: Poisson, lower:
    burstier), at `rate` or else the workload's own rate, seeded."""
    time_scale: Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)] = 1.0
    """Multiplies arrival times (2: half the rate, same pattern)."""
    gap_scale: Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)] = 1.0
    """Multiplies the gaps before calls."""
    gap_cap: Optional[Annotated[float, Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False)]] = None
    """Seconds; longer gaps are cut to this."""
    token_scale: Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)] = 1.0
    """Multiplies input and output tokens (a call keeps at least one of each it had)."""
    context_cap: Optional[Annotated[int, Field(gt=1, le=2 * MAX_TOKENS)]] = None
    """Most input + output tokens of one call."""

    @model_validator(mode="after")
    def _one_rate(self) -> "TransformSpec":
        if self.rate is not None and self.rate_scale != 1.0:
            raise ValueError("give `rate` (tasks per second) or `rate_scale` (a factor), not both")
        return self

    def is_identity(self) -> bool:
        """True when applying the spec changes nothing."""
        return self == TransformSpec()


# ---------------------------------------------------------------- helpers


def _map_calls(task: Task, fn) -> Task:
    """The task with `fn` applied to every call of it and of its sub-tasks."""
    subs = tuple(dataclasses.replace(s, task=_map_calls(s.task, fn)) for s in task.subtasks)
    return dataclasses.replace(task, calls=tuple(fn(c) for c in task.calls), subtasks=subs)


def _with(workload: Workload, tasks, what: str, options: dict) -> Workload:
    tasks = list(tasks)
    late = max((t.arrival for t in tasks), default=0.0)
    if not late <= MAX_SECONDS:
        raise InputError(f"{what} puts an arrival {late:.3g} s from the start, more than {MAX_SECONDS:g} s", field=what)
    ordered = tuple(sorted(tasks, key=lambda t: t.arrival))
    note = Provenance(source="transform", format=what, options=options)
    return Workload(ordered, workload.provenance + (note,))


# ---------------------------------------------------------------- transforms


def time_scale(workload: Workload, factor: float) -> Workload:
    """Arrival times × `factor` (relative to the first arrival); gaps are untouched."""
    if factor <= 0:
        raise InputError("time scale must be > 0", field="time_scale")
    t0 = min((t.arrival for t in workload.tasks), default=0.0)
    tasks = [dataclasses.replace(t, arrival=t0 + (t.arrival - t0) * factor) for t in workload.tasks]
    return _with(workload, tasks, "time_scale", {"factor": factor})


def gap_scale(workload: Workload, factor: float) -> Workload:
    """Every gap before a call × `factor`."""
    if factor < 0:
        raise InputError("gap scale must be >= 0", field="gap_scale")
    longest = max((c.gap for c in workload.all_calls()), default=0.0)
    if longest * factor > MAX_SECONDS:
        raise InputError(f"gap scale {factor:g} makes a gap of {longest * factor:.3g} s, more than {MAX_SECONDS:g} s",
                         field="gap_scale")
    tasks = [_map_calls(t, lambda c: dataclasses.replace(c, gap=c.gap * factor)) for t in workload.tasks]
    return _with(workload, tasks, "gap_scale", {"factor": factor})


def gap_cap(workload: Workload, cap: float) -> Workload:
    """No gap longer than `cap` seconds."""
    if cap < 0:
        raise InputError("gap cap must be >= 0", field="gap_cap")
    tasks = [_map_calls(t, lambda c: c if c.gap <= cap else dataclasses.replace(c, gap=cap)) for t in workload.tasks]
    return _with(workload, tasks, "gap_cap", {"cap": cap})


def rate_scale(workload: Workload, factor: float, mode: str = "compress", seed: int = 0) -> Workload:
    """`factor` times the task rate, burstiness kept (see the module doc for the two modes)."""
    if factor <= 0:
        raise InputError("rate scale must be > 0", field="rate_scale")
    tasks = list(workload.tasks)
    if not tasks:
        return workload
    t0 = min(t.arrival for t in tasks)
    if mode == "compress":
        out = [dataclasses.replace(t, arrival=t0 + (t.arrival - t0) / factor) for t in tasks]
        return _with(workload, out, "rate_scale", {"factor": factor, "mode": mode})
    if mode != "overlay":
        raise InputError(f"unknown rate mode {mode!r} (compress, overlay)", field="rate_mode")
    rng = np.random.default_rng(seed)
    arrivals = np.asarray([t.arrival - t0 for t in tasks])
    span = float(arrivals.max())
    n = len(tasks)
    # The circular period: the span plus one mean gap, so the wrap adds no burst of its own.
    period = span * n / (n - 1) if n > 1 and span > 0 else 1.0
    copies = max(1, math.ceil(factor))
    if copies * n > MAX_OVERLAY_TASKS:
        raise InputError(f"overlay rate scale {factor:g} lays out {copies * n:,} tasks, more than {MAX_OVERLAY_TASKS:,}",
                         field="rate_scale")
    shift = _CopyIds(workload, copies, rng)
    pool: list[Task] = []
    for k in range(copies):
        offset = 0.0 if k == 0 else float(rng.uniform(0, period))
        for t, a in zip(tasks, arrivals):
            if k:
                t = _renamed(_map_calls(t, lambda c, k=k: dataclasses.replace(c, hash_ids=shift(c.hash_ids, k))), t.id, k)
            pool.append(dataclasses.replace(t, arrival=t0 + (a + offset) % period))
    keep = min(len(pool), int(round(factor * n)))
    chosen = np.sort(rng.choice(len(pool), size=keep, replace=False))
    return _with(workload, [pool[i] for i in chosen], "rate_scale", {"factor": factor, "mode": mode, "seed": seed})


def _renamed(task: Task, root: str, k: int) -> Task:
    """The k-th copy of a task tree under ids of its own: the root `root` becomes `root~k`, a sub-task named
    under it (`root/agent_1`) becomes `root~k/agent_1`, any other sub-task id gets `~k`. Records, reports and a
    live run's prompts (whose unshared tails are seeded by the task id) tell tasks apart by their ids."""
    def name(tid: str) -> str:
        if tid == root:
            return f"{root}~{k}"
        if tid.startswith(root + "/"):
            return f"{root}~{k}{tid[len(root):]}"
        return f"{tid}~{k}"

    subs = tuple(dataclasses.replace(s, task=_renamed(s.task, root, k)) for s in task.subtasks)
    return dataclasses.replace(task, id=name(task.id), subtasks=subs)


class _CopyIds:
    """Hash ids of the k-th copy of a workload: a copy is another user doing similar work, not the same prompt
    again, so its ids move to a range of their own and a prefix cache does not see copies as reuse. Copy k
    adds k × (largest id + 1) while that stays below 2**63; past that, a seeded 63-bit offset per copy, modulo
    2**63 (ids then meet another copy's only by chance, with odds of about ids² / 2**63)."""

    def __init__(self, workload: Workload, copies: int, rng: np.random.Generator) -> None:
        largest = max((ids.max() if isinstance(ids, HashIds) else max(ids)
                       for ids in (c.hash_ids for c in workload.all_calls()) if ids), default=0)
        stride = largest + 1
        if copies * stride <= ID_LIMIT:
            self.offsets = [k * stride for k in range(copies)]
        else:
            self.offsets = [0] + [int(x) for x in rng.integers(1, ID_LIMIT, size=copies - 1)]
        self.cache: dict = {}

    def __call__(self, ids, k: int):
        offset = self.offsets[k]
        if isinstance(ids, HashIds):
            return ids.shifted(offset, self.cache)
        return tuple((i + offset) % ID_LIMIT for i in ids)


def task_rate(workload: Workload) -> Optional[float]:
    """The workload's own rate of top-level arrivals, tasks per second: (tasks - 1) / their span, the
    rate whose mean gap spans them; None when they span no time (one task, or all arriving at once)."""
    if len(workload.tasks) < 2:
        return None
    arrivals = [t.arrival for t in workload.tasks]
    span = max(arrivals) - min(arrivals)
    return (len(arrivals) - 1) / span if span > 0 else None


def respace(workload: Workload, burstiness: float, rate: Optional[float] = None, seed: int = 0) -> Workload:
    """Top-level arrivals re-spaced as a gamma renewal process: gaps of mean 1 / `rate` (default: the
    workload's own `task_rate`) and shape `burstiness` (1: Poisson; the gaps' coefficient of variation
    is 1 / sqrt(burstiness)), drawn with `seed`; tasks keep their order, the first its arrival."""
    if not burstiness > 0:
        raise InputError("burstiness must be > 0", field="burstiness")
    own = task_rate(workload)
    if rate is None:
        if own is None and len(workload.tasks) > 1:
            raise InputError("the arrivals span no time, so the workload has no rate to keep: give a rate "
                             "(tasks per second) with the burstiness", field="burstiness")
        rate = own or 1.0
    if not rate > 0:
        raise InputError("rate must be > 0", field="rate")
    ordered = sorted(workload.tasks, key=lambda t: t.arrival)
    if not ordered:
        return workload
    # A stream of its own, so that the gaps do not follow the draws of `sample` or an overlay.
    rng = np.random.default_rng([seed, _RESPACE_STREAM])
    gaps = rng.gamma(burstiness, 1.0 / (rate * burstiness), len(ordered) - 1)
    t0 = ordered[0].arrival
    times = t0 + np.concatenate([[0.0], np.cumsum(gaps)])
    tasks = [dataclasses.replace(t, arrival=float(a)) for t, a in zip(ordered, times.tolist())]
    return _with(workload, tasks, "arrivals", {"process": "gamma", "burstiness": burstiness, "rate": rate,
                                               "seed": seed})


_RESPACE_STREAM = 0x61727276
"""Second word of the seed of `respace`'s draws (any constant; it keeps them apart from the others')."""


def filter_classes(workload: Workload, classes: list[str]) -> Workload:
    """Only the tasks whose class is in `classes`."""
    wanted = set(classes)
    tasks = [t for t in workload.tasks if t.task_class in wanted]
    if not tasks:
        found = sorted({t.task_class for t in workload.tasks})
        raise InputError(f"no task of class {sorted(wanted)} (classes present: {found})", field="classes")
    return _with(workload, tasks, "filter_classes", {"classes": sorted(wanted)})


def sample(workload: Workload, n: int, seed: int = 0) -> Workload:
    """`n` tasks drawn without replacement (all of them when there are fewer)."""
    if n < 0:
        raise InputError("sample size must be >= 0", field="sample")
    tasks = list(workload.tasks)
    if n < len(tasks):
        idx = np.sort(np.random.default_rng(seed).choice(len(tasks), size=n, replace=False))
        tasks = [tasks[i] for i in idx]
    return _with(workload, tasks, "sample", {"n": n, "seed": seed})


class _Rehash:
    """New hash ids for scaled prompts, consistent across the whole workload (numbered from 1 as first met,
    so a prompt's new blocks get consecutive ids)."""

    def __init__(self, factor: float) -> None:
        self.factor = factor
        self.ids: dict[tuple, int] = {}

    def _id(self, key: tuple) -> int:
        got = self.ids.get(key)
        if got is None:
            got = self.ids[key] = len(self.ids) + 1
        return got

    def call(self, call: Call, new_input: int, call_key: int) -> tuple[int, ...]:
        bs = call.block_size
        if not bs or not call.hash_ids:
            return ()
        blocks = new_input // bs
        covered = len(call.hash_ids)  # original blocks with ids
        original = call.hash_ids
        out = []
        for j in range(blocks):
            # Original block holding this new block's last token; equal original ids mean equal
            # prefixes, so (that id, position) names the same scaled content wherever it appears.
            k = int(((j + 1) * bs / self.factor - 1) // bs)
            out.append(self._id((original[k], j) if k < covered else ("fresh", call_key, j)))
        return tuple(out)


def _scaled(count: int, factor: float, capped: bool) -> int:
    """`count` × `factor`, rounded, at least 1 when `count` is (a call keeps an output token: a live server
    refuses max_tokens 0, so the twin must not be given such a call either)."""
    if not count:
        return 0
    value = count * factor
    if value > MAX_TOKENS and not capped:
        raise InputError(f"token scale {factor:g} makes a call of {value:.3g} tokens, more than the {MAX_TOKENS:,} a "
                         "call may have (set context_cap, or a smaller token_scale)", field="token_scale")
    return max(1, int(round(min(value, 2 * MAX_TOKENS))))


def token_scale(workload: Workload, factor: float = 1.0, context_cap: Optional[int] = None) -> Workload:
    """Input and output tokens × `factor` (a call keeps at least one of each it had), then input + output
    capped at `context_cap` per call; hash ids rebuilt so shared prefixes stay shared (see the module doc).
    The calls of a task share their new ids' storage (`simulator.hash_ids`)."""
    if factor <= 0:
        raise InputError("token scale must be > 0", field="token_scale")
    if context_cap is not None and context_cap < 2:
        raise InputError("context cap must be >= 2", field="context_cap")
    rehash = _Rehash(factor)
    counter = [0]
    capped = context_cap is not None

    def task(t: Task) -> Task:
        previous: Sequence[int] = ()
        calls = []
        for call in t.calls:
            inp = _scaled(call.input_tokens, factor, capped)
            out = _scaled(call.output_tokens, factor, capped)
            if context_cap is not None and inp + out > context_cap:
                out = min(out, context_cap // 2)
                inp = context_cap - out
            counter[0] += 1
            if factor != 1.0:
                ids = rehash.call(call, inp, counter[0])
            else:
                ids = call.hash_ids[: inp // call.block_size] if call.block_size else call.hash_ids
            if ids and not isinstance(ids, HashIds):
                base = previous if isinstance(previous, HashIds) else HashIds.of(())
                shared = common_prefix(base, ids)
                ids = base.extend(shared, ids[shared:])
            previous = ids
            calls.append(dataclasses.replace(call, input_tokens=inp, output_tokens=out, hash_ids=ids))
        subs = tuple(dataclasses.replace(s, task=task(s.task)) for s in t.subtasks)
        return dataclasses.replace(t, calls=tuple(calls), subtasks=subs)

    tasks = [task(t) for t in workload.tasks]
    return _with(workload, tasks, "token_scale", {"factor": factor, "context_cap": context_cap})


def apply(workload: Workload, spec: TransformSpec, seed: int = 0) -> Workload:
    """Every transform the spec asks for, in the order filter, sample, rate, arrivals (burstiness),
    time, gaps, gap cap, tokens."""
    w = workload
    if spec.classes is not None:
        w = filter_classes(w, spec.classes)
    if spec.sample is not None:
        w = sample(w, spec.sample, seed)
    burstiness = spec.burstiness
    if spec.rate is not None:
        own = task_rate(w)
        if own is not None:
            w = rate_scale(w, spec.rate / own, spec.rate_mode, seed)
        elif burstiness is None:
            burstiness = 1.0  # nothing to scale: Poisson arrivals at the rate, as `vllm bench serve` sends them
    elif spec.rate_scale != 1.0:
        w = rate_scale(w, spec.rate_scale, spec.rate_mode, seed)
    if burstiness is not None:
        w = respace(w, burstiness, spec.rate, seed)
    if spec.time_scale != 1.0:
        w = time_scale(w, spec.time_scale)
    if spec.gap_scale != 1.0:
        w = gap_scale(w, spec.gap_scale)
    if spec.gap_cap is not None:
        w = gap_cap(w, spec.gap_cap)
    if spec.token_scale != 1.0 or spec.context_cap is not None:
        w = token_scale(w, spec.token_scale, spec.context_cap)
    return w
