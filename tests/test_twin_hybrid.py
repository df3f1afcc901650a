"""Hybrid (Mamba + attention) models in the twin, as vLLM 0.32.0 serves them: the block geometry, the
prefill chunk rule, prefix hits on the block grid at Mamba snapshots, shared-prefix junctions, the
retention interval, snapshots and per-sequence state in the pool, and the twin's scheduler on top.
The same behaviour is held against vLLM's own classes in tests/integration/test_vllm_kv_cache.py."""

from __future__ import annotations

import numpy as np
import pytest

import conversations as shared
from simulator.errors import InputError
from simulator.sim.driver import simulate
from simulator.sim.hybrid import chunk_tokens, geometry, group_size
from simulator.sim.hybrid_cache import HybridHolding, HybridKVCache
from simulator.sim.profile import load_profile, profile_from_dict
from simulator.workload import Call, Task, Workload

B = 256  # KV block of these cache tests: four trace blocks of 64 tokens
TB = 64


def serve(kv: HybridKVCache, ids, prompt: int, out: int = 1, budget: int = 8192, eagle: bool = False):
    """One request alone, step by step as the twin runs it; returns (hit tokens, chunks, junction)."""
    h = HybridHolding(tuple(ids), TB, prompt)
    kv.new_step()
    match = kv.lookup_hybrid(h, prompt)
    hit = match[4]
    n = chunk_tokens(hit, min(prompt - hit, budget), prompt, prompt, B, budget, eagle, match[3], True)
    assert kv.admit_hybrid(h, match, prompt, hit + n)
    computed, chunks = hit + n, [n]
    while computed < prompt:
        kv.new_step()
        n = chunk_tokens(computed, min(prompt - computed, budget), prompt, prompt, B, budget, eagle, h.junction, True)
        assert kv.advance(h, computed, computed + n, prompt)
        computed += n
        chunks.append(n)
    for _ in range(out - 1):
        kv.new_step()
        assert kv.advance(h, computed, computed + 1, prompt)
        computed += 1
    kv.release(h, computed)
    return hit, chunks, match[3]


def test_geometry_follows_vllms_block_alignment_and_grouping():
    # Nemotron 3 Super as the GB300 default preset has it: FP8 attention, FP32 SSM state
    g = geometry(8, 40, 4096, 4_255_744, 16, 16)
    assert g.block_size == 8320  # 16 * ceil(4,255,744 / (16 * 512))
    assert (g.group_size, g.mamba_groups) == (8, 5) and g.block_bytes == 8 * 8320 * 512
    assert 0 < g.page_padding < 0.001
    # a requested block larger than the kernel's aligns on itself
    assert geometry(8, 40, 4096, 4_255_744, 16, 1024).block_size == 9216
    # 12 sliding-window and 13 full layers group by 13 (vLLM pads rather than split), 8 and 40 by 8
    assert group_size(13, 12) == 13 and group_size(8, 40) == 8
    with pytest.raises(ValueError, match="attention KV cache groups"):
        geometry(40, 8, 4096 * 5, 4_255_744, 16, 16)


def test_gb300_presets_have_nemotron_super_layouts():
    layouts = {}
    for step in ("default", "mtp3", "async-fi", "mtp1", "fp16-state"):
        p = load_profile(f"gb300-nemotron-super-{step}")
        g = p.kv_cache.geometry
        layouts[step] = (g.block_size, g.mamba_groups, p.state_blocks, p.eagle_block_drop)
    assert layouts == {
        "default": (8320, 5, 5, False),
        "mtp3": (8432, 5, 20, True),  # a state per draft token; blocks of 9 pages with the drafter's layer
        "async-fi": (8432, 5, 20, True),
        "mtp1": (8352, 5, 10, True),
        "fp16-state": (4256, 5, 10, True),  # half the state: half the block
    }


def test_chunks_end_where_a_mamba_state_must_be_kept():
    # a block wider than the step's budget: advance inside it, then stop at its end
    assert chunk_tokens(0, 8192, 20000, 20000, 8320, 8192, False, 0, True) == 8192
    assert chunk_tokens(8192, 8192, 20000, 20000, 8320, 8192, False, 0, True) == 128
    # a chunk that does not end the prompt ends on a block boundary
    assert chunk_tokens(0, 1000, 5000, 5000, B, 8192, False, 0, True) == 768
    # the last chunk exports the checkpoint (4864) from inside when it starts a block below it ...
    assert chunk_tokens(0, 5000, 5000, 5000, B, 8192, False, 0, True) == 5000
    # ... not from inside a block; without the kernel's checkpoint block it always stops there
    assert chunk_tokens(4700, 300, 5000, 5000, B, 8192, False, 0, True) == 164
    assert chunk_tokens(0, 5000, 5000, 5000, B, 8192, False, 0, False) == 4864
    # a shared-prefix junction stops the chunk at its block, once
    assert chunk_tokens(0, 5000, 5000, 5000, B, 8192, False, 3100, True) == 3072
    assert chunk_tokens(3072, 1928, 5000, 5000, B, 8192, False, 3100, True) == 1928
    # with EAGLE/MTP the checkpoint is a block lower
    assert chunk_tokens(0, 5000, 5000, 5000, B, 8192, True, 0, False) == 4608
    # past the prompt nothing is cut
    assert chunk_tokens(5000, 1, 5000, 5001, B, 8192, False, 0, True) == 1


def test_hits_land_on_the_block_grid_at_the_prompts_checkpoint():
    kv = HybridKVCache(400, B, 2)
    first = tuple(range(1, 81))  # 80 trace blocks: 5,120 tokens, 20 full KV blocks
    assert serve(kv, first, 5120, out=3)[0] == 0
    # the next turn's attention matches all 20 blocks, but the Mamba state is kept only at the
    # block below the prompt's last token (4,864): the hit is a block short of plain KV's, and the
    # attention match is a junction whose state the prefill stops to keep
    hit, chunks, junction = serve(kv, first + tuple(range(81, 101)), 6450)
    assert hit == 4864 and junction == 5120 and chunks == [256, 6450 - 5120]
    # a prompt of less than a block and a token gets no hit at all
    assert serve(kv, (501, 502, 503), 250)[0] == 0
    assert serve(kv, (501, 502, 503, 504), 300)[0] == 0


def test_eagle_drop_gives_back_a_block():
    kv = HybridKVCache(400, B, 2, eagle=True)
    first = tuple(range(1, 81))
    serve(kv, first, 5120, eagle=True)
    # attention matches 20 blocks and gives one back; the checkpoint was kept a block lower too
    assert serve(kv, first + tuple(range(81, 101)), 6450, eagle=True)[0] == 4864


def test_shared_prefix_junction_is_kept_for_the_next_request():
    kv = HybridKVCache(400, B, 2)
    shared = tuple(range(1, 51))  # 3,200 tokens shared by all
    assert serve(kv, shared + tuple(range(100, 150)), 6400)[0] == 0
    # B matches 12 blocks of attention but no Mamba state: no hit, a junction at 3,072; its prefill
    # stops there and keeps that state
    hit, chunks, junction = serve(kv, shared + tuple(range(200, 250)), 6400)
    assert (hit, junction, chunks[0]) == (0, 3072, 3072)
    assert serve(kv, shared + tuple(range(300, 350)), 6400)[0] == 3072


@pytest.mark.parametrize("retention, expected", [(0, 0), (512, 1536), (None, 1792)])
def test_retention_interval_keeps_more_states(retention, expected):
    kv = HybridKVCache(400, B, 2, retention=retention)
    serve(kv, tuple(range(1, 48)), 3000, budget=256)  # chunks of one block: a state at every boundary
    # a prompt that shares the first 2,000 tokens: attention matches 7 blocks (1,792)
    assert serve(kv, tuple(range(1, 32)) + (900, 901), 2200)[0] == expected


def test_snapshots_take_pool_blocks_and_are_evicted_before_the_prompt_they_serve():
    kv = HybridKVCache(200, B, 2)
    first = tuple(range(1, 81))
    serve(kv, first, 5120)  # ends at its first token: its checkpoint is freed with it, before its blocks
    assert kv.cached == 20 + 2 and kv.evictable == 22  # 20 attention blocks, one snapshot (2 blocks)
    other = HybridHolding((), 0, 0)
    assert kv.grow(other, (kv.fresh + 1) * B)  # a block more than the fresh ones: the snapshot's first goes
    assert kv.evictions == 1 and kv.cached == 21
    kv.release(other)
    # the attention blocks are all still cached, but without the state the hit is gone: a junction
    hit, _, junction = serve(kv, first + tuple(range(81, 101)), 6450)
    assert hit == 0 and junction == 5120


def test_running_sequences_hold_their_state_and_draft_copies():
    kv = HybridKVCache(200, B, 3, spec_blocks=2)
    h = HybridHolding((), 0, 600)
    kv.new_step()
    assert kv.admit_hybrid(h, kv.lookup_hybrid(h, 600), 600, 512)  # a chunk ending on a boundary
    assert kv.used == 2 + 3 * (1 + 2)  # attention blocks, running state and two draft copies per group
    kv.new_step()
    assert kv.advance(h, 512, 600, 600)  # crosses a boundary: a new state block per group ...
    assert kv.used == 3 + 9 + 3
    kv.new_step()
    assert kv.advance(h, 600, 601, 600)  # ... and the old ones go at the next step
    assert kv.used == 3 + 9
    kv.release(h, 601)
    assert kv.used == 0


def test_a_snapshot_cached_this_step_cannot_be_hit_before_the_next():
    kv = HybridKVCache(400, B, 2)
    ids = tuple(range(1, 81))
    a = HybridHolding(ids, TB, 5120)
    kv.new_step()
    assert kv.admit_hybrid(a, kv.lookup_hybrid(a, 5120), 5120, 5120)  # caches its checkpoint now
    b = HybridHolding(ids + (500,), TB, 5200)
    snap = kv.lookup_hybrid(b, 5200)[2]
    assert snap is not None and snap.step == kv.step


def audit(kv: HybridKVCache, live) -> None:
    """The cache's counters against its structures."""
    tree = 0
    stack = list(kv.roots.values())
    while stack:
        node = stack.pop()
        for child in node.children.values():
            tree += child.size
            stack.append(child)
    queued = spare = dead = keys = 0
    for key in kv.lru:
        if isinstance(key, tuple):
            keys += 1
        elif key.parent is None:
            dead += key.size
        else:
            queued += key.size
            spare += key.spare
    held = {id(u): u for h in live for u in (h.run, *h.trans) if u is not None}
    assert kv.cached == tree + spare + dead + keys + kv.groups * len(held)
    assert kv.evictable == queued + spare + dead + keys
    assert kv.private == sum(h.private + h.state for h in live)
    assert kv.fresh >= 0


def test_counters_stay_exact_through_shared_prefixes_recompute_and_eviction():
    rng = np.random.default_rng(3)
    kv = HybridKVCache(120, B, 2)
    convs = [tuple(range(1, 20)) + tuple(range(1000 * c, 1000 * c + 60)) for c in range(5)]
    live: list[tuple[HybridHolding, list[int]]] = []
    for _ in range(600):
        kv.new_step()
        for h, state in list(live):
            computed, prompt = state
            if computed >= prompt + 40 or rng.random() < 0.1:
                kv.release(h, computed)
                live.remove((h, state))
                continue
            n = 1 if computed >= prompt else chunk_tokens(computed, min(prompt - computed, 700), prompt, prompt, B,
                                                          700, False, h.junction, True)
            if n and kv.advance(h, computed, computed + n, prompt):
                state[0] += n
        if len(live) < 3:
            ids = convs[int(rng.integers(len(convs)))][:int(rng.integers(5, 80))]
            prompt = len(ids) * TB + int(rng.integers(0, 64))
            h = HybridHolding(ids, TB, prompt)
            match = kv.lookup_hybrid(h, prompt)
            if match[2] is None or match[2].step != kv.step:
                n = chunk_tokens(match[4], min(prompt - match[4], 700), prompt, prompt, B, 700, False, match[3], True)
                if n and kv.admit_hybrid(h, match, prompt, match[4] + n):
                    live.append((h, [match[4] + n, prompt]))
        audit(kv, [h for h, _ in live])
    assert kv.evictions > 0 and kv.snapshots > 0


def hybrid_profile(**kv_cache):
    return profile_from_dict({
        "scheduler": {"max_num_seqs": 64, "max_num_batched_tokens": 256, "max_model_len": 4096},
        # one attention layer of 64 B a token beside two Mamba layers of 4 KiB: blocks of 64 tokens
        "kv_cache": {"block_size": 16, "num_blocks": 500, "bytes_per_token": 64,
                     "hybrid": {"attention_layers": 1, "mamba_layers": 2, "mamba_state_bytes": 4096},
                     **kv_cache},
        "step_time": {"fixed": 0.01, "per_token": 2e-5, "per_decode_seq": 3e-4, "per_context_token": 1e-7},
    })


def conversations(seed: int) -> Workload:
    return shared.conversations(seed, tasks=30, max_output=120, arrival_span=2.0)


@pytest.mark.parametrize("profile", [
    hybrid_profile(),
    hybrid_profile(num_blocks=150),  # the pool runs short: evictions, a decode group written back
    profile_from_dict({**hybrid_profile().model_dump(), "spec_decode": {"num_tokens": 2, "acceptance": 0.7}}),
    # the API server's per-token work: token deliveries lag the steps, runs of steps deliver as they plan
    profile_from_dict({**hybrid_profile(num_blocks=150).model_dump(), "spec_decode": {"num_tokens": 2, "acceptance": 0.7},
                       "step_time": {**hybrid_profile().step_time.model_dump(), "frontend_per_output_token": 4e-4}}),
])
def test_decode_group_matches_single_stepping_for_hybrid_models(profile):
    fast, fast_result = simulate(conversations(4), profile, keep_gaps=True, fast_decode=True)
    slow, slow_result = simulate(conversations(4), profile, keep_gaps=True, fast_decode=False)
    assert fast.calls == slow.calls
    assert [list(g) for g in fast.gaps] == [list(g) for g in slow.gaps]
    for field in ("steps", "preemptions", "prefill_tokens", "cached_tokens", "output_tokens", "busy_time"):
        assert getattr(fast_result.twin, field) == getattr(slow_result.twin, field), field
    assert fast_result.twin.fast_chunks > 0 and sum(c.cached_tokens for c in fast.calls) > 0


def test_hybrid_hits_are_coarser_than_plain_kv_on_the_same_traffic():
    plain = profile_from_dict({**hybrid_profile().model_dump(), "kv_cache": {"block_size": 16, "num_blocks": 2000}})
    hybrid, _ = simulate(conversations(5), hybrid_profile())
    attention, _ = simulate(conversations(5), plain)
    cached = [sum(c.cached_tokens for c in run.calls) for run in (hybrid, attention)]
    assert 0 < cached[0] < cached[1]
    assert all(c.cached_tokens % 64 == 0 for c in hybrid.calls)  # whole 64-token blocks


def test_hybrid_settings_are_validated(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("kv_cache:\n  num_blocks: 100\n  hybrid: {attention_layers: 1, mamba_layers: 2, "
                    "mamba_state_bytes: 4096}\n")
    with pytest.raises(InputError, match="bytes_per_token") as err:
        load_profile(path)
    assert str(path) in str(err.value)
    path.write_text("kv_cache:\n  num_blocks: 1000\n  bytes_per_token: 64\n  hybrid: {attention_layers: 1, "
                    "mamba_layers: 2, mamba_state_bytes: 4096, retention_interval: 100}\n")
    with pytest.raises(InputError, match="multiple of the aligned block size 64"):
        load_profile(path)
    path.write_text("kv_cache:\n  num_blocks: 1000\n  bytes_per_token: 64\n  hybrid: {attention_layers: 1, "
                    "mamba_layers: 2, mamba_state_bytes: 4096, layers: 3}\n")
    with pytest.raises(InputError, match="layers"):
        load_profile(path)


def test_a_preempting_hybrid_twin_gives_every_block_back():
    # a pool too small for the burst: requests are preempted and recompute, states and snapshots churn
    import simpy

    from simulator.sim.make_twin import make_twin

    profile = profile_from_dict({**hybrid_profile().model_dump(), "kv_cache": {
        **hybrid_profile().kv_cache.model_dump(), "num_blocks": 60}, "scheduler": {"max_model_len": 1024}})
    env = simpy.Environment()
    twin = make_twin(env, profile)
    system = tuple(range(1, 21))
    done = []

    def client(i):
        yield env.timeout(0.01 * i)
        ids = system + tuple(range(1000 * i, 1000 * i + 12))
        done.append((yield twin.submit_call(Call(len(ids) * 16 + 5, 90, hash_ids=ids, block_size=16))))

    for i in range(24):
        env.process(client(i))
    env.run()
    kv = twin.kv
    assert len(done) == 24 and twin.stats.preemptions > 0 and kv.evictions > 0
    assert kv.private == 0 and kv.evictable == kv.cached and kv.available == kv.num_blocks
    assert sum(c.cached_tokens for c in done) > 0


def test_make_twin_builds_the_hybrid_twin_only_for_a_profile_with_mamba_layers():
    import simpy

    from simulator.sim.hybrid_twin import HybridTwin
    from simulator.sim.make_twin import make_twin
    from simulator.sim.twin import Twin

    hybrid = make_twin(simpy.Environment(), hybrid_profile(), keep_gaps=True, fast_decode=False)
    assert type(hybrid) is HybridTwin and hybrid.keep_gaps and not hybrid.fast_decode
    plain_profile = profile_from_dict({"scheduler": {"max_model_len": 4096},
                                       "kv_cache": {"block_size": 16, "num_blocks": 500}})
    plain = make_twin(simpy.Environment(), plain_profile)
    assert type(plain) is Twin and plain.fast_decode and not plain.keep_gaps
    # each class refuses the other's profile rather than model it wrongly
    with pytest.raises(TypeError, match="make_twin"):
        Twin(simpy.Environment(), hybrid_profile())
    with pytest.raises(TypeError, match="make_twin"):
        HybridTwin(simpy.Environment(), plain_profile)


def resent_heads(tasks: int = 12) -> Workload:
    """Conversations that each send a long prompt, then prompts of its first part only (as an agent whose
    context is capped at the model's length, keeping its head): those end inside a run of the prefix
    tree that the long prompt keyed, so their last trace blocks stay unkeyed while they decode."""
    rng = np.random.default_rng(7)
    out = []
    for i in range(tasks):
        ids = tuple(range(1 + 100 * i, 41 + 100 * i))  # 40 blocks of 16 tokens
        calls = [Call(640, 2, hash_ids=ids, block_size=16)]
        for _ in range(3):
            head = int(rng.integers(12, 36))
            calls.append(Call(head * 16 + 8, int(rng.integers(40, 120)), gap=0.05, hash_ids=ids[:head], block_size=16))
        out.append(Task(f"t{i}", tuple(calls), arrival=float(rng.uniform(0, 1.0))))
    return Workload(tuple(sorted(out, key=lambda t: t.arrival)))


def test_requests_whose_prompt_ends_inside_a_cached_run_decode_in_the_group():
    # They used to be kept out of the decode group for good (the group then only ran up to the first
    # of them): the group now keys what the tree lets them key at each step it plans, as stepping them
    # one by one does, so the records stay those of stepping one by one.
    fast, fast_result = simulate(resent_heads(), hybrid_profile(), keep_gaps=True, fast_decode=True)
    slow, slow_result = simulate(resent_heads(), hybrid_profile(), keep_gaps=True, fast_decode=False)
    assert fast.calls == slow.calls
    assert [list(g) for g in fast.gaps] == [list(g) for g in slow.gaps]
    for field in ("steps", "prefill_tokens", "cached_tokens", "output_tokens"):
        assert getattr(fast_result.twin, field) == getattr(slow_result.twin, field), field
    assert fast_result.twin.busy_time == pytest.approx(slow_result.twin.busy_time, rel=1e-12)  # summed per run
    assert sum(c.cached_tokens for c in fast.calls) > 0
    assert fast_result.twin.fast_chunks > 0.2 * len(fast.calls)
