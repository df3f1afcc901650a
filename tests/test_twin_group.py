"""The twin's decode group: the same records as stepping request by request, also where requests stay
out of the group or it is written back (a decoder skipped for budget, KV shortage and preemption,
prompts whose keyed blocks are not complete at their first decode), and its block arithmetic against
the plain per-request rule."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.sim.decode_group import DecodeGroup
from simulator.sim.driver import simulate
from simulator.sim.kv_cache import Holding, KVCache
from simulator.sim.profile import profile_from_dict
from simulator.workload import Call, SubTask, Task, Workload


def make_profile(scheduler=None, kv_cache=None, spec_decode=None, step_time=None):
    return profile_from_dict({
        "scheduler": {"max_num_seqs": 128, "max_num_batched_tokens": 512, "max_model_len": 4096, **(scheduler or {})},
        "kv_cache": {"block_size": 16, "num_blocks": 4000, **(kv_cache or {})},
        "spec_decode": spec_decode or {},
        "step_time": {"fixed": 0.01, "per_token": 2e-5, "per_decode_seq": 3e-4, "per_context_token": 1e-7,
                      "schedule_fixed": 0.001, "schedule_per_seq": 1e-5, **(step_time or {})},
    })


def agent_workload(seed: int, tasks: int = 40, trace_block: int = 16, fork: bool = False) -> Workload:
    """Conversations growing over a shared system prompt, tool gaps, arrivals in a burst."""
    rng = np.random.default_rng(seed)
    system = tuple(range(1, 9))
    out = []
    next_id = 10**6
    for i in range(tasks):
        ids = system
        calls = []
        for j in range(int(rng.integers(2, 7))):
            fresh = int(rng.integers(1, 8))
            ids = ids + tuple(range(next_id, next_id + fresh))
            next_id += fresh
            calls.append(Call(len(ids) * trace_block + int(rng.integers(0, trace_block)), int(rng.integers(1, 150)),
                              gap=float(rng.choice([0.0, 0.02, 0.4])), hash_ids=ids, block_size=trace_block))
        subtasks = ()
        if fork and i % 5 == 0:
            child = Task(f"sub-{i}", (Call(300, 40, hash_ids=system, block_size=trace_block),))
            subtasks = (SubTask(0, child, wait=bool(i % 2)),)
        out.append(Task(f"t{i}", tuple(calls), arrival=float(rng.uniform(0, 1.5)), subtasks=subtasks))
    return Workload(tuple(sorted(out, key=lambda t: t.arrival)))


def both(workload: Workload, profile, keep_gaps: bool = True):
    slow, slow_result = simulate(workload, profile, keep_gaps=keep_gaps, fast_decode=False)
    fast, fast_result = simulate(workload, profile, keep_gaps=keep_gaps, fast_decode=True)
    return slow, slow_result.twin, fast, fast_result.twin


def assert_same(slow, slow_stats, fast, fast_stats):
    assert fast.calls == slow.calls and fast.tasks == slow.tasks
    assert [list(g) for g in fast.gaps] == [list(g) for g in slow.gaps]
    for field in ("steps", "preemptions", "prefill_tokens", "cached_tokens", "output_tokens", "finished",
                  "max_running"):
        assert getattr(fast_stats, field) == getattr(slow_stats, field), field
    # a sum of step durations taken a run of steps at a time: the same up to its rounding
    assert fast_stats.busy_time == pytest.approx(slow_stats.busy_time, rel=1e-12)


API_SERVER = [{}, {"frontend_per_output_token": 3e-4}, {"frontend_per_output_token": 2e-3},
              {"frontend_per_output_token": 3e-4, "frontend_contention": 1.5, "batch_join": 2e-3, "batch_leave": 1e-3}]
"""The API server's per-token work: none, a share of each step, more than a step (saturated); and its
intake work taking engine time (`frontend_contention`), with the engine's work on requests joining and
leaving its batch."""


@pytest.mark.parametrize("frontend", API_SERVER)
@pytest.mark.parametrize("keep_gaps", [True, False])
@pytest.mark.parametrize("spec", [{}, {"num_tokens": 3, "acceptance": 0.6}])
def test_group_matches_single_stepping_on_agent_traffic(keep_gaps, spec, frontend):
    profile = make_profile(spec_decode=spec, step_time={"frontend_per_request": 0.002, **frontend})
    slow, ss, fast, fs = both(agent_workload(1, fork=True), profile, keep_gaps)
    assert fs.fast_chunks > 0 and fs.settled_steps == 0
    assert sum(c.cached_tokens for c in fast.calls) > 0
    assert_same(slow, ss, fast, fs)


@pytest.mark.parametrize("frontend", API_SERVER[:2] + API_SERVER[3:])  # (a saturated API server spreads the load)
def test_group_matches_under_kv_shortage_with_eviction_and_preemption(frontend):
    profile = make_profile(kv_cache={"num_blocks": 420}, scheduler={"max_model_len": 1600}, step_time=frontend)
    slow, ss, fast, fs = both(agent_workload(2, tasks=60), profile)
    assert fs.preemptions > 0 and fs.settled_steps > 0  # the group was written back and re-formed
    assert_same(slow, ss, fast, fs)


@pytest.mark.parametrize("frontend", API_SERVER[:2] + API_SERVER[3:])  # (saturated: the first token late)
def test_group_matches_when_a_decoder_is_skipped_for_budget(frontend):
    # ten streams of 1 + 3 tokens take 40 of a 42-token step: a late request prefills 2 tokens a step,
    # then cannot decode beside them and waits for the first of them to end
    profile = make_profile(scheduler={"max_num_batched_tokens": 42, "max_num_seqs": 40},
                           spec_decode={"num_tokens": 3, "acceptance": 0.5}, step_time=frontend)
    tasks = tuple(Task(f"long{i}", (Call(16, 300),)) for i in range(10)) + (Task("late", (Call(30, 20),), arrival=1.0),)
    slow, ss, fast, fs = both(Workload(tasks), profile)
    (late,) = [c for c in fast.calls if c.task_id == "late"]
    first_end = min(c.end for c in fast.calls if c.task_id != "late")
    assert late.actual_send + late.ttft < first_end - 1.0 and late.itl_max > 1.0
    assert_same(slow, ss, fast, fs)


@pytest.mark.parametrize("frontend", API_SERVER[:2] + API_SERVER[3:])
@pytest.mark.parametrize("trace_block", [10, 24, 7])
def test_group_matches_with_trace_blocks_unaligned_to_kv_blocks(trace_block, frontend):
    # a small budget ends prefills inside a KV block, so some requests start decoding before their
    # keyed blocks are complete: they stay out of the group until their next growth
    profile = make_profile(scheduler={"max_num_batched_tokens": 18 + trace_block},
                           kv_cache={"num_blocks": 600 + 40 * trace_block}, step_time=frontend)
    slow, ss, fast, fs = both(agent_workload(trace_block, tasks=30, trace_block=trace_block), profile)
    assert_same(slow, ss, fast, fs)


def test_blocks_needed_counts_each_members_new_blocks():
    rng = np.random.default_rng(5)
    bs = 16
    group = DecodeGroup(bs, keep_gaps=False)
    offsets = [int(x) for x in rng.integers(-500, 500, size=300)]
    for a in offsets:
        group.residues[a % bs] += 1
    group.size = len(offsets)
    for horizon, new in [(0, 1), (7, 9), (15, 16), (100, 163), (5, 5), (33, 200)]:
        group.horizon = horizon
        plain = sum(-(-(a + new) // bs) - -(-(a + horizon) // bs) for a in offsets)
        assert group.blocks_needed(new) == plain


def test_take_evicts_as_growing_holdings_one_by_one():
    def filled():
        kv = KVCache(60, 16)
        for k in range(6):  # six cached conversations of 64-token trace blocks, released in order
            h = Holding(tuple(range(100 * k, 100 * k + 2)), 64, 128)
            assert kv.admit(h, kv.lookup(h, 7), 128)
            kv.release(h)
        return kv

    split, whole = filled(), filled()
    holdings = [Holding((), 0, 0) for _ in range(5)]
    for size, h in zip((3, 5, 1, 7, 4), holdings):
        assert split.grow(h, 16 * size)
    assert whole.take(3 + 5 + 1 + 7 + 4)
    assert (split.cached, split.evictable, split.private, split.evictions) == \
           (whole.cached, whole.evictable, whole.private, whole.evictions)
    assert [n.ids[:n.n] for n in split.lru] == [n.ids[:n.n] for n in whole.lru]
    assert not whole.take(whole.available + 1)


def test_in_flight_reports_group_members_progress_step_by_step():
    import simpy

    from simulator.sim.make_twin import make_twin

    env = simpy.Environment()
    twin = make_twin(env, make_profile())
    for i in range(3):
        twin.submit(64, 50, tag=f"r{i}")
    seen = []

    def watch():
        while True:
            yield env.timeout(0.05)
            seen.append(dict(twin.in_flight()))

    env.process(watch())
    env.run(until=0.6)
    assert twin.group.size == 3  # all three decode as one group
    counts = [s["r0"] for s in seen if "r0" in s]
    assert counts == sorted(counts) and len(set(counts)) > 3  # progress visible while in the group
    assert all(len(s) == 3 and len(set(s.values())) == 1 for s in seen[2:])


def test_group_matches_with_request_overhead():
    slow, ss, fast, fs = both(agent_workload(4, fork=True), make_profile(step_time={"request_overhead": 0.013}))
    assert fs.fast_chunks > 0
    assert_same(slow, ss, fast, fs)
    # every call's TTFT includes the overhead
    assert min(c.ttft for c in fast.calls if c.ok) > 0.013
