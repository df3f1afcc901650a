"""How long a run's arrivals last and about how long it will take, for the banner printed before it
(`scenario_run_length`): the arrivals, each task's tool and think time and, against the built-in
emulator, each call's time on it when idle."""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

if TYPE_CHECKING:
    from ..scenario import Scenario
    from ..workload import Workload


@dataclass(frozen=True)
class RunLength:
    """How long a run's arrivals last and about how long the run will take, for the banner."""

    first_arrival: float
    last_arrival: float
    """Of the tasks the run will start (`run.duration` cuts the later ones)."""
    tasks: int
    estimate: float
    """Seconds from the start to the end of the last task: the arrivals (later ones held back by
    `run.max_in_flight`), then each task's tool and think time and, with `server_time`, each call's
    time on an idle server; at most the last arrival plus `run.drain`. Queueing behind other calls
    comes on top, and without `server_time` the server's whole time does."""
    server_time: bool = False
    """Whether the estimate counts the server's time (a model of the target's timing was given)."""


def run_length(workload: Workload, run: Any, call_time: Optional[Callable[[Any], float]] = None) -> RunLength:
    """The arrival span and the estimated length of replaying `workload` with the `run` settings.

    `call_time` gives a call's seconds on the target when nothing else runs (the built-in emulator's
    timing model: `simulator.emulator.call_time`); it is asked once per call, in the order the run sends
    them, roughly. None (a real server, whose speed is not known here): no server time. A trace's
    recorded server times are never used: the scenario's transforms change the calls, not those times."""
    tasks = sorted((t for t in workload.tasks if run.duration is None or t.arrival < run.duration),
                   key=lambda t: t.arrival)
    if not tasks:
        return RunLength(0.0, 0.0, 0, 0.0, call_time is not None)
    timing = call_time or (lambda call: 0.0)
    last = tasks[-1].arrival
    gate = run.max_in_flight or None
    slots: list[float] = []  # when the top-level tasks holding the `max_in_flight` slots end (sub-tasks too)
    estimate = 0.0
    for task in tasks:
        start = task.arrival
        if gate is not None and len(slots) >= gate:
            start = max(start, heapq.heappop(slots))
        _, end = _task_floor(task, start, timing)
        if gate is not None:
            heapq.heappush(slots, end)
        estimate = max(estimate, end)
    if run.drain is not None:
        estimate = min(estimate, last + run.drain)
    return RunLength(tasks[0].arrival, last, len(tasks), max(estimate, last), call_time is not None)


def scenario_run_length(scenario: Scenario, workload: Workload) -> RunLength:
    """`run_length` of replaying `workload` as `scenario` says: with each call's time on the idle
    built-in emulator when the run starts it (`simulator.emulator.call_time`), without the server's
    time against a `target`."""
    if scenario.target is not None:
        return run_length(workload, scenario.run)
    from ..emulator.call_time import unloaded_call_time

    return run_length(workload, scenario.run, unloaded_call_time(scenario.emulator))


def _task_floor(task: Any, start: float, call_time: Callable[[Any], float]) -> tuple[float, float]:
    """When a task started at `start` finishes, and when it and every sub-task it spawned (the
    detached ones too) have: its calls one after the other, each after its gap and taking `call_time`;
    sub-agents spawned together run alongside, and those waited for hold the next call back."""
    spawns: dict[int, list[Any]] = {}
    for sub in task.subtasks:
        spawns.setdefault(sub.after_call, []).append(sub)
    now = end = start

    def fork(subs: list[Any], at: float) -> float:
        nonlocal end
        resume = at
        for sub in subs:
            finished, sub_end = _task_floor(sub.task, at, call_time)
            end = max(end, sub_end)
            if sub.wait:
                resume = max(resume, finished)
        return resume

    now = fork(spawns.get(-1, []), now)
    for index, call in enumerate(task.calls):
        now += call.gap + call_time(call)
        if index in spawns:
            now = fork(spawns[index], now)
    return now, max(end, now)
