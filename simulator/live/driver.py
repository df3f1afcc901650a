"""The asyncio driver: runs the agent behaviour of every task in real time against a client.

Open loop across tasks: each top-level task starts at its scheduled arrival, on an absolute schedule
(``t0 + arrival``), so a slow server never delays later arrivals. Closed loop within a task: a call is
sent at the previous call's end plus its gap (an absolute deadline too). Every call records its
intended and actual send time; when the driver is late (event loop busy, `max_in_flight` reached) the
difference is client lag, reported rather than hidden. Sub-agents (`Fork`) run as their own asyncio
tasks with their own `TaskRecord` (``parent_id`` set); a task ends when it and all its sub-tasks have.

`stop()` (wired to SIGINT by the command line) stops arrivals and cancels what is in flight: each
cancelled call and task is recorded with error class ``cancelled``, so nothing measured is lost.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol, Sequence

from ..behaviour import CallRequest, Fork, RetryPolicy, Send, TaskOutcome, Wait, task_behaviour
from ..gcpause import gc_frozen
from ..metrics.records import CallRecord, TaskRecord
from ..workload import Task, Workload

CANCELLED = "cancelled"
MIN_SLEEP = 0.001
"""Shortest timer the driver asks for (the resolution of event-loop timers)."""


class CallClient(Protocol):
    """What the driver needs from an HTTP client (simulator.live.client.Client)."""

    async def send(self, request: CallRequest, intended_send: float) -> tuple[CallRecord, Sequence[float]]: ...


class RecordSink(Protocol):
    """Where finished records go (simulator.metrics.results.ResultWriter)."""

    def call(self, record: CallRecord, gaps: Sequence[float] = ()) -> None: ...

    def task(self, record: TaskRecord) -> None: ...


@dataclass
class DriverResult:
    """How the run ended."""

    stop_reason: str
    """'completed', 'interrupted' (stop()), 'drain_timeout', or 'cancelled' (the run itself was cancelled)."""
    tasks_started: int
    tasks_not_started: int
    end: float
    """Seconds since t0 when the last task finished."""

    @property
    def partial(self) -> bool:
        return self.stop_reason != "completed"


@dataclass
class _TaskState:
    """Running totals of one task."""

    calls_ok: int = 0
    time_in_calls: float = 0.0
    time_in_ttft: float = 0.0
    time_in_gaps: float = 0.0
    client_lag: float = 0.0
    last_error: Optional[str] = None
    pending: Optional[tuple[CallRequest, float, float]] = None
    """The call in flight: (request, intended send, when send() was entered)."""
    children: list[asyncio.Task] = field(default_factory=list)


class Driver:
    """Replays a workload through a client; records go to a sink as they finish."""

    def __init__(
        self,
        client: CallClient,
        workload: Workload,
        sink: RecordSink,
        *,
        t0: float,
        retry: RetryPolicy = RetryPolicy(),
        max_in_flight: Optional[int] = None,
        duration: Optional[float] = None,
        drain: Optional[float] = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.client = client
        self.tasks = sorted(workload.tasks, key=lambda t: t.arrival)
        self.sink = sink
        self.t0 = t0
        self.retry = retry
        self.duration = duration
        self.drain = drain
        self.clock = clock
        self._gate = asyncio.Semaphore(max_in_flight) if max_in_flight else None
        self._running: set[asyncio.Task] = set()
        self._scheduler: Optional[asyncio.Task] = None
        self._stop_reason: Optional[str] = None
        self.started = 0
        """Top-level tasks started so far."""
        self.in_flight = 0
        """Top-level tasks started and not finished (including those waiting for `max_in_flight`)."""

    def now(self) -> float:
        """Seconds since t0."""
        return self.clock() - self.t0

    def stop(self, reason: str = "interrupted") -> None:
        """Stop arrivals and cancel everything in flight (each cancellation is recorded)."""
        if self._stop_reason is not None:
            return
        self._stop_reason = reason
        if self._scheduler is not None:
            self._scheduler.cancel()
        for task in list(self._running):
            task.cancel()

    @property
    def stopping(self) -> bool:
        return self._stop_reason is not None

    async def run(self) -> DriverResult:
        """Run every task to its end (or until stopped); returns how it ended. The collector keeps
        away from the workload meanwhile (`gc_frozen`)."""
        self._scheduler = asyncio.ensure_future(self._schedule())
        with gc_frozen():
            try:
                try:
                    await self._scheduler
                except asyncio.CancelledError:
                    if not self.stopping:
                        raise
                await self._drain()
            except asyncio.CancelledError:
                self.stop(CANCELLED)
                await self._settle()
                raise
        return DriverResult(self._stop_reason or "completed", self.started,
                            len(self.tasks) - self.started, self.now())

    async def _schedule(self) -> None:
        for task in self.tasks:
            if self.duration is not None and task.arrival >= self.duration:
                break
            await self._sleep_until(task.arrival)
            self.started += 1
            self.in_flight += 1
            self._spawn(self._run_top(task))

    async def _drain(self) -> None:
        """Wait for in-flight tasks; after `drain` seconds cancel what is left."""
        deadline = None if self.drain is None else self.now() + self.drain
        while self._running:
            timeout = None if deadline is None or self.stopping else max(0.0, deadline - self.now())
            await asyncio.wait(set(self._running), timeout=timeout)
            if self._running and deadline is not None and self.now() >= deadline:
                self.stop("drain_timeout")

    async def _settle(self) -> None:
        """Let cancelled tasks write their records."""
        while self._running:
            await asyncio.wait(set(self._running))

    def _spawn(self, coro: Any) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        if self.stopping:
            task.cancel()
        return task

    async def _sleep_until(self, deadline: float) -> None:
        """Sleep to an absolute time (one loop timer), never waking early."""
        while True:
            delay = deadline - self.now()
            if delay <= 0:
                return
            # Loop timers have millisecond resolution (uvloop can fire up to 1 ms early and rounds a
            # sub-millisecond delay to zero): re-sleeping for the rest would spin up to a millisecond per
            # deadline, per task. One more whole-millisecond sleep costs at most that much lateness,
            # which shows as client lag.
            await asyncio.sleep(delay if delay >= MIN_SLEEP else MIN_SLEEP)

    async def _run_top(self, task: Task) -> tuple[TaskOutcome, float]:
        try:
            return await self._run_task(task, task.arrival, None, self._gate)
        finally:
            self.in_flight -= 1

    async def _run_task(
        self, task: Task, arrival: float, parent_id: Optional[str], gate: Optional[asyncio.Semaphore] = None
    ) -> tuple[TaskOutcome, float]:
        """Run one task's behaviour; returns its outcome and the time it (with its sub-tasks) ended."""
        state = _TaskState()
        behaviour = task_behaviour(task, self.retry)
        outcome: Optional[TaskOutcome] = None
        cancelled = False
        acquired = False
        anchor = arrival  # intended time the next effect starts from
        try:
            if gate is not None:
                await gate.acquire()
                acquired = True
            value: Any = None
            while True:
                try:
                    effect = behaviour.send(value)
                except StopIteration as done:
                    outcome = done.value
                    break
                value = None
                if isinstance(effect, Wait):
                    anchor += effect.seconds
                    state.time_in_gaps += effect.seconds
                    await self._sleep_until(anchor)
                elif isinstance(effect, Send):
                    value = await self._send(effect.request, anchor, state)
                    anchor = value.end
                elif isinstance(effect, Fork):
                    value = await self._fork(task, effect, state)
                    anchor = max(anchor, self.now())
                else:
                    raise TypeError(f"unknown effect {effect!r}")
            for child in state.children:  # detached sub-tasks: the task ends when they have
                await child
        except asyncio.CancelledError:
            cancelled = True
            if state.pending is not None:
                request, intended, entered = state.pending
                self.sink.call(_cancelled_call(request, intended, entered, self.now()))
        finally:
            behaviour.close()
            if acquired:
                gate.release()  # type: ignore[union-attr]
        if cancelled and state.children:
            await asyncio.wait(state.children)  # they were cancelled too; let them record it
        end = max([self.now()] + [_child_end(child) for child in state.children])
        if outcome is None:
            outcome = TaskOutcome(task.id, False, state.calls_ok, None)
        self.sink.task(
            TaskRecord(
                task_id=task.id,
                task_class=task.task_class,
                arrival=arrival,
                end=end,
                ok=outcome.ok and not cancelled,
                calls=state.calls_ok,
                calls_planned=len(task.calls),
                time_in_calls=state.time_in_calls,
                time_in_gaps=state.time_in_gaps,
                client_lag=state.client_lag,
                parent_id=parent_id,
                failed_call=outcome.failed_call,
                error_class=CANCELLED if cancelled else (None if outcome.ok else state.last_error),
                time_in_ttft=state.time_in_ttft,
            )
        )
        return outcome, end

    async def _send(self, request: CallRequest, intended: float, state: _TaskState) -> CallRecord:
        state.pending = (request, intended, self.now())
        try:
            record, gaps = await self.client.send(request, intended)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a client bug must not end the run unrecorded
            now = self.now()
            record, gaps = _failed_call(request, intended, state.pending[2], now, "client_exception", repr(exc)), ()
        state.pending = None
        self.sink.call(record, gaps)
        state.time_in_calls += record.latency
        state.client_lag += record.client_lag
        if record.ttft is not None:
            state.time_in_ttft += record.ttft
        if record.ok:
            state.calls_ok += 1
        else:
            state.last_error = record.error_class
        return record

    async def _fork(self, parent: Task, fork: Fork, state: _TaskState) -> list[TaskOutcome]:
        waited = []
        for sub in fork.subtasks:
            child = self._spawn(self._run_task(sub.task, self.now(), parent.id))
            state.children.append(child)
            if sub.wait:
                waited.append(child)
        results = await asyncio.gather(*waited)
        return [outcome for outcome, _ in results]


def _child_end(child: asyncio.Task) -> float:
    """When a finished sub-task ended (0 if it has no result)."""
    if not child.done() or child.cancelled() or child.exception() is not None:
        return 0.0
    return child.result()[1]


def _failed_call(request: CallRequest, intended: float, sent: float, end: float, error: str, message: str) -> CallRecord:
    return CallRecord(
        task_id=request.task_id,
        task_class=request.task_class,
        call_index=request.call_index,
        attempt=request.attempt,
        intended_send=intended,
        actual_send=sent,
        end=end,
        ok=False,
        input_tokens=request.call.input_tokens,
        requested_output_tokens=request.call.output_tokens,
        error_class=error,
        error_message=message,
    )


def _cancelled_call(request: CallRequest, intended: float, sent: float, end: float) -> CallRecord:
    return _failed_call(request, intended, sent, end, CANCELLED, "run stopped while the call was in flight")
