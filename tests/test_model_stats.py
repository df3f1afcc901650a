"""Workload statistics and fidelity metrics on hand-built workloads with hand-computed answers."""

import dataclasses
import json
import math

import numpy as np
import pytest

from simulator.model.fidelity import compare_workloads
from simulator.model.stats import Distribution, arrival_stats, index_of_dispersion, workload_stats
from simulator.workload import Call, SubTask, Task, Workload


def _workload() -> Workload:
    """Two tasks, one with a sub-task; block size 10 keeps the arithmetic readable."""
    sub = Task("a/sub", (
        Call(30, 3, hash_ids=(1, 2, 5), block_size=10, server_time=2.0),
        Call(28, 4, gap=1.0, hash_ids=(1, 2, 5), block_size=10, server_time=3.0),
    ))
    a = Task("a", (
        Call(20, 10, hash_ids=(1, 2), block_size=10, server_time=1.0),
        Call(35, 11, gap=2.0, hash_ids=(1, 2, 3), block_size=10, server_time=1.5),
        Call(40, 12, gap=0.5, hash_ids=(7, 2, 3, 4), block_size=10, server_time=0.5),
    ), arrival=0.0, subtasks=(SubTask(0, sub),))
    b = Task("b", (
        Call(20, 1, hash_ids=(1, 2), block_size=10),
        Call(25, 2, gap=3.0),
    ), arrival=5.0)
    return Workload((b, a))  # out of arrival order on purpose


def test_distribution_percentiles_follow_numpy_linear_rule():
    d = Distribution.of(np.arange(1, 102))
    assert (d.count, d.mean, d.p50, d.p90, d.p99, d.max) == (101, 51.0, 51.0, 91.0, 100.0, 101.0)
    assert Distribution.of(np.array([])) == Distribution(0)


def test_counts_and_marginals():
    s = workload_stats(_workload())
    assert (s.tasks, s.calls, s.subtasks) == (2, 7, 1)
    assert (s.calls_per_task.p50, s.calls_per_task.max, s.calls_per_task.mean) == (3.5, 5.0, 3.5)
    assert s.input_tokens.max == 40 and s.input_tokens.count == 7
    assert s.output_tokens.mean == pytest.approx((10 + 11 + 12 + 3 + 4 + 1 + 2) / 7)
    # appended: a: 20, 35-20, 40 (no shared lead); sub: 30, 0 (all blocks shared); b: 20, 25-20 (by length)
    assert s.appended_tokens.mean == pytest.approx((20 + 15 + 40 + 30 + 0 + 20 + 5) / 7)
    assert s.appended_tokens.p50 == 20
    # gaps of every call but the first of each (sub-)task
    assert s.gaps_s.count == 4 and s.gaps_s.mean == pytest.approx((2.0 + 0.5 + 1.0 + 3.0) / 4)


def test_task_duration_uses_gaps_server_times_and_subtasks():
    s = workload_stats(_workload())
    # a: own calls end at 1, 4.5, 5.5; the sub-task starts at 1 and lasts 2 + 1 + 3 = 6, so a ends at 7.
    # b: no server times, so gaps only: 3.
    assert (s.task_duration_s.max, s.task_duration_s.p50) == (7.0, 5.0)


def test_task_duration_prefers_recorded_send_times():
    task = Task("t", (Call(1, 1, sent_at=0.0, server_time=2.0), Call(1, 1, gap=1.0, sent_at=10.0, server_time=0.5)))
    assert workload_stats(Workload((task,))).task_duration_s.max == 10.5


def test_prefix_reuse_within_and_across_tasks():
    reuse = workload_stats(_workload()).prefix_reuse
    # hashed inputs: 20 + 35 + 40 + 30 + 28 + 20 = 173. Within the task: a's second call reuses 2 blocks (20),
    # its third none (leading block 7 is new), the sub-task's first call 2 blocks (20), its second all three
    # capped at its 28 input tokens. Across tasks, b's first call also reuses 2 blocks (20).
    assert reuse.within_task == pytest.approx(68 / 173)
    assert reuse.across_tasks == pytest.approx(88 / 173)
    assert reuse.hashed_input_share == pytest.approx(173 / 198)


def test_prefix_reuse_ignores_equal_ids_of_another_block_size_and_missing_hashes():
    t1 = Task("x", (Call(64, 1, hash_ids=(1,), block_size=64),))
    t2 = Task("y", (Call(16, 1, hash_ids=(1,), block_size=16), Call(16, 1, hash_ids=(1,), block_size=16)), arrival=1)
    reuse = workload_stats(Workload((t1, t2))).prefix_reuse
    assert reuse.across_tasks == pytest.approx(16 / 96)
    none = workload_stats(Workload((Task("z", (Call(5, 1),)),))).prefix_reuse
    assert (none.within_task, none.across_tasks, none.hashed_input_share) == (None, None, 0.0)


def test_dispersion_and_cv_of_bursts():
    arrivals = np.repeat(np.arange(0.0, 100.0, 10.0), 5)  # 5 tasks at once every 10 s, span 90 s
    # 1 s windows: 90 complete ones, 9 hold 5 tasks (the burst at 90 s starts window 91, not complete):
    # mean 0.5, variance 9 * 25 / 90 - 0.25 = 2.25, so 4.5.
    assert index_of_dispersion(arrivals, 1.0) == pytest.approx(4.5)
    assert index_of_dispersion(arrivals, 10.0) == pytest.approx(0.0)
    assert index_of_dispersion(arrivals, 60.0) is None  # one complete window only
    a = arrival_stats(arrivals)
    # 49 inter-arrival times: 9 of 10 s, 40 of 0 s, so CV^2 = 49 / 9 - 1.
    assert a.interarrival_cv == pytest.approx(math.sqrt(49 / 9 - 1))
    assert a.rate_per_s == pytest.approx(49 / 90) and a.span_s == 90.0
    assert a.index_of_dispersion["1s"] == pytest.approx(4.5)


def test_cv_and_dispersion_poisson_versus_regular():
    rng = np.random.default_rng(7)
    poisson = np.cumsum(rng.exponential(1.0, size=20_000))
    regular = np.arange(0.0, 2000.0, 1.0)
    p, r = arrival_stats(poisson), arrival_stats(regular)
    assert p.interarrival_cv == pytest.approx(1.0, abs=0.05)
    assert p.index_of_dispersion["10s"] == pytest.approx(1.0, abs=0.15)
    assert r.interarrival_cv == pytest.approx(0.0, abs=1e-12)
    assert r.index_of_dispersion["1s"] == pytest.approx(0.0, abs=1e-12)
    assert r.index_of_dispersion["60s"] == pytest.approx(0.0, abs=1e-12)


def test_single_task_has_no_arrival_statistics():
    a = workload_stats(Workload((Task("t", (Call(1, 1),), arrival=3.0),))).arrivals
    assert (a.span_s, a.rate_per_s, a.interarrival_cv) == (0.0, None, None)
    assert set(a.index_of_dispersion.values()) == {None}


def test_to_dict_is_json():
    data = json.loads(json.dumps(workload_stats(_workload()).to_dict()))
    assert data["calls"] == 7 and data["input_tokens"]["max"] == 40
    assert set(data["arrivals"]["index_of_dispersion"]) == {"1s", "10s", "60s"}


def test_compare_with_itself_gives_ks_zero_and_ratios_one():
    wl = _workload()
    c = compare_workloads(wl, wl)
    assert len(c.marginals) == 6
    for m in c.marginals:
        assert m.ks == 0.0, m.name
        assert (m.p50_ratio, m.p90_ratio, m.p99_ratio) == (1.0, 1.0, 1.0), m.name
    assert c.arrivals.interarrival_cv_ratio is None or c.arrivals.interarrival_cv_ratio == 1.0
    json.dumps(c.to_dict())


def test_compare_sees_doubled_inputs_and_burstier_arrivals():
    rng = np.random.default_rng(3)
    poisson = np.cumsum(rng.exponential(0.5, size=4000))
    a = Workload(tuple(Task(str(i), (Call(100 + i % 50, 10),), arrival=float(t)) for i, t in enumerate(poisson)))
    doubled = tuple(
        dataclasses.replace(t, calls=(dataclasses.replace(t.calls[0], input_tokens=2 * t.calls[0].input_tokens),),
                            arrival=float(10.0 * (i // 20)))
        for i, t in enumerate(a.tasks)
    )
    c = compare_workloads(a, Workload(doubled))
    inputs = next(m for m in c.marginals if m.name == "input_tokens")
    assert inputs.ks == 1.0
    assert inputs.p50_ratio == pytest.approx(2.0) and inputs.p99_ratio == pytest.approx(2.0)
    outputs = next(m for m in c.marginals if m.name == "output_tokens")
    assert outputs.ks == 0.0 and outputs.p90_ratio == 1.0
    assert c.arrivals.interarrival_cv_ratio > 3  # bursts of 20 every 10 s against Poisson
    assert c.arrivals.dispersion_ratio["1s"] > 3


def _naive_reuse(workload: Workload) -> tuple[float, float]:
    """Prefix reuse the slow, obvious way: walk the calls keeping sets of seen (block size, id)."""
    across: set = set()
    served_within = served_across = total = 0
    for top in sorted(workload.tasks, key=lambda t: t.arrival):
        within: set = set()
        for task in top.walk():
            for call in task.calls:
                if not (call.hash_ids and call.block_size):
                    continue
                keys = [(call.block_size, h) for h in call.hash_ids]
                for seen, counter in ((within, "w"), (across, "a")):
                    run = 0
                    for key in keys:
                        if key not in seen:
                            break
                        run += 1
                    tokens = min(run * call.block_size, call.input_tokens)
                    if counter == "w":
                        served_within += tokens
                    else:
                        served_across += tokens
                within.update(keys)
                across.update(keys)
                total += call.input_tokens
    return served_within / total, served_across / total


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_vectorised_prefix_reuse_matches_naive_walk(seed):
    rng = np.random.default_rng(seed)

    def random_task(name: str, depth: int) -> Task:
        calls = []
        for _ in range(int(rng.integers(1, 6))):
            n = int(rng.integers(0, 6))
            size = int(rng.choice([8, 16]))
            ids = tuple(int(x) for x in rng.integers(0, 12, size=n))
            calls.append(Call(int(rng.integers(0, 100)), 1, hash_ids=ids, block_size=size if n else 0))
        subs = ()
        if depth == 0 and rng.random() < 0.5:
            subs = (SubTask(int(rng.integers(-1, len(calls))), random_task(name + "/s", 1)),)
        return Task(name, tuple(calls), arrival=float(rng.integers(0, 20)), subtasks=subs)

    wl = Workload(tuple(random_task(str(i), 0) for i in range(30)))
    reuse = workload_stats(wl).prefix_reuse
    within, across = _naive_reuse(wl)
    assert reuse.within_task == pytest.approx(within)
    assert reuse.across_tasks == pytest.approx(across)
