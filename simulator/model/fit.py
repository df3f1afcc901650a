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


@dataclass
class _ReuseTally:
    """Later calls that kept the whole previous prompt (a count), and each partial reuse's kept
    fraction of the previous prompt and appended tokens."""

    full: int = 0
    fractions: list[float] = field(default_factory=list)
    appended: list[float] = field(default_factory=list)

    def fit(self) -> Reuse:
        """The `Reuse` of these calls (without `after_stop`)."""
        fracs, apps = self.fractions, self.appended
        if not fracs:
            return Reuse(full_prob=1.0)
        return Reuse(
            full_prob=round(self.full / (self.full + len(fracs)), 6),
            partial_fraction=fit_empirical(np.asarray(fracs)) if len(fracs) > 1 else Constant(value=fracs[0]),
            partial_appended=fit_empirical(np.asarray(apps), integer=True) if len(apps) > 1 else Constant(value=apps[0], integer=True),
            # The pairs are what generation draws: how much a rewrite keeps and how much it appends go together.
            partial_pairs=RewritePairs(kept=[round(min(max(f, 0.0), 1.0), 6) for f in fracs],
                                       appended=[int(round(a)) for a in apps]),
        )


def _same_blocks(call: Call, prev: Call) -> bool:
    """Whether two consecutive calls both carry hash ids, of one block size (so the ids compare)."""
    return bool(call.hash_ids and prev.hash_ids and call.block_size == prev.block_size)


def _shared_prefix(ids: tuple[int, ...], prev_ids: tuple[int, ...]) -> int:
    """Number of leading hash ids two prompts have in common."""
    shared = 0
    for a, b in zip(ids, prev_ids):
        if a != b:
            break
        shared += 1
    return shared


def _partial_reuse(call: Call, prev: Call, appended: float) -> Optional[tuple[float, float]]:
    """None when `call` keeps the whole of `prev`'s prompt; else the (kept fraction, appended tokens)
    of its partial reuse. With hash ids of one block size on both, that is the share of `prev`'s ids
    it starts with (and its `appended` tokens); without, only a shorter prompt counts as a partial
    reuse, keeping input / previous input and appending nothing."""
    if _same_blocks(call, prev):
        shared = _shared_prefix(call.hash_ids, prev.hash_ids)
        return None if shared >= len(prev.hash_ids) else (shared / len(prev.hash_ids), appended)
    if call.input_tokens >= prev.input_tokens:
        return None
    return call.input_tokens / max(1, prev.input_tokens), 0.0


@dataclass
class _Observed:
    """Everything `_Fitter.structure` fits, gathered call by call from a set of tasks."""

    rows: _Rows = field(default_factory=_Rows)
    stops_first: Counter = field(default_factory=Counter)
    stops_after: defaultdict = field(default_factory=lambda: defaultdict(Counter))
    """Per previous stop reason, the counts of the next call's."""
    reuse: _ReuseTally = field(default_factory=_ReuseTally)
    reuse_after: defaultdict = field(default_factory=lambda: defaultdict(_ReuseTally))
    """The same tally per previous stop reason."""
    block_size: int = 0
    """Block size of the last pair of consecutive calls that both carry hash ids of one block size."""
    context_limit: int = 1
    sub_tasks: list[Task] = field(default_factory=list)
    fan_out: list[int] = field(default_factory=list)
    """Sub-tasks started after each call that starts any."""
    waits: list[bool] = field(default_factory=list)

    def add_task(self, task: Task) -> None:
        """Gather one task's calls, and its sub-tasks (for a fit of their own)."""
        prev: Optional[Call] = None
        for i, call in enumerate(task.calls):
            self._add_call(call, prev, i, len(task.calls))
            prev = call
        self.fan_out.extend(Counter(s.after_call for s in task.subtasks).values())
        for s in task.subtasks:
            self.sub_tasks.append(s.task)
            self.waits.append(s.wait)

    def _add_call(self, call: Call, prev: Optional[Call], position: int, task_calls: int) -> None:
        """One call's row, its stop reason after the previous one's, and how it reused the previous prompt."""
        label = stop_label(call)
        self.context_limit = max(self.context_limit, call.input_tokens)
        rows = self.rows
        rows.bucket.append(bucket_of(position, POSITION_BUCKETS))
        rows.length.append(bucket_of(task_calls, LENGTH_BUCKETS))
        rows.prev.append(START if prev is None else stop_label(prev))
        rows.output.append(call.output_tokens)
        rows.gap.append(call.gap)
        app = appended_tokens(call, prev)
        rows.appended.append(app)
        if prev is None:
            self.stops_first[label] += 1
            rows.kept.append(True)
            return
        self.stops_after[stop_label(prev)][label] += 1
        if _same_blocks(call, prev):
            self.block_size = call.block_size
        partial = _partial_reuse(call, prev, app)
        rows.kept.append(partial is None)
        for tally in (self.reuse, self.reuse_after[stop_label(prev)]):
            if partial is None:
                tally.full += 1
            else:
                tally.fractions.append(partial[0])
                tally.appended.append(partial[1])


class _Fitter:
    """Fits structures, noting (or, without `allow_fallback`, refusing) components with too few samples."""

    def __init__(self, allow_fallback: bool, notes: list[str]) -> None:
        self.allow_fallback = allow_fallback
        self.notes = notes

    def too_small(self, component: str, n: int, need: int, fallback: str) -> None:
        """Raise, or note the fallback, for a component with `n` samples of the `need`ed."""
        msg = f"{component}: only {n} sample(s), {need} needed to fit it"
        if not self.allow_fallback:
            raise InputError(f"trace too small: {msg} (rerun with --allow-fallback to use {fallback})")
        self.notes.append(f"fallback: {msg}; used {fallback}")

    def few_samples(self, component: str, x: list[float]):
        """The own distribution of fewer than `MIN_COMPONENT` samples, once `too_small` allows it."""
        self.too_small(component, len(x), MIN_COMPONENT, "the few samples' own distribution")
        if not x:
            return Constant(value=0.0)
        if len(x) == 1:
            return Constant(value=float(x[0]))
        return fit_empirical(np.asarray(x), integer=bool(np.all(np.asarray(x) == np.rint(x))))

    def structure(self, tasks: list[Task], component: str) -> Structure:
        """The structure of `tasks`: calls per task, stop-reason chain, per-cell distributions, prefix
        reuse, first prompts and (fitted the same way on their sub-tasks) sub-agents."""
        seen = _Observed()
        for task in tasks:
            seen.add_task(task)
        ncalls = [len(t.calls) for t in tasks]
        if len(tasks) < MIN_COMPONENT:
            self.too_small(f"{component}.calls_per_task", len(tasks), MIN_COMPONENT, "the observed counts")
        cells = self._cells(seen.rows, component)
        reuse = seen.reuse.fit()
        if seen.reuse.fractions:
            reuse.after_stop = _reuse_after_stop(seen.reuse_after)
        return Structure(
            calls_per_task=fit_discrete(np.asarray(ncalls)),
            stops=_stop_reasons(seen.stops_first, seen.stops_after),
            position_buckets=POSITION_BUCKETS,
            length_buckets=LENGTH_BUCKETS,
            cells=cells,
            reuse=reuse,
            block_size=seen.block_size or 64,
            context_limit=seen.context_limit,
            starts=_starts(tasks),
            subagents=self._subagents(seen, sum(ncalls), component),
        )

    def _subagents(self, seen: _Observed, calls: int, component: str) -> Optional[SubAgents]:
        """Sub-agents of tasks with `calls` calls in all, from the sub-tasks they started (None if none)."""
        if not seen.sub_tasks:
            return None
        return SubAgents(
            spawn_prob=round(len(seen.fan_out) / max(1, calls), 6),
            fan_out=fit_discrete(np.asarray(seen.fan_out)),
            wait_prob=round(float(np.mean(seen.waits)), 6),
            structure=self.structure(seen.sub_tasks, f"{component}.subagents.structure"),
        )

    def _cells(self, rows: _Rows, component: str) -> list[Cell]:
        """Per-call distributions: the catch-all first-call and later-call cells, then finer cells (by
        length class, previous stop reason, position bucket) where they have `MIN_CELL` samples."""
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
                    fits[name] = self.few_samples(f"{component}.{where}.{name}", x.tolist())
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


def _stop_reasons(first: Counter, after: dict[str, Counter]) -> StopReasons:
    """The stop-reason chain from counts of first calls' stop reasons and of each one after another."""
    return StopReasons(
        first={k: round(v / sum(first.values()), 6) for k, v in sorted(first.items())},
        after={p: {k: round(v / sum(row.values()), 6) for k, v in sorted(row.items())} for p, row in sorted(after.items())},
    )


def _reuse_after_stop(tallies: dict[str, _ReuseTally]) -> dict[str, StopReuse]:
    """Reuse per previous stop reason, for those with `MIN_CELL` later calls after them; their own
    partial-reuse distributions only with `MIN_PARTIAL` partial reuses (else they use the pooled ones)."""
    rows = {}
    for label, tally in sorted(tallies.items()):
        calls = tally.full + len(tally.fractions)
        if calls >= MIN_CELL:
            own = tally.fit() if len(tally.fractions) >= MIN_PARTIAL else None
            rows[label] = StopReuse(
                full_prob=round(tally.full / calls, 6),
                partial_fraction=own.partial_fraction if own else None,
                partial_appended=own.partial_appended if own else None,
                partial_pairs=own.partial_pairs if own else None,
            )
    return rows


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
