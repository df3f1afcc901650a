"""What a completed task costs, both ways.

- Self-hosted: the GPUs are paid by the hour whether busy or not, so a task costs
  ``gpu_hour x gpus / completed tasks per hour`` at the load it ran at: at a low load the GPUs idle and
  each task carries more of their hour. At the capacity (the highest load within the SLO) it is the
  cheapest a task gets while the SLO holds. A fleet pays for every replica's GPUs: ``gpus`` is each
  replica's, ``gpus x replicas`` the fleet's (`gpus_of`).
- API: each completed task's tokens at the API's prices per million: the part of each prompt that the
  task's previous call already sent (by the workload's hash ids: the provider's prompt cache holds it
  between turns) at the cached-input price, the rest at the input price, output at the output price.
  It is a property of the workload, the same for every config: what the same tasks cost through an API.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Optional

import numpy as np

from ..workload import Call, Workload
from .figures import TaskTokens
from .schema import CostSpec


def gpus_of(cost: Optional[CostSpec], replicas: int = 1) -> int:
    """The GPUs a config pays for: each server's (`cost.gpus`, 1 without a cost section) times its
    servers (a fleet's replicas)."""
    return (cost.gpus if cost is not None else 1) * replicas


def self_hosted_per_task(cost: Optional[CostSpec], tasks_per_hour: Optional[float],
                         replicas: int = 1) -> Optional[float]:
    """$ per completed task at `tasks_per_hour` on `replicas` servers (None without a GPU price or
    without completed tasks)."""
    if cost is None or cost.gpu_hour is None or not tasks_per_hour:
        return None
    return cost.gpu_hour * gpus_of(cost, replicas) / tasks_per_hour


def api_per_task(cost: Optional[CostSpec], tokens: TaskTokens) -> Optional[float]:
    """$ per completed task at the API's prices (None without prices or completed tasks)."""
    if cost is None or cost.api is None or tokens.tasks == 0:
        return None
    prices = cost.api
    cached_price = prices.cached_input if prices.cached_input is not None else prices.input
    uncached = tokens.input - tokens.cached
    dollars = (uncached * prices.input + tokens.cached * cached_price + tokens.output * prices.output) / 1e6
    return dollars / tokens.tasks


def api_tokens(workload: Workload) -> dict[str, TaskTokens]:
    """Per top-level task (its sub-tasks' calls included): prompt tokens, the part of them its previous
    call already sent (cached by an API provider), output tokens; each for one task."""
    out = {}
    for task in workload.tasks:
        tokens = TaskTokens(tasks=1)
        for part in task.walk():
            previous: Optional[Call] = None
            for call in part.calls:
                tokens.input += call.input_tokens
                tokens.cached += _resent(call, previous)
                tokens.output += call.output_tokens
                previous = call
        out[task.id] = tokens
    return out


def _resent(call: Call, previous: Optional[Call]) -> int:
    """Prompt tokens of `call` that `previous` sent as well: their common prefix of hash blocks (none
    without hash ids)."""
    if previous is None or not call.hash_ids or not previous.hash_ids or call.block_size != previous.block_size:
        return 0
    n = min(len(call.hash_ids), len(previous.hash_ids))
    differ = np.flatnonzero(np.asarray(call.hash_ids[:n]) != np.asarray(previous.hash_ids[:n]))
    shared = int(differ[0]) if differ.size else n
    return min(call.input_tokens, previous.input_tokens, shared * call.block_size)


def api_tokens_of(planned: Mapping[str, TaskTokens], completed: Iterable[str]) -> TaskTokens:
    """The API tokens of the completed tasks, summed."""
    total = TaskTokens()
    for task_id in completed:
        t = planned.get(task_id)
        if t is not None:
            total.tasks += 1
            total.input += t.input
            total.cached += t.cached
            total.output += t.output
    return total

