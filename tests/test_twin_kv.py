"""The twin's KV cache: trace blocks onto KV blocks, references, splitting, LRU eviction order, dead
blocks and second copies as vLLM's block pool keeps them (held against vLLM's own classes in
tests/integration/test_vllm_kv_cache.py)."""

from __future__ import annotations

import numpy as np

from simulator.sim.kv_cache import Holding, KVCache
from simulator.sim.prefix_tree import Node, common_prefix_at


def hold(kv: KVCache, ids, tb: int, tokens: int, limit=None) -> Holding:
    """Admit a request of `tokens` prompt tokens with its cached prefix; returns its holding."""
    h = Holding(ids, tb, tokens)
    match = kv.lookup(h, (tokens - 1) // kv.block_size if limit is None else limit)
    assert kv.admit(h, match, tokens)
    return h


def matched_blocks(kv: KVCache, ids, tb: int, tokens: int) -> int:
    h = Holding(ids, tb, tokens)
    return kv.cached_blocks(h, kv.lookup(h, (tokens - 1) // kv.block_size))


def test_trace_blocks_map_onto_kv_blocks_by_position():
    kv = KVCache(100, 16)
    kv.release(hold(kv, (1, 2, 3), 64, 200))  # trace blocks of 64 tokens = 4 KV blocks each
    assert matched_blocks(kv, (1, 2, 7), 64, 200) == 8
    assert matched_blocks(kv, (1, 2, 3, 4), 64, 300) == 12
    big = KVCache(100, 32)  # a KV block spans two trace blocks of 16
    big.release(hold(big, (1, 2, 3, 4), 16, 80))
    assert matched_blocks(big, (1, 5, 3, 4), 16, 80) == 0  # half a KV block matched is no block
    assert matched_blocks(big, (1, 2, 9, 9), 16, 80) == 1


def test_only_full_prompt_blocks_are_keyed_and_positions_matter():
    assert Holding((1, 2, 3), 16, 40).ids == (1, 2)
    kv = KVCache(100, 16)
    kv.release(hold(kv, (9, 2), 16, 40))
    assert matched_blocks(kv, (1, 2), 16, 40) == 0  # same id after a different block: no match
    assert matched_blocks(kv, (9, 2), 16, 40) == 2
    assert matched_blocks(kv, (9, 2), 16, 32) == 1  # a fully cached prompt still computes its last block


def test_lru_evicts_least_recently_freed_blocks_tail_first():
    kv = KVCache(4, 16)
    kv.release(hold(kv, (1, 2), 16, 32))
    kv.release(hold(kv, (3, 4), 16, 32))
    assert kv.available == 4 and kv.used == 0 and kv.fresh == 0
    private = Holding((), 0, 0)
    assert kv.grow(private, 16)  # one private block: evicts the tail of the older conversation
    assert kv.evictions == 1
    assert matched_blocks(kv, (1, 2), 16, 48) == 1 and matched_blocks(kv, (3, 4), 16, 48) == 2
    assert kv.grow(private, 32)
    assert matched_blocks(kv, (1, 2), 16, 48) == 0 and matched_blocks(kv, (3, 4), 16, 48) == 2
    assert kv.grow(private, 48)  # then the newer one, tail first
    assert matched_blocks(kv, (3, 4), 16, 48) == 1
    assert not kv.grow(private, 80)  # 5 blocks never fit in 4
    kv.release(private)
    assert kv.used == 0 and kv.private == 0


def test_held_blocks_are_never_evicted_and_reuse_revives_them():
    kv = KVCache(4, 16)
    x = hold(kv, (1, 2), 16, 40)  # 2 keyed blocks + 1 private (the partial third block)
    y = hold(kv, (1, 2), 16, 40)  # shares both keyed blocks
    assert kv.cached == 2 and kv.private == 2 and kv.used == 4
    kv.release(x)
    assert kv.used == 3 and kv.evictable == 0  # still held by y
    assert not kv.grow(Holding((), 0, 0), 32)
    kv.release(y)
    assert kv.evictable == 2 and kv.available == 4
    z = hold(kv, (1, 2, 5), 16, 48)  # revives both cached blocks, adds one of its own
    assert kv.evictable == 0 and kv.cached == 3 and kv.used == 3 and kv.evictions == 0
    kv.release(z)


def test_a_partial_match_splits_the_node_and_keeps_blocks_counted_once():
    kv = KVCache(10, 16)
    a = hold(kv, (1, 2, 3, 4), 16, 64)
    b = hold(kv, (1, 2, 8), 16, 48)  # shares 2 blocks, computes its last block
    assert kv.cached_blocks(b, (None, 2)) == 2
    assert kv.cached == 4 + 1 and kv.private == 0
    kv.release(a)
    kv.release(b)
    assert kv.evictable == 5 and kv.used == 0
    # a's tail (3, 4) was freed first: evicted first, shared root last
    assert kv.grow(Holding((), 0, 0), 16 * 7)
    assert matched_blocks(kv, (1, 2, 3, 4), 16, 80) == 2
    assert matched_blocks(kv, (1, 2, 8), 16, 64) == 3


def test_full_blocks_no_hash_id_keys_stay_cached_dead_in_their_place():
    kv = KVCache(10, 16)
    a = hold(kv, (1, 2), 16, 40)  # 2 keyed blocks and the partial third
    assert kv.grow(a, 80)  # decoded to 80 tokens: 5 blocks, 4 of them full
    kv.release(a, computed=79)
    # blocks 3 and 4 were full (vLLM hashed them): dead in the queue before the keyed ones; the
    # partial fifth is fresh
    assert kv.cached == 4 and kv.evictable == 4 and kv.fresh == 6
    b = hold(kv, (7, 8), 16, 16 * 8)  # 8 blocks: the 6 fresh ones, then the queue's front
    assert kv.evictions == 2 and matched_blocks(kv, (1, 2), 16, 48) == 2  # only dead blocks went
    kv.release(b, computed=16 * 8)
    assert kv.grow(Holding((), 0, 0), 16 * 2) and kv.evictions == 4  # then a's tail (the conversation)
    assert matched_blocks(kv, (1, 2), 16, 48) == 0


def test_computing_a_cached_run_again_takes_its_place_and_leaves_the_old_copy_dead():
    kv = KVCache(20, 16)
    kv.release(hold(kv, (1, 2, 3, 4), 16, 64), computed=64)
    old = kv.lru.copy()
    # a request whose hit stops short (here: no lookup at all) computes the same run again
    again = Holding((1, 2, 3, 4), 16, 64)
    assert kv.grow(again, 64)
    assert again.redone == 4 and again.dup == 0 and kv.cached == 8  # two copies: its own and the old one
    assert list(kv.lru) == list(old) and next(iter(kv.lru)).parent is None  # the old copy: dead, in place
    assert matched_blocks(kv, (1, 2, 3, 4), 16, 80) == 4
    # a run another request holds: the copy is the request's own (dup), dead when it ends
    copy = Holding((1, 2, 3, 4), 16, 64)
    assert kv.grow(copy, 64) and copy.dup == 4 and kv.cached == 8 and kv.private == 4
    kv.release(copy, computed=64)
    assert kv.cached == 12 and kv.private == 0
    kv.release(again, computed=64)
    assert kv.evictable == 12


def test_a_prompt_ending_inside_a_cached_run_keys_it_only_whole():
    kv = KVCache(20, 16)
    kv.release(hold(kv, (1, 2, 3, 4, 5, 6), 16, 96), computed=96)
    part = Holding((1, 2, 3, 4, 5, 6), 16, 96)
    assert kv.grow(part, 40) and part.keyed_tb == 0 and part.private == 3  # chunk ends inside: not cut
    assert kv.grow(part, 96) and part.keyed_tb == 6 and part.redone == 6
    kv.release(part, computed=96)
    assert len([n for n in kv.lru if n.parent is not None]) == 1  # still one run


def test_without_prefix_caching_every_block_is_private():
    kv = KVCache(4, 16, prefix_caching=False)
    h = hold(kv, (1, 2), 16, 32)
    assert kv.private == 2 and kv.cached == 0
    kv.release(h)
    assert matched_blocks(kv, (1, 2), 16, 48) == 0 and kv.available == 4


def test_eviction_trims_a_leaf_by_whole_trace_blocks():
    kv = KVCache(8, 16)
    kv.release(hold(kv, (1, 2), 64, 128))  # two trace blocks of 64 tokens = 8 KV blocks
    assert kv.evictable == 8 and kv.fresh == 0
    private = Holding((), 0, 0)
    assert kv.grow(private, 16)  # one block needed: the whole last trace block (4 blocks) goes
    assert kv.evictions == 4 and kv.fresh == 3
    assert matched_blocks(kv, (1, 2), 64, 200) == 4
    assert kv.grow(private, 64) and kv.evictions == 4  # the 3 spare blocks serve first
    assert kv.grow(private, 80) and kv.evictions == 8
    assert matched_blocks(kv, (1, 2), 64, 200) == 0 and not kv.lru


def _paths(cache):
    """Every tree node's hash ids from the root, by node."""
    out = {}
    stack = [(root, ()) for root in cache.roots.values()]
    while stack:
        node, ids = stack.pop()
        for child in node.children.values():
            path = ids + child.ids[:child.n]
            out[child] = path
            stack.append((child, path))
    return out


def test_runs_sharing_prompt_tuples_stay_exact_through_growth_splits_and_eviction():
    """Nodes keep a reference to a prompt's id tuple instead of copying their run: after random growth
    in place, partial matches (splits), runs computed again and evictions, every held request's path
    spells its own ids and every lookup finds the longest cached prefix a brute-force search finds."""
    rng = np.random.default_rng(7)
    cache = KVCache(num_blocks=120, block_size=16, prefix_caching=True)
    convs = [tuple(range(1, 5)) + tuple(range(100 * c, 100 * c + 40)) for c in range(6)]
    held = []
    for _ in range(400):
        if held and (len(held) > 4 or rng.random() < 0.4):
            cache.release(held.pop(int(rng.integers(len(held)))))
            continue
        ids = convs[int(rng.integers(len(convs)))][:int(rng.integers(1, 45))]
        if rng.random() < 0.2:  # diverge inside a run: a partial match
            ids = ids[:-1] + (10**6 + int(rng.integers(10**6)),)
        tokens = len(ids) * 16 + int(rng.integers(0, 16))
        h = Holding(ids, 16, tokens)
        match = cache.lookup(h, (tokens - 1) // 16)
        paths = _paths(cache)
        cap = min(len(h.ids), (((tokens - 1) // 16 + 1) * 16 - 1) // 16)
        best = 0
        for path in paths.values():
            common = 0
            while common < min(len(path), cap) and path[common] == ids[common]:
                common += 1
            best = max(best, common)
        assert match[1] == best
        if cache.admit(h, match, tokens):
            held.append(h)
        for h in held:
            if h.node is not None:
                assert _paths(cache)[h.node] == h.ids[:h.keyed_tb]
        assert cache.cached >= 0 and cache.fresh >= 0
    assert cache.evictions > 0


def test_common_prefix_at_counts_the_agreeing_ids_of_a_window():
    ids = tuple(range(100))
    assert common_prefix_at(ids, ids, 10, 50) == 50
    assert common_prefix_at(ids, tuple(ids), 10, 50) == 50  # equal, not the same tuple
    for differ in (11, 12, 37, 59):
        other = ids[:differ] + (-1,) + ids[differ + 1:]
        assert common_prefix_at(ids, other, 10, 50) == differ - 10
    assert common_prefix_at(ids, ids[:60] + (-1,) * 40, 10, 50) == 50  # a difference past the window


def test_the_trees_nodes_are_the_public_prefix_tree_nodes():
    kv = KVCache(100, 16)
    h = hold(kv, (1, 2, 3), 64, 200)
    assert isinstance(h.node, Node) and h.node.ids == (1, 2, 3) and h.node.end == 3
    assert isinstance(kv.roots[64], Node) and kv.roots[64].children[1] is h.node
