"""Fit a `WorkloadModel` from a `Workload`: per task class, arrivals and task structure.

Structure is modelled with conditional distributions rather than a copula: per-call quantities
(appended tokens, output tokens, the gap before the call) get one distribution per cell of
(position bucket, previous call's stop reason), falling back to coarser cells when a cell has too
few samples. Stop reasons follow a first-order Markov chain, so "a tool call is followed by a short
tool gap, an end of turn by a long human gap" comes out by itself. See docs/workload-model.md.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..errors import InputError
from ..workload import Call, Task, Workload, appended_tokens
from .arrivals import fit_arrivals
from .dists import Constant, fit_discrete, fit_empirical, fit_positive
from .schema import Cell, Reuse, RewritePairs, StopReasons, StopReuse, Structure, SubAgents, TaskClass, TaskStarts, WorkloadModel

POSITION_BUCKETS = [0, 1, 2, 4, 8, 16, 32, 64]
LENGTH_BUCKETS = [1, 9, 33]
"""Task-length classes (by calls per task: 1-8, 9-32, 33+): long tasks start with smaller prompts
and grow differently, so cells are also fitted per length class where they have the samples."""
MIN_CELL = 30
"""Samples a (position, previous stop) cell needs to get its own distributions."""
MIN_COMPONENT = 20
"""Samples a required component needs to be fitted without a fallback."""
MIN_PARTIAL = 10
"""Partial reuses after one stop reason needed for that stop reason's own partial-reuse distributions
(fewer than `MIN_COMPONENT`: they are rare, and pooling them with other stop reasons' loses what matters,
that a rewrite after `end_turn` appends a whole new context while one after a tool call drops a block)."""
START = "start"
UNKNOWN = "unknown"


def stop_label(call: Call) -> str:
    """The stop reason as a model label ('unknown' when the trace does not say)."""
    return call.stop_reason or UNKNOWN


def bucket_of(position: int, buckets: list[int]) -> int:
    """Start of the position bucket holding a call index."""
    start = buckets[0]
    for b in buckets:
        if position >= b:
            start = b
        else:
            break
    return start


@dataclass
class _Rows:
    """Per-call columns gathered from tasks."""

    bucket: list[int] = field(default_factory=list)
    length: list[int] = field(default_factory=list)
    prev: list[str] = field(default_factory=list)
    appended: list[float] = field(default_factory=list)
    output: list[float] = field(default_factory=list)
    gap: list[float] = field(default_factory=list)
    kept: list[bool] = field(default_factory=list)
    """Whether the call kept the whole previous prompt (always true for a first call)."""


class _Fitter:
    def __init__(self, allow_fallback: bool, notes: list[str]) -> None:
        self.allow_fallback = allow_fallback
        self.notes = notes

    def too_small(self, component: str, n: int, need: int, fallback: str) -> None:
        msg = f"{component}: only {n} sample(s), {need} needed to fit it"
        if not self.allow_fallback:
            raise InputError(f"trace too small: {msg} (rerun with --allow-fallback to use {fallback})")
        self.notes.append(f"fallback: {msg}; used {fallback}")

    def positive(self, component: str, x: list[float]):
        if len(x) < MIN_COMPONENT:
            self.too_small(component, len(x), MIN_COMPONENT, "the few samples' own distribution")
            if not x:
                return Constant(value=0.0)
            return fit_empirical(np.asarray(x), integer=bool(np.all(np.asarray(x) == np.rint(x)))) if len(x) > 1 else Constant(value=float(x[0]))
        return fit_positive(np.asarray(x))

    def structure(self, tasks: list[Task], component: str, parent: Optional[Structure] = None) -> Structure:
        rows = _Rows()
        stops_first: Counter = Counter()
        stops_after: dict[str, Counter] = defaultdict(Counter)
        full = 0
        partial_frac: list[float] = []
        partial_app: list[float] = []
        reuse_by_stop: dict[str, list] = defaultdict(lambda: [0, [], []])  # full count, fractions, appends
        block_size = 0
        context_limit = 1
        sub_tasks: list[Task] = []
        groups: list[int] = []
        waits = []
        later_calls = 0
        for task in tasks:
            prev: Optional[Call] = None
            for i, call in enumerate(task.calls):
                label = stop_label(call)
                context_limit = max(context_limit, call.input_tokens)
                rows.bucket.append(bucket_of(i, POSITION_BUCKETS))
                rows.length.append(bucket_of(len(task.calls), LENGTH_BUCKETS))
                rows.prev.append(START if prev is None else stop_label(prev))
                rows.output.append(call.output_tokens)
                rows.gap.append(call.gap)
                app = appended_tokens(call, prev)
                rows.appended.append(app)
                rows.kept.append(True)
                if prev is None:
                    stops_first[label] += 1
                else:
                    later_calls += 1
                    stops_after[stop_label(prev)][label] += 1
                    n_full, n_frac = full, len(partial_frac)
                    if call.hash_ids and prev.hash_ids and call.block_size == prev.block_size:
                        block_size = call.block_size
                        shared = 0
                        for a, b in zip(call.hash_ids, prev.hash_ids):
                            if a != b:
                                break
                            shared += 1
                        if shared >= len(prev.hash_ids):
                            full += 1
                        else:
                            partial_frac.append(shared / len(prev.hash_ids))
                            partial_app.append(app)
                            rows.kept[-1] = False
                    elif call.input_tokens >= prev.input_tokens:
                        full += 1
                    else:
                        partial_frac.append(call.input_tokens / max(1, prev.input_tokens))
                        partial_app.append(0.0)
                        rows.kept[-1] = False
                    by_stop = reuse_by_stop[stop_label(prev)]
                    by_stop[0] += full - n_full
                    by_stop[1].extend(partial_frac[n_frac:])
                    by_stop[2].extend(partial_app[n_frac:])
                prev = call
            per_call = Counter(s.after_call for s in task.subtasks)
            groups.extend(per_call.values())
            for s in task.subtasks:
                sub_tasks.append(s.task)
                waits.append(s.wait)
        ncalls = [len(t.calls) for t in tasks]
        starts = _starts(tasks)
        if len(tasks) < MIN_COMPONENT:
            self.too_small(f"{component}.calls_per_task", len(tasks), MIN_COMPONENT, "the observed counts")
        cells = self._cells(rows, component)
        reuse = _reuse(full, partial_frac, partial_app)
        if partial_frac:
            rows_by_stop = {}
            for label, (n_full, fracs, apps) in sorted(reuse_by_stop.items()):
                if n_full + len(fracs) >= MIN_CELL:
                    own = _reuse(n_full, fracs, apps) if len(fracs) >= MIN_PARTIAL else None
                    rows_by_stop[label] = StopReuse(
                        full_prob=round(n_full / (n_full + len(fracs)), 6),
                        partial_fraction=own.partial_fraction if own else None,
                        partial_appended=own.partial_appended if own else None,
                        partial_pairs=own.partial_pairs if own else None,
                    )
            reuse.after_stop = rows_by_stop
        stops = StopReasons(
            first={k: round(v / sum(stops_first.values()), 6) for k, v in sorted(stops_first.items())},
            after={p: {k: round(v / sum(row.values()), 6) for k, v in sorted(row.items())} for p, row in sorted(stops_after.items())},
        )
        subagents = None
        if sub_tasks:
            sub_structure = self.structure(sub_tasks, f"{component}.subagents.structure")
            subagents = SubAgents(
                spawn_prob=round(len(groups) / max(1, sum(ncalls)), 6),
                fan_out=fit_discrete(np.asarray(groups)),
                wait_prob=round(float(np.mean(waits)), 6),
                structure=sub_structure,
            )
        return Structure(
            calls_per_task=fit_discrete(np.asarray(ncalls)),
            stops=stops,
            position_buckets=POSITION_BUCKETS,
            length_buckets=LENGTH_BUCKETS,
            cells=cells,
            reuse=reuse,
            block_size=block_size or 64,
            context_limit=context_limit,
            starts=starts,
            subagents=subagents,
        )

    def _cells(self, rows: _Rows, component: str) -> list[Cell]:
        bucket = np.asarray(rows.bucket)
        length = np.asarray(rows.length)
        prev = np.asarray(rows.prev, dtype=object)
        cols = {k: np.asarray(getattr(rows, k), dtype=float) for k in ("appended", "output", "gap")}
        kept = np.asarray(rows.kept, dtype=bool)
        cells: list[Cell] = []

        def make(mask: np.ndarray, task_length, from_call, after_stop, where: str) -> Cell:
            fits, reports = {}, {}
            for name, col in cols.items():
                x = col[mask]
                if name == "appended" and (mask & kept).sum() >= MIN_COMPONENT:
                    # Calls that dropped part of the previous prompt append `reuse.partial_appended`
                    # instead; counting them here too would draw their large appends twice as often.
                    x = col[mask & kept]
                if len(x) < MIN_COMPONENT:
                    fits[name] = self.positive(f"{component}.{where}.{name}", x.tolist())
                    continue
                fits[name], reports[name] = fit_positive(x)
            return Cell(task_length=task_length, from_call=from_call, after_stop=after_stop,
                        samples=int(mask.sum()), fit=reports, **fits)

        first = bucket == 0
        later = ~first
        # The catch-all cells must exist (too few samples: an error or, if allowed, a fallback) ...
        cells.append(make(first, None, 0, START, "first call"))
        if later.any():
            cells.append(make(later, None, None, None, "later calls"))
        # ... the finer ones only where they have the samples.
        for task_length in [None] + (LENGTH_BUCKETS if len(set(length.tolist())) > 1 else []):
            scope = np.ones(len(bucket), bool) if task_length is None else length == task_length
            tag = "" if task_length is None else f"tasks of {task_length}+ calls, "

            def maybe(mask, from_call, after_stop, where):
                if mask.sum() >= MIN_CELL:
                    cells.append(make(mask, task_length, from_call, after_stop, tag + where))

            if task_length is not None:
                maybe(scope & first, 0, START, "first call")
                maybe(scope & later, None, None, "later calls")
            for label in sorted(set(prev[later].tolist())):
                maybe(scope & later & (prev == label), None, label, f"after {label}")
            for b in POSITION_BUCKETS[1:]:
                mb = scope & (bucket == b)
                maybe(mb, b, None, f"from call {b}")
                for label in sorted(set(prev[mb].tolist())):
                    maybe(mb & (prev == label), b, label, f"from call {b} after {label}")
        return cells


def _starts(tasks: list[Task]) -> Optional[TaskStarts]:
    """Each task's number of calls and first prompt, sorted by calls (None without tasks with calls)."""
    rows = sorted((len(t.calls), max(1, t.calls[0].input_tokens)) for t in tasks if t.calls)
    if not rows:
        return None
    return TaskStarts(calls=[n for n, _ in rows], first_input=[f for _, f in rows])


def _reuse(full: int, partial_frac: list[float], partial_app: list[float]) -> Reuse:
    """Reuse from the count of full reuses and each partial reuse's kept fraction and appended tokens."""
    if not partial_frac:
        return Reuse(full_prob=1.0)
    return Reuse(
        full_prob=round(full / (full + len(partial_frac)), 6),
        partial_fraction=fit_empirical(np.asarray(partial_frac)) if len(partial_frac) > 1 else Constant(value=partial_frac[0]),
        partial_appended=fit_empirical(np.asarray(partial_app), integer=True) if len(partial_app) > 1 else Constant(value=partial_app[0], integer=True),
        # The pairs are what generation draws: how much a rewrite keeps and how much it appends go together.
        partial_pairs=RewritePairs(kept=[round(min(max(f, 0.0), 1.0), 6) for f in partial_frac],
                                   appended=[int(round(a)) for a in partial_app]),
    )


def fit_model(
    workload: Workload,
    *,
    allow_fallback: bool = False,
    classes: bool = True,
) -> WorkloadModel:
    """Fit a model: one class per task class in the workload (or one class when `classes` is False)."""
    notes: list[str] = []
    fitter = _Fitter(allow_fallback, notes)
    by_class: dict[str, list[Task]] = defaultdict(list)
    for task in workload.tasks:
        by_class[task.task_class if classes else "default"].append(task)
    if not by_class:
        raise InputError("the workload has no tasks to fit")
    total = len(workload.tasks)
    fitted = {}
    for name in sorted(by_class):
        tasks = by_class[name]
        arrivals = fit_arrivals(np.asarray([t.arrival for t in tasks]))
        if arrivals.note:
            notes.append(f"class {name}: {arrivals.note}")
        fitted[name] = TaskClass(
            share=round(len(tasks) / total, 6),
            arrivals=arrivals,
            structure=fitter.structure(tasks, f"class {name}"),
        )
    source = [f"{p.source} ({p.format})" for p in workload.provenance]
    return WorkloadModel(source=source, notes=notes, classes=fitted)
