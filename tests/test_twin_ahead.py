"""Runs of decode steps planned past the next event (`Twin._plans_ahead`, `Twin._horizon_ahead`): a twin
sharing its environment with busy neighbours keeps its runs long, cuts them short when work reaches it,
and gives the records of stepping one by one."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from simulator.sim.hybrid_twin import HybridTwin
from simulator.sim.profile import load_profile
from simulator.sim.twin import Twin

TB = 64


class _Ahead:
    """Plans every run as far as 64 of its first step ahead."""

    env: simpy.Environment
    _plans_ahead = True

    def _horizon_ahead(self, step_s: float) -> float:
        return self.env.now + 64 * step_s


class AheadTwin(_Ahead, Twin):
    pass


class AheadHybridTwin(_Ahead, HybridTwin):
    pass


def run(preset: str, overrides: dict, *, ahead: bool, fast: bool = True, reads: bool = False):
    """Closed-loop conversations on one twin, beside a neighbour with an event every millisecond (and,
    with `reads`, a router reading the twin's prefix cache every 7 ms): (completions, the twin's counters,
    how many requests shortened the engine's planned step when sent)."""
    profile = load_profile(preset, overrides)
    env = simpy.Environment()
    hybrid = profile.kv_cache.hybrid is not None
    kind = (AheadHybridTwin if hybrid else AheadTwin) if ahead else (HybridTwin if hybrid else Twin)
    twin = kind(env, profile, keep_gaps=True, fast_decode=fast)
    rng = np.random.default_rng(5)
    done: list = []
    cuts = 0
    system = tuple(range(1, 9))

    def conversation(i: int, start: float):
        yield env.timeout(start)
        ids = system + tuple(range(1000 * (i + 1), 1000 * (i + 1) + 40))
        prompt = len(system) * TB
        nonlocal cuts
        for turn in range(int(rng.integers(3, 7))):
            prompt = min(prompt + int(rng.integers(50, 400)), 1500)
            planned = twin.planned_step()
            sent = twin.submit(prompt, int(rng.integers(20, 200)), ids[:prompt // TB], TB)
            cuts += planned is not None and twin.planned_step()[1] < planned[1]
            done.append((i, turn, (yield sent)))
            yield env.timeout(float(rng.exponential(0.2)))

    def neighbour():
        while env.now < 400:
            yield env.timeout(0.001)

    def router():
        while env.now < 400:
            yield env.timeout(0.007)
            twin.sync()
            twin.kv.lookup(twin._holding_class(system, TB, len(system) * TB), len(system))

    for i in range(24):
        env.process(conversation(i, float(rng.exponential(0.5)) + 0.05 * i))
    env.process(neighbour())
    if reads:
        env.process(router())
    env.run()
    return done, twin.stats, cuts


@pytest.mark.parametrize("preset,overrides", [
    ("tiny-vllm-cpu", {}),  # API-server terms: intake, per-token delivery, contention
    ("tiny-vllm-cpu", {"kv_cache": {"num_blocks": 48}}),  # evictions and preemptions
    ("gb300-nemotron-super-mtp3", {}),  # a hybrid model with speculative decoding
])
def test_runs_planned_ahead_are_cut_where_work_arrives_and_keep_the_records_of_stepping_one_by_one(preset,
                                                                                                   overrides):
    stepped, one_by_one, _ = run(preset, overrides, ahead=False, fast=False)
    alone, short, uncut = run(preset, overrides, ahead=False)
    ahead, long, cuts = run(preset, overrides, ahead=True, reads=True)
    assert ahead == stepped and alone == stepped
    assert long.steps == one_by_one.steps and long.preemptions == one_by_one.preemptions
    # the neighbour's events leave the twin alone no run of several steps, nor one to cut
    assert short.fast_chunks == 0 and uncut == 0
    assert long.fast_chunks > 0 and cuts > 0
    if "kv_cache" in overrides:
        assert long.preemptions > 0
