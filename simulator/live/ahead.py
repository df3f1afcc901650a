"""Work done before it is due, so that a burst of calls costs the event loop only their sends.

When many tasks start at one instant, everything each call needs at its send time delays the calls
after it on the same loop: opening its connection (a TCP handshake, and TLS for https) and building
its request body (a prompt of thousands of token ids takes a few hundred microseconds). Both can be
done earlier:

- a warm pool: before the run's start, the client opens as many connections as the calls expected in
  flight at once during the first `WARM_HORIZON` seconds (`expected_concurrency`), and keeps them
  alive (`Client.warm`);
- bodies ahead: every call of a task is built before the task arrives, while the loop has nothing due
  (`BodiesAhead`): before the start for the first second of arrivals, then in the background, a
  slice of at most `SLICE_S` at a time, for the tasks arriving within the next `LOOKAHEAD` seconds.

Both only move work earlier: a call whose body was not prepared (or was dropped to keep the budget)
is built at its send time, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, AsyncIterator, Callable, Optional

from ..behaviour import CallRequest
from ..workload import Task, Workload

WARM_HORIZON = 4.0
"""Seconds of arrivals the warm pool is sized for: servers close a kept-alive connection idle for
5 s (uvicorn's default, which vLLM keeps), so connections for later calls would be closed unused."""
ASSUMED_CALL_S = 1.0
"""Seconds a call is assumed to take when the trace has no recorded server time."""
MAX_WARM = 4096
"""Most connections one client opens ahead."""
LOOKAHEAD = 1.0
"""Seconds ahead of their arrival that tasks get their bodies built."""
TICK = 0.05
SLICE_S = 0.002
"""Longest stretch of body building before the loop gets a turn (a due send waits at most this long)."""
BODY_BUDGET = 64 << 20
"""Bytes of prepared bodies one client keeps at most; the oldest are dropped beyond it."""
TASK_BUDGET = 1 << 20
"""Bytes of one task's bodies prepared ahead at most (its first calls; the rest are built when sent)."""


def _busy_seconds(task: Task) -> float:
    """How long a task is assumed to keep a connection busy: its calls' recorded (or assumed) server
    times and gaps, its waited-for sub-agents in sequence."""
    own = sum(c.gap + (c.server_time if c.server_time is not None else ASSUMED_CALL_S) for c in task.calls)
    return own + sum(_busy_seconds(sub.task) for sub in task.subtasks if sub.wait)


def _width(task: Task) -> int:
    """Connections a task may hold at once: itself and every sub-agent (an upper bound)."""
    return sum(1 for _ in task.walk())


def expected_concurrency(workload: Workload, horizon: float = WARM_HORIZON) -> int:
    """The most calls expected in flight at one instant among the tasks that arrive in the first
    `horizon` seconds of `workload` (each busy from its arrival for `_busy_seconds`, with all its
    sub-agents); at most `MAX_WARM`."""
    tasks = workload.tasks
    if not tasks:
        return 0
    first = min(t.arrival for t in tasks)
    events: list[tuple[float, int]] = []
    for task in tasks:
        if task.arrival <= first + horizon:
            width = _width(task)
            events.append((task.arrival, width))
            events.append((task.arrival + _busy_seconds(task), -width))
    events.sort(key=lambda e: (e[0], e[1] < 0))  # at one instant, starts before ends: a burst counts whole
    peak = level = 0
    for _, change in events:
        level += change
        peak = max(peak, level)
    return min(peak, MAX_WARM)


class BodiesAhead:
    """Builds the request bodies of a workload's calls before their tasks arrive (see the module
    docstring). `client` is a started `simulator.live.client.Client` (its model known)."""

    def __init__(self, client: Any, workload: Workload, *, lookahead: float = LOOKAHEAD,
                 budget: int = BODY_BUDGET, task_budget: int = TASK_BUDGET) -> None:
        self.client = client
        self.tasks = sorted(workload.tasks, key=lambda t: t.arrival)
        self.lookahead = lookahead
        self.budget = budget
        self.task_budget = task_budget
        self.next = 0
        """Index of the first task (by arrival) whose bodies are not prepared yet."""
        self.prepared = 0
        """Bodies prepared so far."""

    def upto(self, until: float, deadline: Optional[float] = None) -> bool:
        """Prepare the bodies of the tasks arriving up to `until` (seconds since the run's start); stop
        early once `time.perf_counter()` passes `deadline`. Returns whether all of them are done."""
        tasks, client = self.tasks, self.client
        while self.next < len(tasks) and tasks[self.next].arrival <= until:
            if deadline is not None and time.perf_counter() >= deadline:
                return False
            if client.prepared_bytes > self.budget:
                client.drop_prepared(self.budget // 2)
            self._prepare_task(tasks[self.next])
            self.next += 1
        return True

    def _prepare_task(self, top: Task) -> None:
        spent = 0
        for task in top.walk():
            for index, call in enumerate(task.calls):
                if spent >= self.task_budget:
                    return
                spent += self.client.prepare(CallRequest(task.id, task.task_class, index, call, 0))
                self.prepared += 1

    @contextlib.asynccontextmanager
    async def running(self, now: Callable[[], float]) -> AsyncIterator[BodiesAhead]:
        """Keep preparing in the background while the block runs (`now`: seconds since the start)."""
        worker = asyncio.ensure_future(self._run(now))
        try:
            yield self
        finally:
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker

    async def _run(self, now: Callable[[], float]) -> None:
        while self.next < len(self.tasks):
            if self.upto(now() + self.lookahead, time.perf_counter() + SLICE_S):
                await asyncio.sleep(TICK)
            else:
                await asyncio.sleep(0)  # a slice done: let due sends and arriving tokens go first


async def get_ready(client: Any, workload: Workload, *, warm: Optional[int] = None) -> BodiesAhead:
    """Before a run's start: open the warm pool (`warm` connections, default `expected_concurrency`)
    and build the bodies of the first `LOOKAHEAD` seconds of arrivals; returns the `BodiesAhead` to
    keep running during the run."""
    ahead = BodiesAhead(client, workload)
    ahead.upto(min((t.arrival for t in workload.tasks), default=0.0) + ahead.lookahead)
    await client.warm(expected_concurrency(workload) if warm is None else warm)
    return ahead
