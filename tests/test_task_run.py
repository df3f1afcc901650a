"""The shared consumption of the behaviour (`simulator.task_run`) and the settings both drivers honour:
`max_in_flight` (the wait shows as client lag) and `drain` (what is left is cut off as cancelled)."""

from __future__ import annotations

import pytest

from simulator.behaviour import CallRequest, RetryPolicy
from simulator.sim.driver import simulate
from simulator.sim.profile import profile_from_dict
from simulator.task_run import CANCELLED, TaskRun, call_record
from simulator.workload import Call, SubTask, Task, Workload

PROFILE = profile_from_dict({
    "scheduler": {"max_num_seqs": 64, "max_num_batched_tokens": 512, "max_model_len": 1024},
    "kv_cache": {"block_size": 16, "num_blocks": 2000},
    "step_time": {"fixed": 0.01, "per_token": 0.0001, "per_decode_seq": 0.0005},
})


def burst(count: int, calls: int = 3, gap: float = 0.2) -> Workload:
    """`count` tasks arriving 10 ms apart, each `calls` calls with `gap` seconds between them."""
    return Workload(tuple(
        Task(f"t{i}", tuple(Call(200, 20, gap=gap if c else 0.0) for c in range(calls)), arrival=0.01 * i)
        for i in range(count)))


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    level = peak = 0
    for _, step in edges:
        level += step
        peak = max(peak, level)
    return peak


def test_simulate_max_in_flight_holds_tasks_back_and_shows_the_wait_as_client_lag():
    free, _ = simulate(burst(6), PROFILE)
    held, result = simulate(burst(6), PROFILE, max_in_flight=2)
    assert result.stop_reason == "completed" and len(held.tasks) == 6 and len(held.calls) == 18
    first = {c.task_id: c for c in held.calls if c.call_index == 0}
    assert len(first) == 6
    spans = [(first[t.task_id].actual_send, t.end) for t in held.tasks]
    assert most_at_once(spans) == 2 and most_at_once([(t.arrival, t.end) for t in free.tasks]) == 6
    # the first two start at once; each later one when an earlier one has ended
    ends = sorted(t.end for t in held.tasks)
    for i in range(6):
        record = first[f"t{i}"]
        assert record.intended_send == pytest.approx(0.01 * i)
        if i < 2:
            assert record.client_lag == 0.0
        else:
            assert record.actual_send == ends[i - 2] and record.client_lag > 0.1
    for task in held.tasks:
        lags = sum(c.client_lag for c in held.calls if c.task_id == task.task_id)
        assert task.client_lag == pytest.approx(lags) and task.arrival == pytest.approx(int(task.task_id[1:]) * 0.01)
    assert all(t.client_lag == 0.0 for t in free.tasks)


def test_simulate_drain_cuts_off_what_is_left_and_records_it_as_cancelled():
    workload = burst(4, calls=5, gap=2.0)
    sink, result = simulate(workload, PROFILE, drain=3.0)
    assert result.stop_reason == "drain_timeout" and result.partial and result.tasks_started == 4
    assert result.tasks_not_started == 0
    assert {t.task_id for t in sink.tasks} == {"t0", "t1", "t2", "t3"}
    deadline = 0.03 + 3.0
    for task in sink.tasks:
        assert not task.ok and task.error_class == CANCELLED and task.end == pytest.approx(deadline)
        assert task.calls < 5
    assert all(c.end <= deadline + 1e-9 for c in sink.calls)
    complete, done = simulate(workload, PROFILE, drain=60.0)
    assert done.stop_reason == "completed" and all(t.ok for t in complete.tasks) and len(complete.calls) == 20


def test_simulate_drain_records_the_call_in_flight_and_sub_tasks_before_their_parent():
    child = Task("child", (Call(100, 900),))
    parent = Task("parent", (Call(100, 10), Call(100, 10, gap=0.1)), subtasks=(SubTask(0, child, wait=True),))
    sink, result = simulate(Workload((parent,)), PROFILE, drain=0.2)
    assert result.stop_reason == "drain_timeout"
    assert [t.task_id for t in sink.tasks] == ["child", "parent"]
    cut = [c for c in sink.calls if c.error_class == CANCELLED]
    assert len(cut) == 1 and cut[0].task_id == "child" and cut[0].end == pytest.approx(0.2)
    assert sink.tasks[1].end == sink.tasks[0].end


def test_task_run_builds_the_records_of_what_it_is_told():
    parent_task = Task("p", (Call(10, 5), Call(20, 5, gap=1.5)), task_class="coder")
    parent = TaskRun(parent_task, 2.0, RetryPolicy())
    effect = parent.next_effect()
    request = effect.request
    assert isinstance(request, CallRequest) and parent.anchor == 2.0
    parent.sending(request, 2.25)
    wait = parent.next_effect(parent.called(call_record(request, parent.anchor, 2.25, 3.0, ttft=0.5, output_tokens=5)))
    assert parent.wait(wait.seconds) == 4.5
    second = parent.next_effect(None).request
    parent.sending(second, 4.5)
    failed = parent.cancel(5.0)
    assert failed.error_class == CANCELLED and failed.intended_send == 4.5 and failed.input_tokens == 20
    child = TaskRun(Task("c", (Call(1, 1),)), 3.0, RetryPolicy(), parent)
    assert child.finish(9.0, cancelled=True).parent_id == "p"
    record = parent.finish(6.0, cancelled=True)
    assert record.end == 9.0  # its sub-task ended later
    assert (record.calls, record.calls_planned, record.task_class) == (1, 2, "coder")
    assert record.client_lag == 0.25 and record.time_in_gaps == 1.5 and record.time_in_ttft == 0.5
    assert record.time_in_calls == 0.75 and not record.ok and record.error_class == CANCELLED
