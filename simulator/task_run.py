"""One task's run as both drivers consume it: the behaviour stepped, the totals kept, the records built.

A driver (asyncio in `simulator.live.driver`, SimPy in `simulator.sim.driver`) makes a `TaskRun` per
task, asks it for the next effect, carries the effect out on its own clock and tells the run what
happened. The run keeps the intended-time anchor (the schedule that client lag is measured against),
the breakdown totals, and builds every `CallRecord` and `TaskRecord`, so both drivers leave the same
records for the same events. A driver supplies only its clock and its way of sending a call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Protocol, Sequence

from .behaviour import CallRequest, Effect, RetryPolicy, TaskOutcome, task_behaviour
from .metrics.records import CallRecord, TaskRecord
from .workload import Task

CANCELLED = "cancelled"
"""Error class of calls and tasks cut off by a stop (Ctrl-C, the drain deadline)."""


class RecordSink(Protocol):
    """Where finished records go (`simulator.metrics.results.ResultWriter`, or a list in tests)."""

    def call(self, record: CallRecord, gaps: Sequence[float] = ()) -> None: ...

    def task(self, record: TaskRecord) -> None: ...


@dataclass
class DriverResult:
    """How a run (live or simulated) ended."""

    stop_reason: str
    """'completed', 'interrupted' (stopped by the user), 'drain_timeout', or 'cancelled' (the run
    itself was cancelled)."""
    tasks_started: int
    tasks_not_started: Optional[int]
    """Top-level tasks the run did not start (None when they come from an iterator left undrawn)."""
    end: float
    """Seconds since t0 when the last task finished."""

    @property
    def partial(self) -> bool:
        return self.stop_reason != "completed"


def driver_settings(run: Any) -> dict[str, Any]:
    """The settings of a scenario's `run` section (`scenario.RunSpec`) that shape a replay, as keyword
    arguments that both drivers take: what one driver honours, the other honours too."""
    return {"retry": RetryPolicy(run.retries, run.backoff), "max_in_flight": run.max_in_flight,
            "duration": run.duration, "drain": run.drain}


def call_record(
    request: CallRequest,
    intended: float,
    sent: float,
    end: float,
    *,
    ok: bool = True,
    ttft: Optional[float] = None,
    itl_count: int = 0,
    itl_mean: Optional[float] = None,
    itl_max: Optional[float] = None,
    input_tokens: Optional[int] = None,
    output_tokens: int = 0,
    cached_tokens: Optional[int] = None,
    status: Optional[int] = None,
    error_class: Optional[str] = None,
    error_message: Optional[str] = None,
    retry_after: Optional[float] = None,
    replica: Optional[str] = None,
) -> CallRecord:
    """The record of one call of `request`: identity and requested sizes from the request, the rest as
    measured. `input_tokens` defaults to the planned prompt size."""
    call = request.call
    return CallRecord(
        task_id=request.task_id,
        task_class=request.task_class,
        call_index=request.call_index,
        attempt=request.attempt,
        intended_send=intended,
        actual_send=sent,
        end=end,
        ok=ok,
        ttft=ttft,
        itl_count=itl_count,
        itl_mean=itl_mean,
        itl_max=itl_max,
        input_tokens=call.input_tokens if input_tokens is None else input_tokens,
        output_tokens=output_tokens,
        requested_output_tokens=call.output_tokens,
        cached_tokens=cached_tokens,
        status=status,
        error_class=error_class,
        error_message=error_message,
        retry_after=retry_after,
        replica=replica,
    )


def failed_call(request: CallRequest, intended: float, sent: float, end: float, error_class: str, message: str,
                status: Optional[int] = None, retry_after: Optional[float] = None) -> CallRecord:
    """The record of a call that got no usable response (`retry_after`: the server's ``Retry-After``)."""
    return call_record(request, intended, sent, end, ok=False, status=status, error_class=error_class,
                       error_message=message, retry_after=retry_after)


class TaskRun:
    """One task (or sub-task) in progress: its behaviour, the anchor its next effect starts from, and
    the totals behind its `TaskRecord`.

    The protocol a driver follows: ``effect = run.next_effect(value)`` until it returns None; for a
    ``Wait`` sleep until ``run.wait(seconds)``; for a ``Send`` call ``run.sending(request, now)``, send
    at ``run.anchor`` as the intended time, then ``run.called(record)`` (its value goes back to the
    behaviour); for a ``Fork`` start each sub-task as ``TaskRun(sub.task, now, retry, parent=run)``,
    wait for those with ``wait`` and call ``run.forked(now)``. Once its sub-tasks have ended too,
    ``run.finish(now)`` gives the record. A stop calls ``run.cancel(now)`` for the call in flight.
    """

    __slots__ = ("task", "arrival", "parent", "anchor", "outcome", "pending", "children_end", "calls_ok",
                 "time_in_calls", "time_in_ttft", "time_in_gaps", "client_lag", "last_error", "_behaviour")

    def __init__(self, task: Task, arrival: float, retry: RetryPolicy, parent: Optional[TaskRun] = None) -> None:
        self.task = task
        self.arrival = arrival
        self.parent = parent
        self.anchor = arrival
        """The intended time the next effect starts from: arrival, then each call's end plus gaps."""
        self.outcome: Optional[TaskOutcome] = None
        self.pending: Optional[tuple[CallRequest, float, float]] = None
        """The call in flight: (request, intended send, when the driver began sending it)."""
        self.children_end = 0.0
        self.calls_ok = 0
        self.time_in_calls = 0.0
        self.time_in_ttft = 0.0
        self.time_in_gaps = 0.0
        self.client_lag = 0.0
        self.last_error: Optional[str] = None
        self._behaviour = task_behaviour(task, retry, parent.root_id if parent is not None else task.id)

    @property
    def root_id(self) -> str:
        """The id of the top-level task this one belongs to."""
        run = self
        while run.parent is not None:
            run = run.parent
        return run.task.id

    def next_effect(self, value: Any = None) -> Optional[Effect]:
        """The behaviour's next effect, given the result of the last one; None once it has returned."""
        try:
            return self._behaviour.send(value)
        except StopIteration as done:
            self.outcome = done.value
            return None

    def wait(self, seconds: float) -> float:
        """A tool or think wait: the absolute time it ends."""
        self.anchor += seconds
        self.time_in_gaps += seconds
        return self.anchor

    def sending(self, request: CallRequest, now: float) -> None:
        """The driver begins sending `request` (intended at `anchor`)."""
        self.pending = (request, self.anchor, now)

    def called(self, record: CallRecord) -> CallRecord:
        """A call ended: add it to the totals; the next effect starts from its end."""
        self.pending = None
        self.time_in_calls += record.end - record.actual_send
        self.client_lag += record.actual_send - record.intended_send
        if record.ttft is not None:
            self.time_in_ttft += record.ttft
        if record.ok:
            self.calls_ok += 1
        else:
            self.last_error = record.error_class
        self.anchor = record.end
        return record

    def forked(self, now: float) -> None:
        """The waited-for sub-tasks of a fork have ended (or none were waited for)."""
        if now > self.anchor:
            self.anchor = now

    def cancel(self, now: float) -> Optional[CallRecord]:
        """The record of the call in flight, cut off by a stop (None when none was)."""
        if self.pending is None:
            return None
        request, intended, sent = self.pending
        self.pending = None
        return failed_call(request, intended, sent, now, CANCELLED, "run stopped while the call was in flight")

    def finish(self, now: float, cancelled: bool = False) -> TaskRecord:
        """The task's record, once it and its sub-tasks have ended; tells the parent when it ended."""
        self._behaviour.close()
        end = now if now > self.children_end else self.children_end
        outcome = self.outcome
        if outcome is None:  # stopped before the behaviour returned
            outcome = self.outcome = TaskOutcome(self.task.id, False, self.calls_ok, None)
        ok = outcome.ok and not cancelled
        parent = self.parent
        if parent is not None and end > parent.children_end:
            parent.children_end = end
        return TaskRecord(
            task_id=self.task.id,
            task_class=self.task.task_class,
            arrival=self.arrival,
            end=end,
            ok=ok,
            calls=self.calls_ok,
            calls_planned=len(self.task.calls),
            time_in_calls=self.time_in_calls,
            time_in_gaps=self.time_in_gaps,
            client_lag=self.client_lag,
            parent_id=None if parent is None else parent.task.id,
            failed_call=outcome.failed_call,
            error_class=CANCELLED if cancelled else (None if ok else self.last_error),
            time_in_ttft=self.time_in_ttft,
        )
