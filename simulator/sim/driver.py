"""The SimPy driver: runs the agent behaviour of every task in simulated time against the twin.

The same protocol as the live driver (`simulator.live.driver`), on the SimPy clock: each top-level task
starts at its arrival (open loop across tasks), `Wait` is a timeout, `Send` submits to the twin and
resumes at the response's end, `Fork` starts sub-tasks as their own tasks (`TaskRecord.parent_id` set)
and resumes when those with ``wait=True`` have finished; a task ends when it and its sub-tasks have.
It produces the same `CallRecord`/`TaskRecord` the live driver does. Simulation has no client lag:
every call is sent exactly when intended (the server's own per-request time is the profile's
`request_overhead`, inside the twin). Calls longer than the profile's `max_model_len` fail at once
with ``http_4xx`` (status 400), as vLLM rejects them.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Protocol, Sequence, Union

import simpy

from ..behaviour import CallRequest, Fork, RetryPolicy, Send, TaskOutcome, Wait, task_behaviour
from ..metrics.records import CallRecord, TaskRecord
from ..workload import Task, Workload
from .profile import ServerProfile
from .twin import Twin, TwinStats, exact_delay


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
        with _fewer_collections():
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
        twin = self.twin
        sink_call = self.sink.call
        submit = twin.submit_call_raw
        max_model_len = twin.max_model_len
        behaviour = task_behaviour(task, self.retry)
        send = behaviour.send
        children: list[simpy.Process] = []
        calls_ok = 0
        time_in_calls = time_in_ttft = time_in_gaps = 0.0
        last_error: Optional[str] = None
        anchor = arrival
        value: Any = None
        while True:
            try:
                effect = send(value)
            except StopIteration as done:
                outcome: TaskOutcome = done.value
                break
            value = None
            kind = type(effect)
            if kind is not Send and kind is not Wait and kind is not Fork:  # subclasses
                kind = next((k for k in (Send, Wait, Fork) if isinstance(effect, k)), None)
            if kind is Send:
                # one call, sent now (simulation has no client lag); its record is built once
                request = effect.request
                call = request.call
                sent = env.now
                wanted = call.output_tokens
                prompt = call.input_tokens
                if prompt + (wanted if wanted > 1 else 1) <= max_model_len:  # Twin.fits, inlined
                    done = yield submit(call)  # the twin's request: see Twin.submit_call_raw
                    end = done.last_token
                    first = done.first_token
                    count = done.itl_count
                    ttft = first - sent
                    # positional, in CallRecord's field order (a million keyword calls cost seconds):
                    # task_id, task_class, call_index, attempt, intended_send, actual_send, end, ok, ttft,
                    # itl_count, itl_mean, itl_max, input_tokens, output_tokens, requested_output_tokens,
                    # cached_tokens, status
                    record = CallRecord(
                        request.task_id, request.task_class, request.call_index, request.attempt, anchor, sent,
                        end, True, ttft, count, (end - first) / count if count else None,
                        done.itl_max if count else None, prompt, done.generated, wanted,
                        done.cached_tokens or 0, 200,
                    )
                    sink_call(record, done.gaps if done.gaps is not None else [])
                    time_in_calls += end - sent
                    time_in_ttft += ttft
                    calls_ok += 1
                    anchor = end
                else:
                    record = self._rejected(request, anchor, sent)
                    last_error = record.error_class
                    anchor = sent
                value = record
            elif kind is Wait:
                seconds = effect.seconds
                anchor += seconds
                time_in_gaps += seconds
                now = env.now
                if anchor > now:
                    yield env.timeout(exact_delay(now, anchor))
            elif kind is Fork:
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
        end = env.now
        for child in children:
            if child.value[1] > end:
                end = child.value[1]
        if end > self._last_end:
            self._last_end = end
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

    def _rejected(self, request: CallRequest, intended: float, sent: float) -> CallRecord:
        """The record of a call longer than `max_model_len`, failed at once as vLLM fails it (HTTP 400)."""
        call = request.call
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


@contextmanager
def _fewer_collections():
    """Run the cyclic garbage collector less often: a run allocates a few dozen objects a call, nearly
    all freed by reference counting, and the default thresholds would collect every few dozen calls
    while the prefix cache keeps millions of objects alive (about a tenth of a long run)."""
    before = gc.get_threshold()
    gc.set_threshold(max(before[0], 100_000), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


def simulate(workload: Workload, profile: ServerProfile, *, retry: RetryPolicy = RetryPolicy(),
             keep_gaps: bool = False, fast_decode: bool = True) -> tuple[ListSink, SimResult]:
    """Run a workload on a twin of `profile`, keeping every record in memory."""
    sink = ListSink()
    result = SimDriver(workload, profile, sink, retry=retry, keep_gaps=keep_gaps, fast_decode=fast_decode).run()
    return sink, result
