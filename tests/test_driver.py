"""The asyncio driver: closed loop within a task, open loop across tasks, fork/join, lag, retries, stop.

A fake client stands in for HTTP; where a test needs an order of events it uses asyncio events and a
deadlock guard (`asyncio.wait_for`), never sleeps or timed assertions.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from itertools import pairwise
from typing import Awaitable, Callable, Optional

import pytest

from simulator.behaviour import CallRequest, RetryPolicy
from simulator.live.driver import CANCELLED, Driver
from simulator.metrics.records import CallRecord, TaskRecord
from simulator.workload import Call, SubTask, Task, Workload

GUARD = 20.0  # seconds before a would-be deadlock fails the test


class FakeClient:
    """Answers every call after `latency` seconds; `hook(request)` may block or fail a call."""

    def __init__(self, t0: float, latency: float = 0.002,
                 hook: Optional[Callable[[CallRequest], Awaitable[bool]]] = None) -> None:
        self.t0 = t0
        self.latency = latency
        self.hook = hook

    def now(self) -> float:
        return time.perf_counter() - self.t0

    async def send(self, request: CallRequest, intended_send: float) -> tuple[CallRecord, list[float]]:
        actual = self.now()
        ok = True
        if self.hook is not None:
            ok = await self.hook(request)
        await asyncio.sleep(self.latency)
        end = self.now()
        out = request.call.output_tokens if ok else 0
        record = CallRecord(
            task_id=request.task_id, task_class=request.task_class, call_index=request.call_index,
            attempt=request.attempt, intended_send=intended_send, actual_send=actual, end=end, ok=ok,
            ttft=(end - actual) / 2 if ok else None, input_tokens=request.call.input_tokens,
            output_tokens=out, requested_output_tokens=request.call.output_tokens,
            error_class=None if ok else "http_5xx",
        )
        return record, [(end - actual) / 4] * max(0, out - 1)


class ListSink:
    def __init__(self) -> None:
        self.calls: list[CallRecord] = []
        self.tasks: list[TaskRecord] = []

    def call(self, record: CallRecord, gaps=()) -> None:
        self.calls.append(record)

    def task(self, record: TaskRecord) -> None:
        self.tasks.append(record)


def chain(task_id: str, gaps: list[float], arrival: float = 0.0, subtasks=(), task_class: str = "default") -> Task:
    calls = tuple(Call(input_tokens=100 * (i + 1), output_tokens=5, gap=g) for i, g in enumerate(gaps))
    return Task(task_id, calls, arrival=arrival, task_class=task_class, subtasks=tuple(subtasks))


async def drive(workload: Workload, hook=None, **kwargs) -> tuple[ListSink, Driver, object]:
    t0 = time.perf_counter()
    sink = ListSink()
    driver = Driver(FakeClient(t0, hook=hook), workload, sink, t0=t0, **kwargs)
    result = await asyncio.wait_for(driver.run(), GUARD)
    return sink, driver, result


def by_task(calls: list[CallRecord]) -> dict[str, list[CallRecord]]:
    out: dict[str, list[CallRecord]] = defaultdict(list)
    for c in calls:
        out[c.task_id].append(c)
    for records in out.values():
        records.sort(key=lambda c: (c.call_index, c.attempt))
    return out


async def test_closed_loop_calls_follow_predecessor_end_plus_gap():
    gaps = [0.0, 0.01, 0.0, 0.02]
    tasks = tuple(chain(f"t{i}", gaps, arrival=0.005 * i) for i in range(3))
    sink, _, result = await drive(Workload(tasks))
    assert result.stop_reason == "completed" and not result.partial
    grouped = by_task(sink.calls)
    assert sorted(grouped) == ["t0", "t1", "t2"]
    assert len(sink.calls) == len(tasks) * len(gaps)
    for task in tasks:
        records = grouped[task.id]
        assert [(c.call_index, c.attempt, c.ok) for c in records] == [(i, 0, True) for i in range(len(gaps))]
        assert records[0].intended_send == pytest.approx(task.arrival)
        for prev, cur, gap in zip(records[:-1], records[1:], gaps[1:], strict=True):
            assert cur.intended_send == pytest.approx(prev.end + gap, abs=1e-9)
            assert cur.actual_send >= prev.end + gap - 1e-9
    assert sorted(t.task_id for t in sink.tasks) == ["t0", "t1", "t2"]  # one record per task
    for record in sink.tasks:
        assert record.ok and record.calls == 4 and record.calls_planned == 4
        assert record.time_in_gaps == pytest.approx(sum(gaps))
        assert record.end >= max(c.end for c in grouped[record.task_id])


async def test_waited_subtask_finishes_before_parent_continues_and_detached_does_not_block():
    parent_second_call_sent = asyncio.Event()

    async def hook(request: CallRequest) -> bool:
        if request.task_id == "parent" and request.call_index == 1:
            parent_second_call_sent.set()
        if request.task_id == "detached":
            await parent_second_call_sent.wait()  # would deadlock if the parent waited for it
        return True

    waited = chain("waited", [0.0, 0.005])
    detached = chain("detached", [0.0])
    parent = chain("parent", [0.0, 0.0], subtasks=[SubTask(0, waited, wait=True), SubTask(0, detached, wait=False)])
    sink, _, _ = await drive(Workload((parent,)), hook=hook)

    tasks = {t.task_id: t for t in sink.tasks}
    assert set(tasks) == {"parent", "waited", "detached"}
    assert tasks["waited"].parent_id == "parent" and tasks["detached"].parent_id == "parent"
    calls = by_task(sink.calls)
    parent_next = calls["parent"][1]
    assert tasks["waited"].end <= parent_next.actual_send
    assert calls["detached"][0].end >= parent_next.actual_send
    # the parent ends when all its sub-tasks have
    assert tasks["parent"].end >= tasks["detached"].end
    assert tasks["waited"].arrival >= calls["parent"][0].end


async def test_open_loop_arrivals_keep_schedule_when_server_is_slow():
    n = 4
    all_in = asyncio.Event()
    in_flight = 0

    async def hook(request: CallRequest) -> bool:
        nonlocal in_flight
        in_flight += 1
        if in_flight == n:
            all_in.set()
        await all_in.wait()  # the server answers nothing until every task has sent
        return True

    tasks = tuple(chain(f"t{i}", [0.0], arrival=0.01 * i) for i in range(n))
    sink, _, _ = await drive(Workload(tasks), hook=hook)
    calls = by_task(sink.calls)
    assert sorted(calls) == [t.id for t in tasks] and len(sink.calls) == n  # one call per task
    first_end = min(c.end for c in sink.calls)
    for task in tasks:
        (record,) = calls[task.id]
        assert record.intended_send == pytest.approx(task.arrival)
        assert record.actual_send <= first_end


async def test_max_in_flight_queues_arrivals_and_reports_their_lag():
    n = 3
    tasks = tuple(chain(f"t{i}", [0.0, 0.0], arrival=0.0) for i in range(n))
    sink, _, result = await drive(Workload(tasks), max_in_flight=1)
    assert result.stop_reason == "completed" and result.tasks_started == n
    # every task ran to its end, once: n task records and 2 calls each
    assert sorted(t.task_id for t in sink.tasks) == [t.id for t in tasks]
    assert all(t.ok and t.calls == 2 for t in sink.tasks)
    calls = by_task(sink.calls)
    assert sorted(calls) == [t.id for t in tasks]
    assert all([c.call_index for c in records] == [0, 1] for records in calls.values())
    ordered = sorted(sink.tasks, key=lambda t: t.end)
    pairs = list(pairwise(ordered))
    assert len(pairs) == n - 1
    for earlier, later in pairs:
        first = calls[later.task_id][0]
        # queued behind the task before it: sent only once that one ended, and the wait is client lag
        assert first.actual_send >= earlier.end
        assert first.intended_send == 0.0
        assert first.client_lag >= earlier.end - 1e-9 > 0
        assert later.client_lag >= first.client_lag - 1e-9


async def test_failed_call_is_retried_after_backoff():
    attempts = defaultdict(int)

    async def hook(request: CallRequest) -> bool:
        attempts[request.call_index] += 1
        return not (request.call_index == 1 and request.attempt == 0)

    sink, _, _ = await drive(Workload((chain("t", [0.0, 0.0, 0.0]),)), hook=hook,
                             retry=RetryPolicy(retries=2, backoff=0.01))
    records = by_task(sink.calls)["t"]
    assert [(c.call_index, c.attempt, c.ok) for c in records] == [(0, 0, True), (1, 0, False), (1, 1, True), (2, 0, True)]
    assert records[2].intended_send == pytest.approx(records[1].end + 0.01)
    (task,) = sink.tasks
    assert task.ok and task.calls == 3


async def test_task_gives_up_after_retries_and_records_error_class():
    async def hook(request: CallRequest) -> bool:
        return request.call_index != 1

    sink, _, _ = await drive(Workload((chain("t", [0.0, 0.0, 0.0]),)), hook=hook)
    (task,) = sink.tasks
    assert not task.ok and task.failed_call == 1 and task.error_class == "http_5xx" and task.calls == 1
    assert len(sink.calls) == 2


async def test_duration_stops_arrivals():
    tasks = tuple(chain(f"t{i}", [0.0], arrival=float(i)) for i in range(3))
    sink, _, result = await drive(Workload(tasks), duration=0.5)
    assert [t.task_id for t in sink.tasks] == ["t0"]
    assert result.tasks_started == 1 and result.tasks_not_started == 2


async def test_stop_cancels_in_flight_and_records_it():
    never = asyncio.Event()
    sent = 0
    driver_ref: list[Driver] = []

    async def hook(request: CallRequest) -> bool:
        nonlocal sent
        sent += 1
        if sent == 4:
            driver_ref[0].stop()
        if sent >= 4:
            await never.wait()
        return True

    t0 = time.perf_counter()
    sink = ListSink()
    tasks = (chain("a", [0.0, 0.0, 0.0]), chain("b", [0.0, 0.0], arrival=0.001, subtasks=[SubTask(0, chain("sub", [0.0]), True)]),
             chain("late", [0.0], arrival=30.0))
    driver = Driver(FakeClient(t0, hook=hook), Workload(tasks), sink, t0=t0)
    driver_ref.append(driver)
    result = await asyncio.wait_for(driver.run(), GUARD)
    assert result.stop_reason == "interrupted" and result.partial
    assert result.tasks_not_started == 1
    cancelled_calls = [c for c in sink.calls if c.error_class == CANCELLED]
    # every call that was sent has exactly one record: finished, or cancelled while in flight
    assert len(sink.calls) == sent == 4
    assert len({(c.task_id, c.call_index) for c in sink.calls}) == sent
    assert cancelled_calls and all(c.ok or c.error_class == CANCELLED for c in sink.calls)
    tasks_seen = {t.task_id: t for t in sink.tasks}
    assert {"a", "b"} <= set(tasks_seen) and "late" not in tasks_seen
    assert len(sink.tasks) == len(tasks_seen)  # one record per started task
    assert any(t.error_class == CANCELLED and not t.ok for t in tasks_seen.values())
