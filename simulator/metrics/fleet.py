"""The figures of a fleet run (summary.json's ``fleet`` section): per replica, what it served (from its
own /metrics: the live replicas' scrapes, or the twin's), what the client saw it answer (the replica
named in each call record), and for the fleet the balance between replicas and how often a task moved.

Built the same way for a live fleet and the twin's (`fleet_figures`): the replicas' /metrics timelines
come in as `simulator.metrics.server.timeline_summary` sections, the call and task records from the
result folder.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from typing import Any, Iterable, Mapping, Optional, Sequence

from .records import CallRecord
from .figures import Figures


class ReplicaFigures(Figures):
    """One replica of a fleet over the run."""

    name: str = ""
    url: Optional[str] = None
    """Its URL (credentials masked); None on the twin."""
    served: Optional[int] = None
    """Requests it finished, by its /metrics (``vllm:request_success_total`` over the run)."""
    client_calls: int = 0
    """Calls whose response named it (the replica header, or the twin's choice)."""
    call_share: Optional[float] = None
    """Its share of the fleet's `served` (of `client_calls` where a replica has no /metrics)."""
    prompt_tokens: Optional[int] = None
    """Prompt tokens it processed, by its /metrics."""
    generation_tokens: Optional[int] = None
    prefix_hit_share: Optional[float] = None
    """Prefix-cache hits over queries (tokens), by its /metrics."""
    waiting_mean: Optional[float] = None
    waiting_max: Optional[float] = None
    running_mean: Optional[float] = None
    running_max: Optional[float] = None
    kv_usage_mean: Optional[float] = None
    kv_usage_max: Optional[float] = None
    state: str = "up"
    """'up', or 'died' when it exited during the run (`note` says how)."""
    note: Optional[str] = None


class TaskMoves(Figures):
    """How often a task's consecutive calls went to different replicas (calls with a known replica)."""

    tasks: int = 0
    """Tasks (sub-agents included) with two or more calls whose replica is known."""
    moved: int = 0
    """Of those, tasks with at least one move."""
    moved_share: Optional[float] = None
    moves: int = 0
    """Moves in all (a call on another replica than its task's previous call)."""
    moves_per_task: Optional[float] = None


class FleetFigures(Figures):
    """A fleet run: its replicas, the router, the balance and the moves."""

    replicas: list[ReplicaFigures] = []
    policy: str = ""
    """The router's policy (on the twin: the policy model's name)."""
    router_url: Optional[str] = None
    served: Optional[int] = None
    """Requests the replicas finished, summed (None when a replica has no /metrics)."""
    client_calls: int = 0
    """Calls the client got an answer to (attempts with a status)."""
    accounted: Optional[bool] = None
    """Whether `served` equals `client_calls`: every answered call is in a replica's count."""
    prefix_hit_share: Optional[float] = None
    """The fleet's prefix-cache hits over queries (tokens), summed over replicas."""
    imbalance: Optional[float] = None
    """Most calls on one replica over the mean per replica (1: even)."""
    call_share_cv: Optional[float] = None
    """Coefficient of variation of the replicas' call counts."""
    moves: TaskMoves = TaskMoves()
    died: list[str] = []
    """Replicas that exited during the run."""


def replica_calls(calls: Iterable[CallRecord]) -> Counter:
    """Calls answered per replica name (records that name one)."""
    return Counter(c.replica for c in calls if c.replica is not None and c.status is not None)


def task_moves(calls: Iterable[CallRecord]) -> TaskMoves:
    """How often tasks moved between replicas, from the call records (ordered by send time per task)."""
    by_task: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for c in calls:
        if c.replica is not None:
            by_task[c.task_id].append((c.actual_send, c.replica))
    tasks = moved = moves = 0
    for seq in by_task.values():
        if len(seq) < 2:
            continue
        seq.sort()
        tasks += 1
        n = sum(1 for (_, a), (_, b) in zip(seq, seq[1:]) if a != b)
        moves += n
        moved += n > 0
    return TaskMoves(tasks=tasks, moved=moved, moved_share=moved / tasks if tasks else None, moves=moves,
                     moves_per_task=moves / tasks if tasks else None)


def _increase(section: Mapping[str, Any], key: str) -> Optional[float]:
    """A counter's increase over the run in a timeline summary (None when never sampled)."""
    value = section.get(f"{key}_delta")
    return None if value is None else float(value)


def _gauge(section: Mapping[str, Any], key: str, stat: str) -> Optional[float]:
    value = section.get(key)
    return None if not isinstance(value, Mapping) else value.get(stat)


def fleet_figures(names: Sequence[str], calls: Sequence[CallRecord], timelines: Mapping[str, Mapping[str, Any]], *,
                  policy: str, urls: Optional[Mapping[str, str]] = None, router_url: Optional[str] = None,
                  died: Optional[Mapping[str, str]] = None) -> FleetFigures:
    """The fleet section: `names` the replicas in order, `calls` the run's call records, `timelines`
    each replica's /metrics timeline summary (`simulator.metrics.server.timeline_summary`; a replica
    left out has none), `died` the replicas that exited and how."""
    died = dict(died or {})
    counted = replica_calls(calls)
    replicas = []
    for name in names:
        t = timelines.get(name, {})
        served = _increase(t, "request_success")
        queries, hits = _increase(t, "prefix_cache_queries"), _increase(t, "prefix_cache_hits")
        prompt, generated = _increase(t, "prompt_tokens"), _increase(t, "generation_tokens")
        replicas.append(ReplicaFigures(
            name=name, url=(urls or {}).get(name), served=None if served is None else round(served),
            client_calls=counted.get(name, 0),
            prompt_tokens=None if prompt is None else round(prompt),
            generation_tokens=None if generated is None else round(generated),
            prefix_hit_share=hits / queries if queries and hits is not None else None,
            waiting_mean=_gauge(t, "num_requests_waiting", "mean"), waiting_max=_gauge(t, "num_requests_waiting", "max"),
            running_mean=_gauge(t, "num_requests_running", "mean"), running_max=_gauge(t, "num_requests_running", "max"),
            kv_usage_mean=_gauge(t, "kv_cache_usage_perc", "mean"), kv_usage_max=_gauge(t, "kv_cache_usage_perc", "max"),
            state="died" if name in died else "up", note=died.get(name)))
    all_served = None if any(r.served is None for r in replicas) else sum(r.served for r in replicas)  # type: ignore[misc]
    counts = [r.served if all_served is not None else r.client_calls for r in replicas]
    total = sum(counts)  # type: ignore[arg-type]
    for r, n in zip(replicas, counts):
        r.call_share = n / total if total else None
    mean = total / len(counts) if counts else 0
    queries = [_increase(timelines.get(n, {}), "prefix_cache_queries") for n in names]
    hits = [_increase(timelines.get(n, {}), "prefix_cache_hits") for n in names]
    hit_share = (sum(hits) / sum(queries)  # type: ignore[arg-type]
                 if all(q is not None for q in queries) and all(h is not None for h in hits) and sum(queries) > 0  # type: ignore[arg-type]
                 else None)
    client_calls = sum(1 for c in calls if c.status is not None)
    return FleetFigures(
        replicas=replicas, policy=policy, router_url=router_url, served=all_served, client_calls=client_calls,
        accounted=None if all_served is None else all_served == client_calls, prefix_hit_share=hit_share,
        imbalance=max(counts) / mean if mean else None,  # type: ignore[type-var]
        call_share_cv=statistics.pstdev(counts) / mean if mean and len(counts) > 1 else None,  # type: ignore[arg-type]
        moves=task_moves(calls), died=sorted(died))
