"""The parts of a sharded run that need no Ray cluster: shards' tallies packed, pickled and merged equal
one tally of the union of their records (histograms bucket for bucket); the plan deals whole tasks
round-robin and sizes shards by bursts; parts merge into the folder's record files by end time and a
dead shard's started tasks become failed records; the warm pool opens its connections before the
calls, which then open none; bodies built ahead are the bodies built at send time; `--ray` without Ray
says how to install it."""

from __future__ import annotations

import asyncio
import json
import pickle
import sys
from collections import Counter

import numpy as np
import pytest

from simulator.behaviour import CallRequest
from simulator.emulator.server import run_emulator
from simulator.errors import InputError
from simulator.live.ahead import BodiesAhead, expected_concurrency, get_ready
from simulator.live.client import Client, Target
from simulator.metrics import results
from simulator.metrics.records import CallRecord, TaskRecord
from simulator.metrics.results import Window
from simulator.metrics.slo import PercentileTarget, Slo
from simulator.metrics.summary import from_tally
from simulator.metrics.tally import RunTally
from simulator.scale import merge, parts, plan, ray_module
from simulator.workload import Call, SubTask, Task, Workload

SLO = Slo(ttft_ms=PercentileTarget(p50=30), task_s=PercentileTarget(p90=2.0))
WINDOW = Window(0.2, None)


def records(seed: int, tasks: int) -> tuple[list[CallRecord], list[TaskRecord]]:
    """Random call and task records of several classes, some failed or cancelled, some with cached tokens."""
    rng = np.random.default_rng(seed)
    calls, done = [], []
    for t in range(tasks):
        cls = ("plan", "code", "review")[t % 3]
        arrival = float(rng.uniform(0, 5))
        now = arrival
        ok_task = rng.random() > 0.15
        for i in range(int(rng.integers(1, 6))):
            ttft, latency = float(rng.lognormal(-4, 0.5)), float(rng.lognormal(-1, 0.7))
            ok = ok_task or i == 0
            out = int(rng.integers(2, 300))
            calls.append(CallRecord(
                task_id=f"t{t}", task_class=cls, call_index=i, attempt=0, intended_send=now,
                actual_send=now + float(rng.exponential(0.002)), end=now + latency, ok=ok,
                ttft=ttft if ok else None, itl_count=out - 1 if ok else 0,
                itl_mean=(latency - ttft) / (out - 1) if ok else None, input_tokens=int(rng.integers(10, 9000)),
                output_tokens=out if ok else 0, requested_output_tokens=out,
                cached_tokens=int(rng.integers(0, 5000)) if t % 2 else None,
                error_class=None if ok else ("http_5xx" if t % 4 else "cancelled"),
                error_message=None if ok else f"failure {t % 7}"))
            now += latency + float(rng.exponential(0.1))
        done.append(TaskRecord(task_id=f"t{t}", task_class=cls, arrival=arrival, end=now, ok=ok_task, calls=3,
                               calls_planned=5, time_in_calls=(now - arrival) / 2, time_in_gaps=0.1, client_lag=0.01,
                               parent_id=f"t{t - 1}" if t % 5 == 4 else None, time_in_ttft=0.05,
                               error_class=None if ok_task else "http_5xx"))
    return calls, done


def counts(h) -> list[int]:
    return list(h.counts)


def test_merged_histograms_equal_those_of_the_union_of_the_shards_records():
    calls, tasks = records(3, 300)
    union = RunTally(WINDOW, SLO).feed(calls, tasks)
    packs = []
    for shard in range(3):  # tasks dealt to shards whole: a task's calls go with it
        mine = {t.task_id for t in tasks[shard::3]}
        tally = RunTally(WINDOW, SLO).feed([c for c in calls if c.task_id in mine], tasks[shard::3])
        packs.append(pickle.loads(pickle.dumps(merge.pack(tally))))  # what travels between processes
    merged = merge.merged(WINDOW, SLO, packs)
    assert set(merged.hist) == set(union.hist)
    for name in union.hist:
        assert union.hist[name].get_total_count() > 0
        assert counts(merged.hist[name]) == counts(union.hist[name]), name
    assert sorted(merged.by_class) == sorted(union.by_class) == ["code", "plan", "review"]
    for cls, group in union.by_class.items():
        assert counts(merged.by_class[cls].completion) == counts(group.completion)
        assert (merged.by_class[cls].ok, merged.by_class[cls].failed) == (group.ok, group.failed)
    for name in ("attempts", "calls_ok", "failed_attempts", "cancelled_calls", "window_calls", "window_ok",
                 "input_tokens", "output_tokens", "cached_tokens", "meeting_ttft", "latest_end", "tasks_finished",
                 "top_finished", "errors", "messages"):
        assert getattr(merged, name) == getattr(union, name), name
    one, _ = from_tally(union, planned={"tasks": 300, "calls": len(calls)})
    both, _ = from_tally(merged, planned={"tasks": 300, "calls": len(calls)})
    both, one = both.to_dict(), one.to_dict()
    key = lambda m: (m["error_class"], m["message"])  # noqa: E731 - equal counts may come in another order
    assert sorted(both.pop("error_messages"), key=key) == sorted(one.pop("error_messages"), key=key)
    assert _approx_equal(both, one)


def _approx_equal(a, b) -> bool:
    """Equal, floats within 1e-9 relative (sums of floats added in another order)."""
    if isinstance(a, dict):
        assert list(a) == list(b)
        return all(_approx_equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        assert len(a) == len(b)
        return all(_approx_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-12)
        return True
    assert a == b
    return True


def test_a_tally_field_of_an_unknown_type_fails_loudly():
    tally = RunTally(WINDOW, SLO)
    tally.something_new = object()
    with pytest.raises(TypeError, match="something_new"):
        merge.pack(tally)


def workload(n: int = 10) -> Workload:
    child = Task("c", (Call(10, 5),))
    return Workload(tuple(Task(f"t{i}", (Call(100, 10), Call(200, 10, gap=0.5)), arrival=float(i // 4),
                               subtasks=(SubTask(-1, Task(f"t{i}.sub", (Call(50, 5),))),) if i == 0 else ())
                          for i in range(n)) + (Task("late", (Call(10, 5),), arrival=30.0, subtasks=(SubTask(0, child),)),))


def test_plan_deals_whole_tasks_round_robin_by_arrival_and_sizes_shards_by_bursts(monkeypatch):
    wl = workload()
    pieces = plan.split(wl, 3)
    ids = [[t.id for t in piece.tasks] for piece in pieces]
    assert sorted(sum(ids, [])) == sorted(t.id for t in wl.tasks)  # every task once, sub-agents inside
    assert ids[0][:2] == ["t0", "t3"] and ids[1][:2] == ["t1", "t4"]
    assert pieces[0].tasks[0].subtasks[0].task.id == "t0.sub"
    # four tasks arrive at 0 and the first brings a sub-agent that starts with it
    assert plan.peak_burst(wl) == 5
    monkeypatch.setattr(plan, "BURST_PER_SHARD", 2)
    assert plan.shard_count("auto", wl, cpus=16) == 3
    assert plan.shard_count(None, wl, cpus=2) == 2
    assert plan.shard_count(7, wl, cpus=1) == 7  # a number is taken as asked (the cluster is checked later)
    assert plan.shard_count(50, wl, cpus=None) == len(wl.tasks)
    assert plan.split_limit(10, 3) == [4, 3, 3]
    assert plan.split_limit(None, 2) == [None, None]


def test_expected_concurrency_counts_tasks_busy_at_once_in_the_first_seconds():
    # 4 tasks at 0 (one with a sub-agent), 4 at 1 s, 2 at 2 s: each busy 1 + 0.5 + 1 s (assumed call time)
    assert expected_concurrency(workload()) == 11
    burst = Workload(tuple(Task(f"s{i}", (Call(10, 5, server_time=0.1),) * 3) for i in range(256)))
    assert expected_concurrency(burst) == 256
    later = Workload((Task("x", (Call(10, 5),), arrival=100.0),) + tuple(
        Task(f"y{i}", (Call(10, 5),), arrival=200.0) for i in range(9)))
    assert expected_concurrency(later) == 1  # arrivals after the first WARM_HORIZON seconds get no connection


def write_part(part, calls, tasks, started):
    """A shard's part as a shard writes it: records in the order they ended."""
    part.mkdir(parents=True)
    calls, tasks = sorted(calls, key=lambda c: c.end), sorted(tasks, key=lambda t: t.end)
    (part / results.CALLS_FILE).write_text("".join(json.dumps(results.record_dict(c)) + "\n" for c in calls))
    (part / results.TASKS_FILE).write_text("".join(json.dumps(results.record_dict(t)) + "\n" for t in tasks)
                                           + '{"task_id": "cut sh')  # a line cut short by a killed shard
    results.write_json(part, results.PROGRESS_FILE, {"tasks_started": started})


def test_parts_merge_by_end_time_and_a_dead_shards_started_tasks_become_failed_records(tmp_path):
    calls, tasks = records(5, 40)
    for i in range(2):
        write_part(parts.part_folder(tmp_path, i), calls[i::2], tasks[i::2], started=20)
    wl_tasks = [Task(f"t{i}", (Call(10, 5),) * 5, arrival=float(i)) for i in range(30)]
    finished = [t.task_id for t in tasks[1::2] if t.parent_id is None]
    ok_calls = Counter(c.task_id for c in calls if c.ok)
    lost = parts.lost_records(wl_tasks, 25, finished, ok_calls, at=12.0)
    assert [r.task_id for r in lost] == [f"t{i}" for i in range(25) if f"t{i}" not in finished]
    assert all(not r.ok and r.error_class == parts.LOST and r.end == max(12.0, r.arrival) for r in lost)
    assert lost[0].calls == ok_calls[lost[0].task_id]
    parts.append_tasks(parts.part_folder(tmp_path, 0), lost)  # after the cut line: it is skipped, these are read
    started = parts.merge_parts(tmp_path, 2)
    assert started == 40
    merged_calls, merged_tasks = results.read_calls(tmp_path), results.read_tasks(tmp_path)
    assert sorted(map(results.record_dict, merged_calls), key=str) == sorted(map(results.record_dict, calls), key=str)
    assert [c.end for c in merged_calls] == sorted(c.end for c in calls)
    assert len(merged_tasks) == len(tasks) + len(lost)
    assert not (parts.part_folder(tmp_path, 0) / results.CALLS_FILE).exists()
    assert parts.unmerged(tmp_path) is None


def test_a_folder_whose_driver_died_is_merged_from_the_command_line(tmp_path, capsys):
    calls, tasks = records(6, 10)
    write_part(parts.part_folder(tmp_path, 0), calls, tasks, started=10)
    assert parts.unmerged(tmp_path) == 1
    assert parts.main([str(tmp_path)]) == 0
    assert len(results.read_calls(tmp_path)) == len(calls)
    assert (parts.part_folder(tmp_path, 0) / results.CALLS_FILE).exists()  # kept: the only copy was there
    assert parts.main([str(tmp_path)]) == 2


async def test_the_warm_pool_opens_connections_the_burst_then_reuses():
    async with run_emulator(ttft=0.005, itl=0.001) as url:
        async with Client(Target(base_url=url), 0.0) as client:
            before = client.connections_opened  # the model lookup's, kept alive: the pool counts it
            opened = await client.warm(40)
            assert opened == 40 - before and client.connections_opened == 40
            burst = [CallRequest(f"b{i}", "x", 0, Call(20, 3)) for i in range(40)]
            done = await asyncio.gather(*(client.send(r, 0.0) for r in burst))
            assert all(rec.ok for rec, _ in done)
            assert client.connections_opened == 40  # every call of the burst found its connection open


async def test_bodies_built_ahead_are_the_bodies_built_at_send_time():
    async with run_emulator(ttft=0.001, itl=0.001) as url:
        async with Client(Target(base_url=url), 0.0) as client:
            wl = workload()
            ahead = await get_ready(client, wl, warm=0)
            first = [t for t in wl.tasks if t.arrival <= 1.0]
            assert ahead.prepared == sum(len(t.calls) for top in first for t in top.walk())
            request = CallRequest("t1", "default", 1, wl.tasks[1].calls[1], 0)
            key = ("t1", 1, 0)
            assert client._prepared[key] == client._body(request)
            await client.send(request, 0.0)
            assert key not in client._prepared  # taken by the send
            size = client.prepared_bytes
            client.drop_prepared(0)
            assert client.prepared_bytes == 0 and size > 0
            assert BodiesAhead(client, wl, budget=0).upto(100.0)


def test_ray_missing_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(InputError, match=r"pip install 'agentload\[ray\]'"):
        ray_module()


def test_a_run_that_lost_a_shard_exits_non_zero():
    from simulator.metrics.summary import Summary
    from simulator.metrics.verdict import CALLS_FAILED, Verdict
    from simulator.scale.report import lost_verdict

    summary = Summary(partial=True, stop_reason="shard_lost")
    summary.ray = {"shards": 2, "lost": [1]}
    result = lost_verdict(summary, Verdict(0))
    assert result.code == CALLS_FAILED and "shard(s) 1 lost" in result.reason
    assert lost_verdict(summary, Verdict(143, "stopped")).code == 143  # a signal's code stays
    summary.ray = {"shards": 2, "lost": []}
    assert lost_verdict(summary, Verdict(0)).code == 0
