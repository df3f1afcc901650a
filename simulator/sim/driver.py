"""The SimPy driver: runs the agent behaviour of every task in simulated time against the twin.

The same protocol as the live driver (`simulator.live.driver`), on the SimPy clock: each top-level task
starts at its arrival (open loop across tasks), `Wait` is a timeout, `Send` submits to the twin and
resumes at the response's end, `Fork` starts sub-tasks as their own tasks (`TaskRecord.parent_id` set)
and resumes when those with ``wait=True`` have finished; a task ends when it and its sub-tasks have.
It produces the same `CallRecord`/`TaskRecord` the live driver does. Simulation has no client lag:
every call is sent exactly when intended. Calls longer than the profile's `max_model_len` fail at once
with ``http_4xx`` (status 400), as vLLM rejects them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Protocol, Sequence, Union

import simpy

from ..behaviour import CallRequest, Fork, RetryPolicy, Send, TaskOutcome, Wait, task_behaviour
from ..metrics.records import CallRecord, TaskRecord
from ..workload import Task, Workload
from .profile import ServerProfile
from .twin import Completion, Twin, TwinStats, exact_delay


class RecordSink(Protocol):
    """Where finished records go (the live driver's sink protocol; `simulator.metrics.results.ResultWriter`)."""

    def call(self, record: CallRecord, gaps: Sequence[float] = ()) -> None: ...

    def task(self, record: TaskRecord) -> None: ...


@dataclass
class ListSink:
    """A sink that keeps every record in memory (gaps per call too, when the twin keeps them)."""

    calls: list[CallRecord] = field(default_factory=list)
    gaps: list[Sequence[float]] = field(default_factory=list)
    tasks: list[TaskRecord] = field(default_factory=list)

    def call(self, record: CallRecord, gaps: Sequence[float] = ()) -> None:
        self.calls.append(record)
        self.gaps.append(gaps)

    def task(self, record: TaskRecord) -> None:
        self.tasks.append(record)


@dataclass
class SimResult:
    """How a simulated run ended."""

    end: float
    """Simulated seconds when the last task finished."""
    tasks_started: int
    twin: TwinStats


class SimDriver:
    """Replays a workload through a `Twin` in simulated time; records go to `sink` as they finish.

    `workload` may also be an iterable of tasks in arrival order (a generator, say): tasks are then
    drawn only as they arrive, so memory holds the tasks in flight rather than the whole run."""

    def __init__(self, workload: Union[Workload, Iterable[Task]], profile: ServerProfile, sink: RecordSink, *,
                 retry: RetryPolicy = RetryPolicy(), keep_gaps: bool = False, fast_decode: bool = True,
                 duration: Optional[float] = None) -> None:
        self.env = simpy.Environment()
        self.twin = Twin(self.env, profile, keep_gaps=keep_gaps, fast_decode=fast_decode)
        self.tasks: Iterable[Task] = (sorted(workload.tasks, key=lambda t: t.arrival)
                                      if isinstance(workload, Workload) else workload)
        self.sink = sink
        self.retry = retry
        self.duration = duration
        """Tasks arriving at or after this many seconds are not started."""
        self.started = 0
        self._last_end = 0.0

    def run(self) -> SimResult:
        """Run every task to its end; returns how it ended."""
        self.env.process(self._arrivals())
        self.env.run()
        return SimResult(self._last_end, self.started, self.twin.stats)

    def _arrivals(self):
        env = self.env
        for task in self.tasks:
            if self.duration is not None and task.arrival >= self.duration:
                break
            if task.arrival < env.now:
                raise ValueError(f"task {task.id} arrives at {task.arrival} s, before the previous task")
            if task.arrival > env.now:
                yield env.timeout(exact_delay(env.now, task.arrival))
            self.started += 1
            env.process(self._task(task, task.arrival, None))

    def _task(self, task: Task, arrival: float, parent_id: Optional[str]):
        """Process running one task's behaviour; its value is (outcome, end)."""
        env = self.env
        behaviour = task_behaviour(task, self.retry)
        children: list[simpy.Process] = []
        calls_ok = 0
        time_in_calls = time_in_ttft = time_in_gaps = 0.0
        last_error: Optional[str] = None
        anchor = arrival
        value: Any = None
        while True:
            try:
                effect = behaviour.send(value)
            except StopIteration as done:
                outcome: TaskOutcome = done.value
                break
            value = None
            if isinstance(effect, Wait):
                anchor += effect.seconds
                time_in_gaps += effect.seconds
                if anchor > env.now:
                    yield env.timeout(exact_delay(env.now, anchor))
            elif isinstance(effect, Send):
                record = yield from self._send(effect.request, anchor)
                time_in_calls += record.latency
                if record.ttft is not None:
                    time_in_ttft += record.ttft
                if record.ok:
                    calls_ok += 1
                else:
                    last_error = record.error_class
                anchor = record.end
                value = record
            elif isinstance(effect, Fork):
                waited = []
                for sub in effect.subtasks:
                    child = env.process(self._task(sub.task, env.now, task.id))
                    children.append(child)
                    if sub.wait:
                        waited.append(child)
                if waited:
                    yield env.all_of(waited)
                value = [child.value[0] for child in waited]
                anchor = max(anchor, env.now)
            else:
                raise TypeError(f"unknown effect {effect!r}")
        for child in children:
            if not child.triggered:
                yield child
        end = max([env.now] + [child.value[1] for child in children])
        self._last_end = max(self._last_end, end)
        self.sink.task(TaskRecord(
            task_id=task.id,
            task_class=task.task_class,
            arrival=arrival,
            end=end,
            ok=outcome.ok,
            calls=calls_ok,
            calls_planned=len(task.calls),
            time_in_calls=time_in_calls,
            time_in_gaps=time_in_gaps,
            client_lag=0.0,
            parent_id=parent_id,
            failed_call=outcome.failed_call,
            error_class=None if outcome.ok else last_error,
            time_in_ttft=time_in_ttft,
        ))
        return outcome, end

    def _send(self, request: CallRequest, intended: float):
        """Submit one call to the twin; the generator's value is its `CallRecord`."""
        env = self.env
        call = request.call
        sent = env.now
        if not self.twin.fits(call.input_tokens, call.output_tokens):
            record = CallRecord(
                task_id=request.task_id, task_class=request.task_class, call_index=request.call_index,
                attempt=request.attempt, intended_send=intended, actual_send=sent, end=sent, ok=False,
                input_tokens=call.input_tokens, requested_output_tokens=call.output_tokens, status=400,
                error_class="http_4xx",
                error_message=f"prompt + output ({call.input_tokens} + {call.output_tokens}) exceeds "
                              f"max_model_len {self.twin.max_model_len}",
            )
            self.sink.call(record, ())
            return record
        done: Completion = yield self.twin.submit_call(call)
        record = CallRecord(
            task_id=request.task_id, task_class=request.task_class, call_index=request.call_index,
            attempt=request.attempt, intended_send=intended, actual_send=sent, end=done.end, ok=True,
            ttft=done.ttft, itl_count=done.itl_count, itl_mean=done.itl_mean, itl_max=done.itl_max,
            input_tokens=call.input_tokens, output_tokens=done.output_tokens,
            requested_output_tokens=call.output_tokens, cached_tokens=done.cached_tokens, status=200,
        )
        self.sink.call(record, done.gaps)
        return record


def simulate(workload: Workload, profile: ServerProfile, *, retry: RetryPolicy = RetryPolicy(),
             keep_gaps: bool = False, fast_decode: bool = True) -> tuple[ListSink, SimResult]:
    """Run a workload on a twin of `profile`, keeping every record in memory."""
    sink = ListSink()
    result = SimDriver(workload, profile, sink, retry=retry, keep_gaps=keep_gaps, fast_decode=fast_decode).run()
    return sink, result
