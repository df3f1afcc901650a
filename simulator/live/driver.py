"""The asyncio driver: runs the agent behaviour of every task in real time against a client.

Open loop across tasks: each top-level task starts at its scheduled arrival, on an absolute schedule
(``t0 + arrival``), so a slow server never delays later arrivals. Closed loop within a task: a call is
sent at the previous call's end plus its gap (an absolute deadline too). Every call records its
intended and actual send time; when the driver is late (event loop busy, `max_in_flight` reached) the
difference is client lag, reported rather than hidden. Sub-agents (`Fork`) run as their own asyncio
tasks with their own `TaskRecord` (``parent_id`` set); a task ends when it and all its sub-tasks have.

`stop()` (wired to SIGINT, SIGTERM and SIGHUP by `simulator.pipeline.live`) stops arrivals and cancels
what is in flight: each cancelled call and task is recorded with error class ``cancelled``, so nothing
measured is lost.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Optional, Protocol, Sequence

from ..behaviour import CallRequest, Fork, RetryPolicy, Send, TaskOutcome, Wait
from ..gcpause import gc_frozen
from ..metrics.records import CallRecord
from ..task_run import CANCELLED, DriverResult, RecordSink, TaskRun, failed_call
from ..workload import Task, Workload

MIN_SLEEP = 0.001
"""Shortest timer the driver asks for (the resolution of event-loop timers)."""


class CallClient(Protocol):
    """What the driver needs from an HTTP client (simulator.live.client.Client)."""

    async def send(self, request: CallRequest, intended_send: float) -> tuple[CallRecord, Sequence[float]]: ...


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
        on_start: Optional[Callable[[int], None]] = None,
    ) -> None:
        self.client = client
        self.tasks = sorted(workload.tasks, key=lambda t: t.arrival)
        self.sink = sink
        self.t0 = t0
        self.retry = retry
        self.duration = duration
        self.drain = drain
        self.clock = clock
        self.on_start = on_start
        """Told the number of top-level tasks started, each time one starts (`ResultWriter.started`)."""
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
            if self.on_start is not None:
                self.on_start(self.started)

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

    async def _run_top(self, task: Task) -> TaskOutcome:
        try:
            return await self._run_task(TaskRun(task, task.arrival, self.retry), self._gate)
        finally:
            self.in_flight -= 1

    async def _run_task(self, run: TaskRun, gate: Optional[asyncio.Semaphore] = None) -> TaskOutcome:
        """Carry out one task's effects in real time; returns its outcome once it and its sub-tasks ended."""
        children: list[asyncio.Task] = []
        cancelled = False
        acquired = False
        try:
            if gate is not None:
                await gate.acquire()
                acquired = True
            value: Any = None
            while (effect := run.next_effect(value)) is not None:
                if isinstance(effect, Wait):
                    value = None
                    await self._sleep_until(run.wait(effect.seconds))
                elif isinstance(effect, Send):
                    value = run.called(await self._send(run, effect.request))
                elif isinstance(effect, Fork):
                    value = await self._fork(run, effect, children)
                    run.forked(self.now())
                else:
                    raise TypeError(f"unknown effect {effect!r}")
            for child in children:  # detached sub-tasks: the task ends when they have
                await child
        except asyncio.CancelledError:
            cancelled = True
            if (record := run.cancel(self.now())) is not None:
                self.sink.call(record)
        finally:
            if acquired:
                gate.release()  # type: ignore[union-attr]
        if cancelled and children:
            await asyncio.wait(children)  # they were cancelled too; let them record it
        self.sink.task(run.finish(self.now(), cancelled))
        return run.outcome  # type: ignore[return-value]  # set by finish

    async def _send(self, run: TaskRun, request: CallRequest) -> CallRecord:
        sent = self.now()
        run.sending(request, sent)
        try:
            record, gaps = await self.client.send(request, run.anchor)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a client bug must not end the run unrecorded
            record, gaps = failed_call(request, run.anchor, sent, self.now(), "client_exception", repr(exc)), ()
        self.sink.call(record, gaps)
        return record

    async def _fork(self, parent: TaskRun, fork: Fork, children: list[asyncio.Task]) -> list[TaskOutcome]:
        waited = []
        for sub in fork.subtasks:
            child = self._spawn(self._run_task(TaskRun(sub.task, self.now(), self.retry, parent)))
            children.append(child)
            if sub.wait:
                waited.append(child)
        return list(await asyncio.gather(*waited))
