"""A plan executed: the executor replays it into the recorder's folder, the recorder writes the
summary. Executors whose replay is a coroutine (live, sharded) run with `execute_async`, the twin's
with `execute`."""

from __future__ import annotations

from typing import Awaitable, Protocol, Union

from ..metrics.summary import Summary
from ..task_run import DriverResult
from .plan import RunPlan
from .record import Outcome, Recorder


class Executor(Protocol):
    """Something that replays a plan: it writes run.json (`Recorder.describe`) once its target passed
    its checks, streams the records through `Recorder.writer` (or its own parts), and returns the
    `Outcome`."""

    def replay(self, plan: RunPlan, recorder: Recorder) -> Union[Outcome, Awaitable[Outcome]]:
        ...


def execute(plan: RunPlan, executor: Executor) -> tuple[Summary, DriverResult]:
    """Run `plan` with an executor whose replay returns at once (the twin); (summary, how it ended)."""
    recorder = Recorder(plan)
    outcome = executor.replay(plan, recorder)
    assert isinstance(outcome, Outcome), "a coroutine executor runs with execute_async"
    return recorder.finish(outcome), outcome.result


async def execute_async(plan: RunPlan, executor: Executor) -> tuple[Summary, DriverResult]:
    """Run `plan` with an executor whose replay is a coroutine (live, sharded); (summary, how it ended)."""
    recorder = Recorder(plan)
    outcome = executor.replay(plan, recorder)
    if not isinstance(outcome, Outcome):
        outcome = await outcome
    return recorder.finish(outcome), outcome.result
