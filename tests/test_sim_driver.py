"""The SimPy driver: open-loop arrivals, closed loop within a task, fork/join, records, 4xx."""

from __future__ import annotations

import pytest

from simulator.behaviour import RetryPolicy
from simulator.sim.driver import simulate
from simulator.sim.profile import profile_from_dict
from simulator.workload import Call, SubTask, Task, Workload

PROFILE = profile_from_dict({
    "scheduler": {"max_num_seqs": 64, "max_num_batched_tokens": 512, "max_model_len": 1024},
    "kv_cache": {"block_size": 16, "num_blocks": 2000},
    "step_time": {"fixed": 0.01, "per_token": 0.0001, "per_decode_seq": 0.0005, "per_context_token": 1e-6},
})


def by_task(sink):
    calls = {}
    for record in sink.calls:
        calls.setdefault(record.task_id, []).append(record)
    return calls, {t.task_id: t for t in sink.tasks}


def test_closed_loop_each_call_starts_at_previous_end_plus_gap():
    task = Task("t", (Call(100, 20), Call(150, 10, gap=2.0), Call(200, 5, gap=0.5)), arrival=3.0)
    sink, result = simulate(Workload((task,)), PROFILE, keep_gaps=True)
    calls, tasks = by_task(sink)
    first, second, third = calls["t"]
    assert first.intended_send == 3.0
    assert second.intended_send == first.end + 2.0
    assert third.intended_send == second.end + 0.5
    assert len(sink.calls) == 3
    for record, gaps in zip(sink.calls, sink.gaps, strict=True):
        assert record.ok and record.actual_send == record.intended_send and record.status == 200
        assert record.output_tokens == record.requested_output_tokens
        assert record.itl_count == len(gaps) == record.output_tokens - 1
        assert record.itl_max == max(gaps) and record.itl_mean == pytest.approx(sum(gaps) / len(gaps))
        assert 0 < record.ttft < record.latency
    t = tasks["t"]
    assert t.ok and t.calls == 3 and t.end == third.end and t.arrival == 3.0
    assert t.time_in_gaps == 2.5 and t.client_lag == 0.0
    assert t.time_in_calls == pytest.approx(sum(c.latency for c in calls["t"]))
    assert result.end == third.end


def test_open_loop_tasks_start_at_their_arrival_whatever_the_load():
    tasks = tuple(Task(f"t{i}", (Call(500, 200),), arrival=0.1 * i) for i in range(10))
    sink, _ = simulate(Workload(tasks), PROFILE)
    calls, _ = by_task(sink)
    for i in range(10):
        assert calls[f"t{i}"][0].actual_send == pytest.approx(0.1 * i, abs=1e-12)


def test_fork_waits_for_joined_subtasks_and_not_for_detached_ones():
    joined = Task("child-joined", (Call(50, 30), Call(60, 10, gap=1.0)))
    detached = Task("child-detached", (Call(50, 10, gap=20.0),))
    parent = Task("parent", (Call(100, 10), Call(120, 10, gap=0.25)), arrival=1.0,
                  subtasks=(SubTask(0, joined, wait=True), SubTask(0, detached, wait=False)))
    sink, _ = simulate(Workload((parent,)), PROFILE)
    calls, tasks = by_task(sink)
    first, second = calls["parent"]
    child = tasks["child-joined"]
    assert child.parent_id == "parent" and tasks["child-detached"].parent_id == "parent"
    assert child.arrival == first.end and tasks["child-detached"].arrival == first.end
    assert second.intended_send == child.end + 0.25
    # the parent ends with its last sub-task, the detached one
    assert tasks["parent"].end == tasks["child-detached"].end > second.end
    assert len(sink.tasks) == 3 and all(t.ok for t in sink.tasks)


def test_calls_beyond_max_model_len_fail_with_http_4xx():
    task = Task("long", (Call(1000, 100), Call(10, 10)))
    sink, _ = simulate(Workload((task,)), PROFILE, retry=RetryPolicy(retries=1, backoff=0.5))
    assert [c.error_class for c in sink.calls] == ["http_4xx", "http_4xx"]
    assert sink.calls[0].status == 400 and not sink.calls[0].ok
    assert sink.calls[1].attempt == 1 and sink.calls[1].intended_send == 0.5
    (record,) = sink.tasks
    assert not record.ok and record.failed_call == 0 and record.error_class == "http_4xx" and record.calls == 0


def test_prefix_hits_follow_the_trace_reuse():
    ids = tuple(range(1, 9))
    task = Task("agent", (Call(128, 10, hash_ids=ids, block_size=16),
                          Call(160, 10, gap=1.0, hash_ids=ids + (99, 100), block_size=16)))
    sink, _ = simulate(Workload((task,)), PROFILE)
    assert [c.cached_tokens for c in sink.calls] == [0, 128]


def test_fast_decode_path_gives_identical_records_through_the_driver():
    import numpy as np

    rng = np.random.default_rng(11)
    tasks = []
    for i in range(12):
        ids = tuple(range(1, 9))
        calls = []
        for j in range(5):
            ids = ids + tuple(int(x) for x in rng.integers(10**6, 10**7, size=int(rng.integers(1, 4))))
            calls.append(Call(len(ids) * 16 - 3, int(rng.integers(1, 60)), gap=float(rng.choice([0.0, 0.05, 0.7])),
                              hash_ids=ids, block_size=16))
        tasks.append(Task(f"t{i}", tuple(calls), arrival=float(rng.uniform(0, 2))))
    workload = Workload(tuple(tasks))
    slow, slow_result = simulate(workload, PROFILE, keep_gaps=True, fast_decode=False)
    fast, fast_result = simulate(workload, PROFILE, keep_gaps=True, fast_decode=True)
    assert fast_result.twin.fast_chunks > 0 and slow_result.twin.fast_chunks == 0
    assert fast.calls == slow.calls and fast.gaps == slow.gaps and fast.tasks == slow.tasks
    assert sum(c.cached_tokens for c in fast.calls) > 0
