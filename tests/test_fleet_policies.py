"""The fleet twin's router policies (`simulator.fleet.policies`): each one's defining behaviour on
constructed states, and a policy registered by a user running in the fleet twin untouched."""

from __future__ import annotations

import random

import pytest
import simpy

from simulator.errors import InputError
from simulator.fleet.policies import (CacheAwarePolicy, ManualPolicy, Policy, PowerOfTwoPolicy, PrefixScorePolicy,
                                      ReplicaView, RouteRequest, make_policy, register)
from simulator.scenario.fleet import FleetSpec, RouterSpec
from simulator.fleet.twin import FleetTwin
from simulator.sim.driver import ListSink, SimDriver
from simulator.sim.profile import load_profile
from simulator.sim.twin import Twin
from simulator.workload import Call, Task, Workload

TB = 16
"""Tokens per hash id in these tests."""


def views(*loads: int, twins=None) -> list[ReplicaView]:
    out = [ReplicaView(i, f"r{i}", twins[i] if twins else None) for i in range(len(loads))]
    for view, load in zip(out, loads):
        view.in_flight = load
    return out


def request(ids, key: str = "s", now: float = 0.0, tail: int = 0) -> RouteRequest:
    ids = tuple(ids)
    return RouteRequest(key, Call(len(ids) * TB + tail, 4, hash_ids=ids, block_size=TB), now)


def policy(name: str, replicas, seed: int = 0, **settings) -> Policy:
    return make_policy(RouterSpec(policy=name, **settings), replicas, seed)


def test_round_robin_cycles_through_the_replicas():
    rr = policy("round_robin", views(5, 0, 9))
    assert [rr.choose(request([1])) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_least_outstanding_picks_the_fewest_in_flight_and_draws_only_among_the_tied():
    assert {policy("least_outstanding", views(3, 1, 2), seed).choose(request([1])) for seed in range(20)} == {1}
    assert {policy("least_outstanding", views(1, 0, 4, 0), seed).choose(request([1])) for seed in range(40)} == {1, 3}


class Recording(random.Random):
    """A seeded generator that remembers the replicas it drew."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.drawn: list[int] = []

    def randrange(self, *args, **kwargs):  # type: ignore[override]
        value = super().randrange(*args, **kwargs)
        self.drawn.append(value)
        return value


def test_power_of_two_takes_the_less_loaded_of_two_distinct_draws():
    replicas = views(7, 0, 3, 5, 1)
    rng = Recording(1)
    p2 = PowerOfTwoPolicy(RouterSpec(policy="power_of_two"), replicas, rng)
    chosen = set()
    for _ in range(300):
        rng.drawn.clear()
        choice = p2.choose(request([1]))
        a, b = rng.drawn
        b = b + 1 if b >= a else b  # the second draw skips the first replica
        assert a != b and choice in (a, b)
        assert replicas[choice].in_flight == min(replicas[a].in_flight, replicas[b].in_flight)
        chosen.add(choice)
    assert 0 not in chosen  # the most loaded never wins its pair
    assert chosen == {1, 2, 3, 4}


def test_manual_keeps_a_session_on_its_replica_whatever_the_load():
    replicas = views(0, 0, 0)
    manual = policy("manual", replicas, assignment_mode="min_load")
    first = manual.choose(request([1], key="a"))
    replicas[first].in_flight = 50
    assert all(manual.choose(request([1], key="a")) == first for _ in range(5))
    assert manual.choose(request([1], key="b")) != first  # a new key avoids the loaded replica


def test_manual_assigns_new_keys_by_mode():
    replicas = views(4, 1, 2)
    assert policy("manual", replicas, assignment_mode="min_load").choose(request([1], key="new")) == 1
    by_group = policy("manual", views(0, 0, 0), seed=3, assignment_mode="min_group")
    assert isinstance(by_group, ManualPolicy)
    a, b = request([1], key="a"), request([1], key="b")
    ra = by_group.choose(a)
    rb = by_group.choose(b)  # the replicas without a key in flight get the new keys
    assert rb != ra
    assert by_group.choose(request([1], key="c")) not in (ra, rb)
    by_group.ended(a, ra)  # `a` answered: its replica is the one holding no key in flight now
    assert by_group.choose(request([1], key="d")) == ra
    spread = policy("manual", views(0, 0, 0, 0), seed=5, assignment_mode="random")
    assert {spread.choose(request([1], key=f"k{i}")) for i in range(40)} == {0, 1, 2, 3}


def cache_aware(*loads: int, **settings) -> tuple[CacheAwarePolicy, list[ReplicaView]]:
    replicas = views(*loads)
    p = policy("cache_aware", replicas, **settings)
    assert isinstance(p, CacheAwarePolicy)
    return p, replicas


def test_cache_aware_sends_a_prompt_to_the_replica_holding_its_longest_prefix():
    p, _ = cache_aware(0, 0, 0, below_threshold="smallest_tree")
    homes = [p.choose(request(range(base, base + 40))) for base in (0, 1000, 2000)]
    assert sorted(homes) == [0, 1, 2]  # below the threshold: the smallest tree, each in turn
    # prompts over the second one's prefix go where that prefix went (40 of 90 and 40 of 50 blocks
    # matched: above 0.3), though its tree is then the largest
    assert p.choose(request([*range(1000, 1040), *range(5000, 5050)])) == homes[1]
    assert p.sizes[homes[1]] == 90 * TB > max(p.sizes[homes[0]], p.sizes[homes[2]])
    assert p.choose(request([*range(1000, 1040), *range(7000, 7010)])) == homes[1]


def test_cache_aware_below_the_threshold_goes_to_the_smallest_tree():
    p, _ = cache_aware(0, 0, 0, cache_threshold=0.5, below_threshold="smallest_tree")
    big = p.choose(request(range(0, 100)))
    small = p.choose(request(range(500, 510)))
    # 40 of 100 blocks match the big replica's prompt: a share of 0.4, not above 0.5
    third = p.choose(request([*range(0, 40), *range(900, 960)]))
    assert third not in (big, small)
    # and now above it: 80 of 100 blocks
    assert p.choose(request([*range(0, 80), *range(3000, 3020)])) == big


def test_cache_aware_below_the_threshold_goes_to_the_least_loaded_by_default():
    # as sglang-router 0.3 routes (docs/fleet.md): unmatched prompts go to the fewest requests in
    # flight, the first replica on a tie, whatever the trees hold
    p, replicas = cache_aware(0, 0, 0)
    assert [p.choose(request(range(base, base + 40))) for base in (0, 1000, 2000)] == [0, 0, 0]
    replicas[0].in_flight, replicas[1].in_flight = 2, 1
    assert p.choose(request(range(3000, 3040))) == 2
    # a match above the threshold still wins over the load
    assert p.choose(request([*range(1000, 1040), *range(5000, 5010)])) == 0


def test_cache_aware_balances_only_when_both_thresholds_hold():
    ids = range(0, 50)
    # absolute difference 70 > 64 and 80 > 10 * 1.5: imbalanced, so the least loaded, whatever the cache says
    p, replicas = cache_aware(0, 0, 0)
    home = p.choose(request(ids))
    for view in replicas:
        view.in_flight = 10 if view.index != home else 80
    replicas[(home + 1) % 3].in_flight = 30
    assert p.choose(request(ids)) == (home + 2) % 3
    # only the absolute threshold holds (200 - 130 = 70 > 64, but 200 < 130 * 1.6): routed by the cache
    p, replicas = cache_aware(0, 0, 0, balance_rel_threshold=1.6)
    home = p.choose(request(ids))
    for view in replicas:
        view.in_flight = 130 if view.index != home else 200
    assert p.choose(request(ids)) == home
    # only the relative one holds (9 > 2 * 1.5, but 9 - 2 = 7 <= 64): routed by the cache
    p, replicas = cache_aware(0, 0, 0)
    home = p.choose(request(ids))
    for view in replicas:
        view.in_flight = 2 if view.index != home else 9
    assert p.choose(request(ids)) == home


def test_cache_aware_evicts_least_recently_used_runs_down_to_the_max_tree_size():
    p, _ = cache_aware(0, cache_threshold=0.0, max_tree_size=30 * TB, eviction_interval=10.0)
    p.choose(request([*range(0, 10), *range(100, 120)], now=0.0))  # 30 blocks, the shared head and one branch
    p.choose(request([*range(0, 10), *range(200, 220)], now=1.0))  # another branch ...
    p.choose(request([*range(0, 10), *range(200, 220)], now=5.0))  # ... used again later
    assert p.sizes[0] == 50 * TB
    p.choose(request(range(0, 10), now=10.0))  # the first request after 10 s evicts before routing
    assert p.sizes[0] <= 30 * TB and p.evictions >= 1
    old, _ = p._walk(tuple([*range(0, 10), *range(100, 120)]), TB)
    new, matched_new = p._walk(tuple([*range(0, 10), *range(200, 220)]), TB)
    assert matched_new == 30  # the branch used last is kept whole
    assert sum(node.n for node in old) == 10  # the older branch went, the shared head stayed


def cached_twins(prefixes: list[list[int]]) -> list[Twin]:
    """Twins of a small profile, replica i having served a prompt of hash ids prefixes[i] (now cached)."""
    env = simpy.Environment()
    profile = load_profile("tiny-vllm-cpu")
    twins = [Twin(env, profile) for _ in prefixes]
    bs = profile.kv_cache.kv_block_size
    for twin, ids in zip(twins, prefixes):
        if ids:
            twin.submit(len(ids) * bs + 1, 2, ids, bs)
    env.run()
    return twins


def test_prefix_score_picks_the_longest_real_cached_prefix_unless_the_load_outweighs_it():
    twins = cached_twins([[1, 2], [1, 2, 3, 4, 5, 6], [], [1]])
    bs = twins[0].block_size
    ask = RouteRequest("s", Call(7 * bs, 4, hash_ids=(1, 2, 3, 4, 5, 6, 7), block_size=bs), 0.0)
    assert [v.cached_tokens(ask) for v in views(0, 0, 0, 0, twins=twins)] == [2 * bs, 6 * bs, 0, bs]
    replicas = views(0, 0, 0, 0, twins=twins)
    assert isinstance(policy("prefix_score", replicas), PrefixScorePolicy)
    assert policy("prefix_score", replicas).choose(ask) == 1
    replicas[1].in_flight = 3  # 6 blocks - 3 in flight = 3 > 2 - 0: still there
    assert policy("prefix_score", replicas).choose(ask) == 1
    replicas[1].in_flight = 5  # 6 - 5 = 1 < 2: the next best prefix wins
    assert policy("prefix_score", replicas).choose(ask) == 0
    assert policy("prefix_score", replicas, load_penalty=0.0).choose(ask) == 1


class LastReplica(Policy):
    """Always the last replica (a user's policy)."""

    def choose(self, request: RouteRequest) -> int:
        return len(self.replicas) - 1


def test_a_registered_policy_runs_in_the_fleet_twin_untouched():
    register("test-last-replica", LastReplica)
    fleet = FleetSpec(replicas=3, router={"policy": "test-last-replica"})
    profile = load_profile("tiny-vllm-cpu")
    tasks = [Task(f"t{i}", (Call(200, 8, hash_ids=(i, i + 1), block_size=64), Call(300, 8, gap=0.1)), arrival=0.2 * i)
             for i in range(6)]
    sink = ListSink()
    SimDriver(Workload(tasks), profile, sink, server=lambda env: FleetTwin(env, fleet, profile)).run()
    assert len(sink.calls) == 12 and {c.replica for c in sink.calls} == {"r2"}
    with pytest.raises(InputError, match="unknown router policy 'nope'.*test-last-replica"):
        make_policy(RouterSpec(policy="nope"), views(0), 0)
    with pytest.raises(TypeError):
        register("bad", object)  # type: ignore[arg-type]
