"""A fleet config's part of study.json (`simulator.study.model.FleetResult`): its size and GPUs, its
capacity per GPU, and what its router traded between cache hits and balance, overall and per task
class, at the config's ranking points."""

from __future__ import annotations

import statistics
from typing import Optional, Sequence

import numpy as np

from . import cost
from .capacity import Capacity
from .configs import Config
from .fleets import router_label
from .figures import TaskTokens
from .model import FleetResult, TaskClassTrade
from .points import PointResult
from .schema import CostSpec


def fleet_result(config: Config, capacity: Optional[Capacity], points: Sequence[PointResult],
                 cost_spec: Optional[CostSpec]) -> Optional[FleetResult]:
    """The fleet part of config `config`, from its capacity and its ranking points (None: not a fleet)."""
    if config.fleet is None:
        return None
    gpus = cost.gpus_of(cost_spec, config.replicas)
    per_gpu = ci = at_least = None
    if capacity is not None and capacity.rate is not None:
        per_gpu = capacity.rate * 60 / gpus
        ci = (capacity.ci[0] * 60 / gpus, capacity.ci[1] * 60 / gpus) if capacity.ci else None
    elif capacity is not None and capacity.status == "above_range" and capacity.at_least is not None:
        at_least = capacity.at_least * 60 / gpus
    ok = [p for p in points if p.ok]
    routed = [p.figures.fleet for p in ok if p.figures.fleet is not None]
    classes = sorted({c for p in ok for c in p.figures.task_classes.values()})
    return FleetResult(
        replicas=config.replicas, policy=config.fleet.router.policy, router=router_label(config.fleet),
        gpus_per_replica=cost.gpus_of(cost_spec), gpus=gpus, per_gpu_per_min=per_gpu, per_gpu_ci_per_min=ci,
        per_gpu_at_least_per_min=at_least, points=len(routed),
        prefix_hit_share=_mean([f.prefix_hit_share for f in routed]),
        cached_share=_cached_share(ok, None),
        imbalance=_mean([f.imbalance for f in routed]), call_share_cv=_mean([f.call_share_cv for f in routed]),
        moved_share=_mean([f.moved_share for f in routed]), moves_per_task=_mean([f.moves_per_task for f in routed]),
        waiting_mean=_mean([f.waiting_mean for f in routed]),
        ttft_per_task_s=_ttft_per_task(ok, None),
        by_class={name: _class_trade(ok, name) for name in classes})


def _class_trade(points: Sequence[PointResult], task_class: str) -> TaskClassTrade:
    """One task class over the points, its tasks pooled."""
    times = [t for p in points for task_id, (_, t) in p.figures.task_times.items()
             if p.figures.task_classes.get(task_id) == task_class]
    return TaskClassTrade(
        tasks=len(times), cached_share=_cached_share(points, task_class), ttft_per_task_s=_ttft_per_task(points, task_class),
        task_p50_s=float(np.percentile(times, 50)) if times else None,
        task_p95_s=float(np.percentile(times, 95)) if times else None)


def _cached_share(points: Sequence[PointResult], task_class: Optional[str]) -> Optional[float]:
    """Cached over all prompt tokens of the completed tasks of `task_class` (None: every class), or
    None when a call of them did not report its cached tokens or there were none."""
    total = TaskTokens()
    for p in points:
        for name, tokens in p.figures.class_tokens.items():
            if task_class is not None and name != task_class:
                continue
            if name in p.figures.uncounted_cache:
                return None
            total.input += tokens.input
            total.cached += tokens.cached
    return total.cached / total.input if total.input else None


def _ttft_per_task(points: Sequence[PointResult], task_class: Optional[str]) -> Optional[float]:
    """Mean seconds before first tokens per completed task of `task_class` (None: every class)."""
    times = [t for p in points for task_id, t in p.figures.ttft_times.items()
             if task_class is None or p.figures.task_classes.get(task_id) == task_class]
    return statistics.fmean(times) if times else None


def _mean(values: list[Optional[float]]) -> Optional[float]:
    """The mean of the values that are known (None: none is)."""
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None
