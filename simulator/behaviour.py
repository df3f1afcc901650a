"""What an agent task does, written once and run on two clocks.

`task_behaviour` is a generator that yields effects and receives their results:

- ``Wait(seconds)``: tool or think time; the driver resumes it after that long (result: None).
- ``Send(request)``: one model call; the driver resumes it when the response has ended, with an object
  that has at least ``ok: bool`` (the driver's call record) and may have ``retry_after`` (seconds the
  server asked to wait; a retry waits at least that long).
- ``Fork(subtasks)``: start sub-agents; the driver resumes it once those with ``wait=True`` have
  finished (result: their `TaskOutcome`s in order), the others run on detached.

It returns a `TaskOutcome`. A driver (SimPy in `simulator.sim`, asyncio in `simulator.live`) supplies
the clock and the server; the behaviour never looks at time, so both clocks run the same agent.
Closed loop within a task: a call is sent only after its predecessor ended, plus its gap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generator, Optional, Protocol, Union

from .workload import Call, SubTask, Task


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a task reacts to a failed call: retry up to `retries` times with exponential backoff."""

    retries: int = 0
    backoff: float = 1.0
    """Seconds before the first retry; doubles on each further one."""

    def wait(self, attempt: int, retry_after: Optional[float] = None) -> float:
        """Seconds to wait before retrying after failed attempt number `attempt` (0 for the first):
        the backoff, or longer when the server asked for longer with ``Retry-After``."""
        backoff = self.backoff * 2**attempt
        return retry_after if retry_after is not None and retry_after > backoff else backoff


@dataclass(frozen=True, slots=True)
class CallRequest:
    """One call as a driver must send it."""

    task_id: str
    task_class: str
    call_index: int
    call: Call
    attempt: int = 0
    root_id: str = ""
    """The top-level task this call's task belongs to (its own id for a top-level task): the session a
    fleet's router may keep together (`session_key`)."""

    def session_key(self, sub_agents: str = "parent") -> str:
        """The key a router's session affinity reads for this call: the top-level task's id, or with
        `sub_agents` ``"own"`` the call's own task's id."""
        return self.task_id if sub_agents == "own" or not self.root_id else self.root_id


@dataclass(frozen=True, slots=True)
class Wait:
    seconds: float


@dataclass(frozen=True, slots=True)
class Send:
    request: CallRequest


@dataclass(frozen=True, slots=True)
class Fork:
    subtasks: tuple[SubTask, ...]


Effect = Union[Wait, Send, Fork]


class CallResult(Protocol):
    ok: bool
    retry_after: Optional[float]
    """Seconds the server asked to wait before a retry (``Retry-After``), None when it did not."""


@dataclass(frozen=True, slots=True)
class TaskOutcome:
    """How a task ended: all calls done, or failed at a call."""

    task_id: str
    ok: bool
    calls_done: int
    failed_call: Optional[int] = None
    sub_outcomes: tuple[TaskOutcome, ...] = ()


Behaviour = Generator[Effect, Any, TaskOutcome]


def task_behaviour(task: Task, retry: RetryPolicy = RetryPolicy(), root_id: str = "") -> Behaviour:
    """The agent behaviour of one task (see the module docstring for the protocol); `root_id` is the
    id of the top-level task it belongs to (default: its own)."""
    root = root_id or task.id
    spawns: dict[int, list[SubTask]] = {}
    for sub in task.subtasks:
        spawns.setdefault(sub.after_call, []).append(sub)
    sub_outcomes: list[TaskOutcome] = []

    if -1 in spawns:
        sub_outcomes.extend((yield Fork(tuple(spawns[-1]))) or ())
    for index, call in enumerate(task.calls):
        if call.gap > 0:
            yield Wait(call.gap)
        attempt = 0
        while True:
            result: CallResult = yield Send(CallRequest(task.id, task.task_class, index, call, attempt, root))
            if result.ok:
                break
            if attempt >= retry.retries:
                return TaskOutcome(task.id, False, index, index, tuple(sub_outcomes))
            yield Wait(retry.wait(attempt, getattr(result, "retry_after", None)))
            attempt += 1
        if index in spawns:
            sub_outcomes.extend((yield Fork(tuple(spawns[index]))) or ())
    return TaskOutcome(task.id, True, len(task.calls), None, tuple(sub_outcomes))
