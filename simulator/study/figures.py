"""What one point measured, read back from its result folder: the summary's figures the study uses,
whether the SLOs held, and per completed task its tokens (for the API price) and completion time.

Whether a point holds its SLO also asks whether it could go on holding it: a finite run a little over
the server's capacity can end before its queue has grown past the SLO's bound. Every load point of a
config and repeat replays the same tasks (only closer together or further apart), so a task's extra
time at this point over the same task at a lower load (`baseline`) is what the load added to it, with
the task's own length (its calls, its tool time) taken out. With a task SLO and `max_growth`, the trend
of that extra time over arrival time is estimated (Theil-Sen slope, which a stall's bump barely moves,
with its 90% interval): a point whose slope's lower bound is above zero and whose extra time grew over
its arrivals by more than `max_growth` x the task SLO's per-item bound is not sustainable, and does not
hold. A steady queue, however long, passes; a growing one fails however short the run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
from scipy.stats import theilslopes

from ..metrics import results
from ..metrics.results import Window
from ..metrics.slo import Slo
from ..metrics.summary import Summary


@dataclass
class TaskTokens:
    """Tokens of the completed top-level tasks (with their sub-tasks' calls), summed."""

    tasks: int = 0
    input: int = 0
    """Prompt tokens, cached ones included."""
    cached: int = 0
    output: int = 0


@dataclass
class FleetPoint:
    """What a fleet point's router did, from its summary's ``fleet`` section
    (`simulator.metrics.fleet.FleetFigures`)."""

    replicas: int
    policy: str
    prefix_hit_share: Optional[float] = None
    """The fleet's prefix-cache hits over queries (tokens), from the replicas' /metrics."""
    imbalance: Optional[float] = None
    """Most calls on one replica over the mean per replica (1: even)."""
    call_share_cv: Optional[float] = None
    """Coefficient of variation of the replicas' call counts."""
    moved_share: Optional[float] = None
    """Share of the tasks with two or more calls whose calls went to more than one replica."""
    moves_per_task: Optional[float] = None
    """Moves (a call on another replica than its task's previous call) per such task."""
    waiting_mean: Optional[float] = None
    """Requests waiting in a replica's queue, the mean over the run and over the replicas."""


def fleet_point(summary: Summary) -> Optional[FleetPoint]:
    """The router figures of a point's summary (None: not a fleet run)."""
    fleet = summary.fleet
    if fleet is None:
        return None
    waiting = [r.waiting_mean for r in fleet.replicas if r.waiting_mean is not None]
    return FleetPoint(replicas=len(fleet.replicas), policy=fleet.policy, prefix_hit_share=fleet.prefix_hit_share,
                      imbalance=fleet.imbalance, call_share_cv=fleet.call_share_cv,
                      moved_share=fleet.moves.moved_share, moves_per_task=fleet.moves.moves_per_task,
                      waiting_mean=sum(waiting) / len(waiting) if waiting else None)


@dataclass
class PointFigures:
    """The figures of one point."""

    slo_met: Optional[bool]
    """Every SLO target held and no more than the allowed share of tasks failed (None: no SLO)."""
    throughput_tasks_per_hour: float
    goodput_tasks_per_hour: Optional[float]
    output_tokens_per_s: float
    requests_per_s: float
    task_p50_s: float
    task_p95_s: float
    ttft_p95_ms: float
    tasks_completed: int
    tasks_not_completed: int
    """Judged top-level tasks that did not complete: failed, cancelled, interrupted or never started."""
    tasks_judged: Optional[int] = None
    """The run's judged tasks (`simulator.metrics.summary.TaskFigures.judged`)."""
    arrival_span_s: float = 0.0
    """Seconds from the first to the last arrival of the window's top-level tasks that started."""
    task_slo_s: dict[str, Optional[float]] = field(default_factory=dict)
    """The task SLO's percentiles as its check measured them (over every judged task: None when the
    percentile fell among tasks that did not complete)."""
    busy_fraction: Optional[float] = None
    """Share of the run the twin's engine was busy (simulations only)."""
    growth: Optional[float] = None
    """Seconds of task completion time gained per second of arrivals (Theil-Sen slope): 0 when the
    queue is steady, the overload share when it grows."""
    growth_over_run_s: Optional[float] = None
    """`growth` times the span of the window's arrivals."""
    growing: bool = False
    """The slope's lower confidence bound is above 0 and the growth over the run exceeds the allowed share."""
    growth_baseline: Optional[float] = None
    """The load of the point the extra time is measured against."""
    tokens: TaskTokens = field(default_factory=TaskTokens)
    task_times: dict[str, tuple[float, float]] = field(default_factory=dict, repr=False)
    """(arrival, completion time) of the window's completed top-level tasks by id (not saved)."""
    held: Optional[bool] = None
    """The SLO's targets and the failed share, before the growth check (None: no SLO)."""
    fleet: Optional[FleetPoint] = None
    """A fleet point's router figures (None: one server)."""
    joules_per_task: Optional[float] = None
    """The GPUs' joules over the window per completed task (the summary's ``energy``; None: not measured)."""
    joules_per_output_token: Optional[float] = None
    """The same joules per output token."""
    energy_source: Optional[str] = field(default=None, repr=False)
    """Where they come from (the summary's ``energy.source``; not saved)."""
    task_classes: dict[str, str] = field(default_factory=dict, repr=False)
    """The class of each completed top-level task of the window, by id (not saved)."""
    ttft_times: dict[str, float] = field(default_factory=dict, repr=False)
    """Seconds each completed top-level task of the window spent before first tokens (its calls' queueing
    and prefill: the task record's ``time_in_ttft``), by id (not saved)."""
    class_tokens: dict[str, TaskTokens] = field(default_factory=dict, repr=False)
    """Per task class, the tokens of the completed top-level tasks (as `tokens`; not saved)."""
    uncounted_cache: set[str] = field(default_factory=set, repr=False)
    """Task classes with a call whose server did not report its cached prompt tokens (not saved)."""

    @property
    def completion_times(self) -> list[float]:
        """Seconds, of the completed top-level tasks in the window."""
        return [t for _, t in self.task_times.values()]

    def to_dict(self) -> dict[str, Any]:
        """The figures as a point in study.json holds them."""
        out = asdict(self)
        for name in ("task_times", "held", "task_classes", "ttft_times", "class_tokens", "uncounted_cache",
                     "energy_source"):
            del out[name]
        for name in ("fleet", "joules_per_task", "joules_per_output_token"):
            if out[name] is None:  # absent, not null: a study without them writes what it wrote before
                del out[name]
        return out

    def judge_growth(self, baseline: PointFigures, load: Optional[float], bound: Optional[float],
                     max_growth: Optional[float]) -> None:
        """Measure the trend of this point's extra task time over `baseline`'s (at load `load`), and fail
        the SLO when it grows (see the module doc)."""
        shared = [k for k in self.task_times if k in baseline.task_times]
        arrivals = [self.task_times[k][0] for k in shared]
        extra = [self.task_times[k][1] - baseline.task_times[k][1] for k in shared]
        self.growth, self.growth_over_run_s, self.growing = growth(arrivals, extra, bound, max_growth)
        self.growth_baseline = load
        if self.growing and self.slo_met:
            self.slo_met = False


def slo_met(summary: Summary, slo: Slo, max_failed_share: float) -> Optional[bool]:
    """Whether the point held its SLO's targets: each one given (task, TTFT, TPOT) met, and failed or
    cancelled tasks no more than `max_failed_share` of the window's; None when the SLO names no target."""
    checks = [getattr(summary.slo, name) for name in ("task_s", "ttft_ms", "tpot_ms") if getattr(slo, name)]
    if not checks:
        return None
    tasks = summary.tasks
    judged = tasks.judged if tasks.judged is not None else tasks.completed + tasks.not_completed
    failed_share = tasks.not_completed / judged if judged else 1.0
    return all(c is not None and c.met for c in checks) and failed_share <= max_failed_share and tasks.completed > 0


def growth(arrivals: list[float], times: list[float], bound: Optional[float],
           max_growth: Optional[float]) -> tuple[Optional[float], Optional[float], bool]:
    """(slope, slope x arrival span, growing) of `times` (a task's extra time) over arrival time (see the
    module doc); at most 1000 tasks, evenly picked in arrival order, keep the estimate cheap."""
    if len(times) < 8:
        return None, None, False
    order = np.argsort(arrivals)
    pick = order[np.linspace(0, len(order) - 1, min(len(order), 1000)).astype(int)]
    x, y = np.asarray(arrivals)[pick], np.asarray(times)[pick]
    span = float(x[-1] - x[0])
    if span <= 0:
        return None, None, False
    fit = theilslopes(y, x, alpha=0.9)
    over_run = float(fit.slope) * span
    growing = bound is not None and max_growth is not None and fit.low_slope > 0 and over_run > max_growth * bound
    return float(fit.slope), over_run, bool(growing)


def point_figures(folder: Path, summary: Summary, slo: Slo, max_failed_share: float) -> PointFigures:
    """The point's figures from its summary and records (the growth check needs a baseline point:
    `PointFigures.judge_growth`)."""
    tasks = summary.tasks
    task_times, tokens, span, by_class = _completed_tasks(Path(folder), summary.window)
    task_check = summary.slo.task_s
    held = slo_met(summary, slo, max_failed_share)
    return PointFigures(
        slo_met=held, held=held,
        throughput_tasks_per_hour=tasks.throughput_per_hour,
        goodput_tasks_per_hour=tasks.goodput_per_hour,
        output_tokens_per_s=summary.output_throughput,
        requests_per_s=summary.request_throughput,
        task_p50_s=tasks.completion_time_s.p50,
        task_p95_s=tasks.completion_time_s.p95,
        ttft_p95_ms=summary.ttft.p95,
        tasks_completed=tasks.completed,
        tasks_not_completed=tasks.not_completed,
        tasks_judged=tasks.judged,
        arrival_span_s=span,
        task_slo_s={key: c.measured for key, c in task_check.percentiles.items()} if task_check else {},
        busy_fraction=summary.simulation.busy_fraction if summary.simulation is not None else None,
        tokens=tokens,
        task_times=task_times,
        fleet=fleet_point(summary),
        joules_per_task=summary.energy.joules_per_task if summary.energy is not None else None,
        joules_per_output_token=summary.energy.joules_per_output_token if summary.energy is not None else None,
        energy_source=summary.energy.source if summary.energy is not None else None,
        task_classes=by_class.classes,
        ttft_times=by_class.ttft,
        class_tokens=by_class.tokens,
        uncounted_cache=by_class.uncounted,
    )




@dataclass
class _ByClass:
    """What the completed top-level tasks of a point hold per task: its class, its time before first
    tokens, and per class their tokens."""

    classes: dict[str, str] = field(default_factory=dict)
    ttft: dict[str, float] = field(default_factory=dict)
    tokens: dict[str, TaskTokens] = field(default_factory=dict)
    uncounted: set[str] = field(default_factory=set)
    """Classes with a call that did not report its cached tokens."""


def _completed_tasks(folder: Path, window: Window) -> tuple[dict[str, tuple[float, float]], TaskTokens, float,
                                                            _ByClass]:
    """(arrival, completion time) of the window's completed top-level tasks by id, the tokens of their
    calls (their sub-tasks' included; successful attempts only), the span of the window's top-level
    arrivals (of the tasks that started), and the same tasks' classes, times before first tokens and
    tokens per class."""
    parent: dict[str, Optional[str]] = {}
    done: dict[str, tuple[float, float]] = {}
    by_class = _ByClass()
    first = last = None
    for t in results.iter_tasks(folder):
        parent[t.task_id] = t.parent_id
        if t.parent_id is None and window.contains(t.arrival):
            first = t.arrival if first is None else min(first, t.arrival)
            last = t.arrival if last is None else max(last, t.arrival)
            if t.ok:
                done[t.task_id] = (t.arrival, t.completion_time)
                by_class.classes[t.task_id] = t.task_class
                by_class.ttft[t.task_id] = t.time_in_ttft

    def root(task_id: str) -> str:
        seen = 0
        while parent.get(task_id) is not None and seen < 64:  # bounded: a malformed chain cannot loop
            task_id, seen = parent[task_id], seen + 1
        return task_id

    tokens = TaskTokens(tasks=len(done))
    for c in results.iter_calls(folder):
        top = root(c.task_id) if c.ok else None
        if top in done:
            tokens.input += c.input_tokens
            tokens.cached += c.cached_tokens or 0
            tokens.output += c.output_tokens
            group = by_class.tokens.get(by_class.classes[top])
            if group is None:
                group = by_class.tokens[by_class.classes[top]] = TaskTokens()
            group.input += c.input_tokens
            group.cached += c.cached_tokens or 0
            group.output += c.output_tokens
            if c.cached_tokens is None:
                by_class.uncounted.add(by_class.classes[top])
    for task_class in by_class.classes.values():
        by_class.tokens.setdefault(task_class, TaskTokens()).tasks += 1
    return done, tokens, (last - first) if first is not None else 0.0, by_class
