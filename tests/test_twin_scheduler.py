"""Hand-computed cases of the server twin's scheduler, KV cache and step-time model."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from simulator.sim.make_twin import make_twin
from simulator.sim.profile import profile_from_dict
from simulator.workload import Call


def make_profile(**sections):
    data = {
        "scheduler": {"max_num_seqs": 256, "max_num_batched_tokens": 1024, "max_model_len": 2048},
        "kv_cache": {"block_size": 16, "num_blocks": 1000},
        "step_time": {"fixed": 0.01, "per_token": 0.001, "per_decode_seq": 0.002, "per_context_token": 1e-5},
    }
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    return profile_from_dict(data)


def run(profile, requests, fast_decode=True, keep_gaps=False):
    """Submit (at, input, output, hash_ids) requests; returns (completions in submission order, twin)."""
    env = simpy.Environment()
    twin = make_twin(env, profile, fast_decode=fast_decode, keep_gaps=keep_gaps)
    done = [None] * len(requests)

    def client(i, at, n_in, n_out, ids):
        if at > env.now:
            yield env.timeout(at - env.now)
        done[i] = yield twin.submit_call(Call(n_in, n_out, hash_ids=ids, block_size=16 if ids else 0))

    for i, (at, n_in, n_out, ids) in enumerate(requests):
        env.process(client(i, at, n_in, n_out, ids))
    env.run()
    return done, twin


@pytest.mark.parametrize("fast", [False, True])
def test_one_request_alone_has_exact_ttft_and_end(fast):
    (c,), twin = run(make_profile(), [(0.0, 100, 5, ())], fast_decode=fast)
    prefill = 0.01 + 0.001 * 100 + 1e-5 * 100
    # decode step i attends to 100 + i tokens (the prompt, the tokens so far and the one computed)
    decodes = [0.01 + 0.001 + 0.002 + 1e-5 * (100 + i) for i in range(1, 5)]
    assert c.ttft == pytest.approx(prefill, abs=1e-12)
    assert c.end == pytest.approx(prefill + sum(decodes), abs=1e-12)
    assert c.output_tokens == 5 and c.itl_count == 4
    assert c.itl_mean == pytest.approx(sum(decodes) / 4, abs=1e-12)
    assert c.itl_max == pytest.approx(max(decodes), abs=1e-12)
    assert twin.stats.steps == 5


def test_second_request_sharing_a_prefix_gets_the_shared_full_blocks():
    first = (0.0, 64, 2, (1, 2, 3, 4))
    second = (10.0, 80, 2, (1, 2, 3, 9, 10))  # shares 3 blocks of 16 tokens
    same = (20.0, 64, 2, (1, 2, 3, 4))  # the whole prompt cached: the last block is recomputed
    (a, b, c), twin = run(make_profile(), [first, second, same])
    assert (a.cached_tokens, b.cached_tokens, c.cached_tokens) == (0, 48, 48)
    # fewer prompt tokens to compute means an earlier first token than without the cache
    (b_cold,), _ = run(make_profile(kv_cache={"enable_prefix_caching": False}), [second])
    assert b_cold.cached_tokens == 0 and b.ttft < b_cold.ttft
    assert twin.stats.prefill_tokens == 64 + (80 - 48) + (64 - 48)


def test_cache_too_small_preempts_the_newest_request_and_counts_it():
    profile = make_profile(kv_cache={"block_size": 4, "num_blocks": 10}, scheduler={"max_model_len": 40})
    # each needs 8 blocks of 4 tokens by its end; 10 blocks cannot hold both
    (a, b), twin = run(profile, [(0.0, 12, 20, ()), (0.0, 12, 20, ())])
    assert twin.stats.preemptions >= 1
    assert a.preemptions == 0 and b.preemptions >= 1
    assert a.output_tokens == b.output_tokens == 20
    assert b.end > a.end
    assert twin.kv.used == 0  # everything freed


def test_token_budget_splits_a_long_prefill_into_chunks():
    profile = make_profile(scheduler={"max_num_batched_tokens": 32})
    (c,), twin = run(profile, [(0.0, 100, 1, ())])
    chunks = [(32, 32), (32, 64), (32, 96), (4, 100)]  # (tokens, attended context)
    assert c.ttft == pytest.approx(sum(0.01 + 0.001 * n + 1e-5 * ctx for n, ctx in chunks), abs=1e-12)
    assert twin.stats.steps == 4 and twin.stats.prefill_tokens == 100


def test_without_chunked_prefill_a_prompt_waits_for_a_whole_budget():
    profile = make_profile(scheduler={"max_num_batched_tokens": 2048, "chunked_prefill": False})
    (a, b), twin = run(profile, [(0.0, 1500, 3, ()), (0.0, 1500, 3, ())])
    # b does not fit beside a in one step's budget: its prefill starts after a's
    assert b.ttft > a.ttft
    assert twin.stats.prefill_tokens == 3000


def test_max_num_seqs_bounds_the_running_set():
    profile = make_profile(scheduler={"max_num_seqs": 2})
    done, twin = run(profile, [(0.0, 20, 10, ())] * 5)
    assert twin.stats.max_running == 2
    assert all(c.output_tokens == 10 for c in done)
    # the third request starts only after one of the first two ended
    assert done[2].ttft > done[0].end - done[0].submitted


def test_spec_decode_raises_tokens_per_step_as_expected():
    k, a = 3, 0.5
    rate = (1 - a ** (k + 1)) / (1 - a)  # 1.875 tokens a step
    plain, _ = run(make_profile(), [(0.0, 50, 151, ())])
    spec, twin = run(make_profile(spec_decode={"num_tokens": k, "acceptance": a}), [(0.0, 50, 151, ())])
    assert plain[0].itl_count == 150
    assert spec[0].itl_count == int(np.ceil(150 / rate)) == 80
    assert spec[0].output_tokens == 151
    assert sum(twin.emitted(g) for g in range(1000)) == int(1000 * rate)


def test_step_time_async_hides_scheduling_overhead():
    from simulator.sim.step_time import StepTimeModel

    base = make_profile(step_time={"schedule_fixed": 0.003, "schedule_per_seq": 0.001})
    sync = StepTimeModel.from_profile(base)
    asyn = StepTimeModel.from_profile(make_profile(scheduler={"async_scheduling": True},
                                                   step_time={"schedule_fixed": 0.003, "schedule_per_seq": 0.001}))
    compute = 0.01 + 0.001 * 10 + 0.002 * 10 + 1e-5 * 500
    assert sync.duration(0, 0, 10, 500) == pytest.approx(compute + 0.013)
    assert asyn.duration(0, 0, 10, 500) == pytest.approx(max(compute, 0.013))
    slow_cpu = StepTimeModel.from_profile(make_profile(scheduler={"async_scheduling": True},
                                                       step_time={"schedule_fixed": 0.5}))
    assert slow_cpu.duration(0, 0, 1, 10) == pytest.approx(0.5)  # overhead longer than compute shows


def _mixed_requests(seed):
    rng = np.random.default_rng(seed)
    requests = []
    t = 0.0
    for _ in range(60):
        t += float(rng.exponential(0.05))
        shared = int(rng.integers(0, 4))
        ids = tuple(range(shared)) + tuple(int(x) for x in rng.integers(1000, 10**6, size=int(rng.integers(1, 6))))
        n_in = len(ids) * 16 - int(rng.integers(0, 16))
        requests.append((t, n_in, int(rng.integers(1, 120)), ids))
    return requests


@pytest.mark.parametrize("sections", [
    {},
    {"spec_decode": {"num_tokens": 2, "acceptance": 0.7}, "scheduler": {"async_scheduling": True},
     "step_time": {"schedule_fixed": 0.02, "per_spec_token": 0.0005, "per_draft_pass": 0.001}},
    {"kv_cache": {"num_blocks": 40}, "scheduler": {"max_model_len": 640, "max_num_batched_tokens": 128}},
    {"step_time": {"per_mixed_context_token": 3e-5}},
])
def test_multi_step_decode_fast_path_gives_identical_results(sections):
    profile = make_profile(**sections)
    requests = _mixed_requests(7)
    slow, slow_twin = run(profile, requests, fast_decode=False, keep_gaps=True)
    fast, fast_twin = run(profile, requests, fast_decode=True, keep_gaps=True)
    assert fast_twin.stats.fast_chunks > 0
    assert fast_twin.stats.steps == slow_twin.stats.steps
    assert fast_twin.stats.preemptions == slow_twin.stats.preemptions
    assert fast == slow  # every field, every gap, bit for bit
    if "kv_cache" in sections:
        assert slow_twin.stats.preemptions > 0


@pytest.mark.parametrize("fast", [False, True])
def test_request_overhead_delays_entry_without_occupying_the_engine(fast):
    # A at 0 reaches the queue at 0.05; B, sent at 0.12 during A's prefill step, reaches it at 0.17 and
    # is seen at the first step boundary after that (A's first decode step ends at 0.17501).
    profile = make_profile(step_time={"request_overhead": 0.05})
    (a, b), twin = run(profile, [(0.0, 100, 5, ()), (0.12, 10, 2, ())], fast_decode=fast)
    prefill_a = 0.01 + 0.001 * 100 + 1e-5 * 100
    first_decode = 0.01 + 0.001 + 0.002 + 1e-5 * 101
    assert a.submitted == 0.0 and a.ttft == pytest.approx(0.05 + prefill_a, abs=1e-12)
    boundary = 0.05 + prefill_a + first_decode
    # the mixed step: A decodes at context 102, B prefills its 10 tokens
    mixed = 0.01 + 0.001 * 11 + 0.002 + 1e-5 * (102 + 10)
    assert b.submitted == 0.12 and b.ttft == pytest.approx(boundary + mixed - 0.12, abs=1e-12)
    # without the overhead everything is 0.05 earlier: B arrives during A's first decode step instead
    (_, b0), _ = run(make_profile(), [(0.0, 100, 5, ()), (0.12, 10, 2, ())], fast_decode=fast)
    assert b0.ttft == pytest.approx(prefill_a + first_decode + mixed - 0.12, abs=1e-12)
    # the overhead is not engine time: busy time is the steps alone
    assert twin.stats.busy_time < a.end - 0.05 + 1e-12


def test_request_handling_grows_with_the_prompt_whether_cached_or_not():
    # two requests of 300 tokens sharing sixteen 16-token blocks, the second sent after the first ended:
    # both wait 0.002 + 300 * 1e-5 before the queue; the second prefills 44 tokens instead of 300
    profile = make_profile(step_time={"request_overhead": 0.001, "frontend_per_request": 0.001,
                                      "frontend_per_prompt_token": 1e-5})
    shared = tuple(range(16))
    (a, b), _ = run(profile, [(0.0, 300, 1, shared), (1.0, 300, 1, shared)])
    handling = 0.002 + 300 * 1e-5
    assert a.ttft == pytest.approx(handling + 0.01 + 0.001 * 300 + 1e-5 * 300, abs=1e-12)
    assert b.cached_tokens == 256
    assert b.ttft == pytest.approx(handling + 0.01 + 0.001 * 44 + 1e-5 * 300, abs=1e-12)


@pytest.mark.parametrize("fast", [False, True])
def test_the_api_server_hands_a_burst_to_the_engine_one_request_at_a_time(fast):
    # A and B sent together; the API server takes 5 ms each: A reaches the idle engine at 0.005 and is
    # prefilled alone (10 tokens: 0.01 + 0.001 * 10 + 1e-5 * 10); B, in at 0.010, waits for the next step
    step = 0.01 + 0.001 * 10 + 1e-5 * 10
    burst = [(0.0, 10, 1, ()), (0.0, 10, 1, ())]
    (a, b), _ = run(make_profile(step_time={"frontend_per_request": 0.005}), burst, fast_decode=fast)
    assert a.ttft == pytest.approx(0.005 + step, abs=1e-12)
    assert b.ttft == pytest.approx(0.005 + 2 * step, abs=1e-12)
    # the same 5 ms as latency beside everything: both reach the engine at 0.005, one step of 20 tokens
    (a, b), _ = run(make_profile(step_time={"request_overhead": 0.005}), burst, fast_decode=fast)
    both = 0.005 + 0.01 + 0.001 * 20 + 1e-5 * 20
    assert a.ttft == pytest.approx(both, abs=1e-12) and b.ttft == pytest.approx(both, abs=1e-12)


def test_request_overhead_zero_is_the_default_and_changes_nothing():
    requests = _mixed_requests(3)
    plain, _ = run(make_profile(), requests, keep_gaps=True)
    zero, _ = run(make_profile(step_time={"request_overhead": 0.0}), requests, keep_gaps=True)
    assert make_profile().step_time.request_overhead == 0.0
    assert zero == plain


def test_prefill_attention_counts_each_chunks_query_key_pairs():
    profile = make_profile(scheduler={"max_num_batched_tokens": 32}, step_time={"per_prefill_attention": 1e-6})
    (c,), _ = run(profile, [(0.0, 100, 1, ())])
    # a chunk of n tokens after `before` computed ones: each attends to the context up to itself
    chunks = [(32, 0), (32, 32), (32, 64), (4, 96)]
    pairs = [n * before + n * (n + 1) // 2 for n, before in chunks]
    assert pairs == [528, 1552, 2576, 394]
    assert c.ttft == pytest.approx(sum(0.01 + 0.001 * n + 1e-5 * (before + n) + 1e-6 * p
                                       for (n, before), p in zip(chunks, pairs)), abs=1e-12)
    # decode steps are not prefill: a second token costs no pairs
    (d,), _ = run(profile, [(0.0, 100, 2, ())])
    assert d.end - d.first_token == pytest.approx(0.01 + 0.001 + 0.002 + 1e-5 * 101, abs=1e-12)


def test_mixed_context_costs_only_in_steps_with_a_prefill_chunk():
    from simulator.sim.step_time import StepTimeModel

    model = StepTimeModel.from_profile(make_profile(step_time={"per_mixed_context_token": 2e-5}))
    plain = 0.01 + 0.001 * (64 + 3) + 0.002 * 3 + 1e-5 * 3064
    assert model.duration(64, 1, 3, 3064, decode_context=3000) == pytest.approx(plain + 2e-5 * 3000, abs=1e-15)
    # a pure-decode step attends the same context at the plain cost
    assert model.duration(0, 0, 3, 3000, decode_context=3000) == pytest.approx(0.01 + 0.003 * 3 + 1e-5 * 3000)


@pytest.mark.parametrize("fast", [False, True])
def test_a_prefill_among_decodes_slows_their_step_by_their_context(fast):
    mixed = 3e-5
    requests = [(0.0, 100, 20, ()), (0.15, 50, 1, ())]  # the second arrives while the first decodes
    (s0, c0), _ = run(make_profile(), requests, fast_decode=fast, keep_gaps=True)
    (s1, c1), _ = run(make_profile(step_time={"per_mixed_context_token": mixed}), requests, fast_decode=fast,
                      keep_gaps=True)
    assert s1.ttft == s0.ttft  # the stream's prefill ran alone: no decodes, no mixed cost
    diff = [b - a for a, b in zip(s0.gaps, s1.gaps)]
    (g,) = [i for i, d in enumerate(diff) if abs(d) > 1e-12]  # one step mixed the prefill with the decode
    # the gap before token g + 2, whose step attends the stream's prompt and the g + 1 tokens since
    assert diff[g] == pytest.approx(mixed * (101 + g), rel=1e-9)
    assert c1.ttft - c0.ttft == pytest.approx(mixed * (101 + g), rel=1e-9)


@pytest.mark.parametrize("fast", [False, True])
def test_a_request_after_a_long_idle_pays_the_wake_up_once(fast):
    profile = make_profile(step_time={"idle_wake": 0.007, "idle_after": 0.05})
    # alone at 0 (no idle before), after 1 s idle, then 0.01 s after the second ended (short idle)
    prefill = 0.01 + 0.001 * 100 + 1e-5 * 100
    (a, b), _ = run(profile, [(0.0, 100, 1, ()), (1.0, 100, 3, ())], fast_decode=fast)
    assert a.ttft == pytest.approx(prefill, abs=1e-12)
    assert b.ttft == pytest.approx(prefill + 0.007, abs=1e-12)
    decodes = [0.01 + 0.001 + 0.002 + 1e-5 * (100 + i) for i in (1, 2)]
    assert b.end - b.submitted == pytest.approx(prefill + 0.007 + sum(decodes), abs=1e-12)
    short = a.end + 0.01
    (_, c), _ = run(profile, [(0.0, 100, 1, ()), (short, 100, 1, ())], fast_decode=fast)
    assert c.ttft == pytest.approx(prefill, abs=1e-12)


@pytest.mark.parametrize("fast", [False, True])
def test_steps_soon_after_a_long_idle_are_slower(fast):
    profile = make_profile(step_time={"idle_wake": 0.004, "wake_slowdown": 0.5, "wake_period": 0.05})
    prefill = 0.01 + 0.001 * 10 + 1e-5 * 10
    decodes = [0.01 + 0.001 + 0.002 + 1e-5 * (10 + i) for i in range(1, 8)]
    # woken at 1.0: the steps that start before 1.05 take half as long again, the first also the wake-up
    t = 1.0 + prefill * 1.5 + 0.004
    ends = [t]
    for d in decodes:
        t += d * 1.5 if t < 1.05 else d
        ends.append(t)
    assert sum(start < 1.05 for start in [1.0, *ends[:-1]]) == 2  # the prefill and one decode step, not all
    (a, b), _ = run(profile, [(0.0, 10, 1, ()), (1.0, 10, 8, ())], fast_decode=fast)
    assert a.ttft == pytest.approx(prefill, abs=1e-12)  # no idle before it: at speed
    assert b.submitted + b.ttft == pytest.approx(ends[0], abs=1e-12)
    assert b.end == pytest.approx(ends[-1], abs=1e-12)
    # without the slowdown the same twin steps at speed after the wake-up
    plain = make_profile(step_time={"idle_wake": 0.004})
    (_, c), _ = run(plain, [(0.0, 10, 1, ()), (1.0, 10, 8, ())], fast_decode=fast)
    assert c.end == pytest.approx(1.0 + prefill + 0.004 + sum(decodes), abs=1e-12)


@pytest.mark.parametrize("fast", [False, True])
def test_a_step_of_a_size_not_run_lately_pays_for_its_kernels(fast):
    profile = make_profile(step_time={"per_new_shape": 0.003})
    prefill = 0.01 + 0.001 * 100 + 1e-5 * 100
    decode = [0.01 + 0.001 + 0.002 + 1e-5 * (100 + i) for i in (1, 2)]
    # a 100-token step is new, its one-sequence decode steps are of a size held from the start
    (a,), _ = run(profile, [(0.0, 100, 3, ())], fast_decode=fast)
    assert a.ttft == pytest.approx(prefill + 0.003, abs=1e-12)
    assert a.end - a.submitted == pytest.approx(prefill + 0.003 + sum(decode), abs=1e-12)
    # the same size again finds its kernels; after two other sizes (a cache of two) it does not
    profile = make_profile(step_time={"per_new_shape": 0.003, "shape_cache": 2})
    (a, b), _ = run(profile, [(0.0, 100, 1, ()), (1.0, 100, 1, ())], fast_decode=fast)
    assert b.ttft == pytest.approx(prefill, abs=1e-12)
    sizes = [(0.0, 100, 1, ()), (1.0, 90, 1, ()), (2.0, 80, 1, ()), (3.0, 100, 1, ())]
    done, _ = run(profile, sizes, fast_decode=fast)
    assert done[3].ttft == pytest.approx(prefill + 0.003, abs=1e-12)
    # used again in between, a size stays (least recently used goes first)
    sizes = [(0.0, 100, 1, ()), (1.0, 90, 1, ()), (2.0, 100, 1, ()), (3.0, 80, 1, ()), (4.0, 100, 1, ())]
    done, _ = run(profile, sizes, fast_decode=fast)
    paid = [round(d.ttft - (0.01 + 0.00101 * n), 9) for d, (_, n, _, _) in zip(done, sizes)]
    assert paid == [0.003, 0.003, 0.0, 0.003, 0.0]


def test_decode_runs_pay_for_a_new_batch_size_once():
    # 20 sequences decoding together: a batch size past the ones held from the start
    profile = make_profile(step_time={"per_new_shape": 0.003})
    requests = [(0.0, 10, 5, ())] * 20
    plain, _ = run(make_profile(), requests)
    for fast in (False, True):
        done, _ = run(profile, requests, fast_decode=fast)
        # the 200-token prefill step and the first 20-sequence decode step are new sizes, no other step
        assert done[0].end - plain[0].end == pytest.approx(0.006, abs=1e-12)
