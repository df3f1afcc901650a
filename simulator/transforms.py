"""Workload transforms: pure functions Workload -> Workload, and a declarative `TransformSpec` for them.

Each transform returns a new workload and leaves its input untouched:

- `time_scale`: multiply arrival times (and, separately, `gap_scale`: the gaps before calls).
- `rate_scale`: r times as many tasks per second, burstiness kept. ``compress`` (default) divides
  arrival times by r: the same tasks, the same burst shapes, in 1/r of the time. ``overlay`` keeps
  the time span: for r > 1 it lays ceil(r) copies of the arrival pattern over each other, each shifted
  circularly by a seeded random offset, then keeps a seeded sample of round(r × n) tasks; for r < 1
  it keeps a seeded sample of round(r × n) tasks (thinning).
- `gap_cap`: no gap longer than the cap (hour-long human pauses in a 10-minute test).
- `token_scale` with `context_cap`: scale input and output tokens; cap input + output per call (for
  a small-context test model: output first kept up to half the cap, the prompt keeps its head).
  Hash ids are rebuilt so prefix sharing survives: a new block is identified by the original
  block holding its last token and its own position, so any two prompts that shared a prefix still
  share it, scaled (block size unchanged).
- `filter_classes`, `sample`: keep some task classes; keep N tasks (seeded, arrival order kept).

`apply(workload, spec, seed)` runs the spec's transforms in a fixed order (filter, sample, rate,
time, gaps, gap cap, tokens) and records what it did in the workload's provenance.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Annotated, Literal, Optional

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from .errors import InputError
from .workload import Call, Provenance, SubTask, Task, Workload


class TransformSpec(BaseModel):
    """What to change in a workload (every field optional; the defaults change nothing)."""

    model_config = ConfigDict(extra="forbid")

    classes: Optional[list[str]] = None
    """Keep only tasks of these classes."""
    sample: Optional[Annotated[int, Field(ge=0)]] = None
    """Keep this many tasks, drawn with the seed."""
    rate_scale: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 1.0
    rate_mode: Literal["compress", "overlay"] = "compress"
    time_scale: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 1.0
    """Multiplies arrival times (2: half the rate, same pattern)."""
    gap_scale: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 1.0
    """Multiplies the gaps before calls."""
    gap_cap: Optional[Annotated[float, Field(ge=0, allow_inf_nan=False)]] = None
    """Seconds; longer gaps are cut to this."""
    token_scale: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 1.0
    context_cap: Optional[Annotated[int, Field(gt=1)]] = None
    """Most input + output tokens of one call."""

    def is_identity(self) -> bool:
        """True when applying the spec changes nothing."""
        return self == TransformSpec()


# ---------------------------------------------------------------- helpers


def _map_calls(task: Task, fn) -> Task:
    """The task with `fn` applied to every call of it and of its sub-tasks."""
    subs = tuple(dataclasses.replace(s, task=_map_calls(s.task, fn)) for s in task.subtasks)
    return dataclasses.replace(task, calls=tuple(fn(c) for c in task.calls), subtasks=subs)


def _with(workload: Workload, tasks, what: str, options: dict) -> Workload:
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
    # A copy is another user doing similar work, not the same prompt again: its hash ids move to a
    # range of their own so a prefix cache does not see copies as reuse.
    stride = 1 + max((i for c in workload.all_calls() for i in c.hash_ids), default=0)
    pool: list[Task] = []
    for k in range(copies):
        shift = 0.0 if k == 0 else float(rng.uniform(0, period))
        for t, a in zip(tasks, arrivals):
            copy = t if k == 0 else _map_calls(t, lambda c, off=k * stride: dataclasses.replace(c, hash_ids=tuple(i + off for i in c.hash_ids)))
            pool.append(dataclasses.replace(copy, id=t.id if k == 0 else f"{t.id}~{k}", arrival=t0 + (a + shift) % period))
    keep = min(len(pool), int(round(factor * n)))
    chosen = np.sort(rng.choice(len(pool), size=keep, replace=False))
    return _with(workload, [pool[i] for i in chosen], "rate_scale", {"factor": factor, "mode": mode, "seed": seed})


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
    """New hash ids for scaled prompts, consistent across the whole workload."""

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
        out = []
        for j in range(blocks):
            # Original block holding this new block's last token; equal original ids mean equal
            # prefixes, so (that id, position) names the same scaled content wherever it appears.
            k = int(((j + 1) * bs / self.factor - 1) // bs)
            out.append(self._id((call.hash_ids[k], j) if k < covered else ("fresh", call_key, j)))
        return tuple(out)


def token_scale(workload: Workload, factor: float = 1.0, context_cap: Optional[int] = None) -> Workload:
    """Input and output tokens × `factor`, then input + output capped at `context_cap` per call;
    hash ids rebuilt so shared prefixes stay shared (see the module doc)."""
    if factor <= 0:
        raise InputError("token scale must be > 0", field="token_scale")
    if context_cap is not None and context_cap < 2:
        raise InputError("context cap must be >= 2", field="context_cap")
    rehash = _Rehash(factor)
    counter = [0]

    def fix(call: Call) -> Call:
        inp = max(1, int(round(call.input_tokens * factor))) if call.input_tokens else 0
        out = int(round(call.output_tokens * factor))
        if context_cap is not None and inp + out > context_cap:
            out = min(out, context_cap // 2)
            inp = context_cap - out
        counter[0] += 1
        ids = rehash.call(call, inp, counter[0]) if factor != 1.0 else call.hash_ids[: inp // call.block_size] if call.block_size else call.hash_ids
        return dataclasses.replace(call, input_tokens=inp, output_tokens=out, hash_ids=ids)

    tasks = [_map_calls(t, fix) for t in workload.tasks]
    return _with(workload, tasks, "token_scale", {"factor": factor, "context_cap": context_cap})


def apply(workload: Workload, spec: TransformSpec, seed: int = 0) -> Workload:
    """Every transform the spec asks for, in the order filter, sample, rate, time, gaps, gap cap, tokens."""
    w = workload
    if spec.classes is not None:
        w = filter_classes(w, spec.classes)
    if spec.sample is not None:
        w = sample(w, spec.sample, seed)
    if spec.rate_scale != 1.0:
        w = rate_scale(w, spec.rate_scale, spec.rate_mode, seed)
    if spec.time_scale != 1.0:
        w = time_scale(w, spec.time_scale)
    if spec.gap_scale != 1.0:
        w = gap_scale(w, spec.gap_scale)
    if spec.gap_cap is not None:
        w = gap_cap(w, spec.gap_cap)
    if spec.token_scale != 1.0 or spec.context_cap is not None:
        w = token_scale(w, spec.token_scale, spec.context_cap)
    return w
