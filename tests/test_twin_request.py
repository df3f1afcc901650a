"""The twin's request record (`TwinRequest`, what `Twin.submit_call_raw` resolves with) and the
arithmetic its fast decode path runs on: pure-decode step terms and speculative emission counts."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import simpy

from simulator.sim.kv_cache import Holding
from simulator.sim.make_twin import make_twin
from simulator.sim.profile import profile_from_dict
from simulator.sim.request import TwinRequest
from simulator.sim.step_time import StepTimeModel
from simulator.workload import Call


def make_profile(**sections):
    data = {
        "scheduler": {"max_num_seqs": 64, "max_num_batched_tokens": 256, "max_model_len": 4096},
        "kv_cache": {"block_size": 16, "num_blocks": 2000},
        "step_time": {"fixed": 0.01, "per_token": 2e-5, "per_decode_seq": 3e-4, "per_context_token": 1e-7,
                      "schedule_fixed": 0.001, "schedule_per_seq": 1e-5},
    }
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    return profile_from_dict(data)


def conversations(seed: int, n: int = 12):
    """(arrival, calls with their gaps before) of conversations growing over a shared prefix."""
    rng = np.random.default_rng(seed)
    out = []
    next_id = 1000
    for _ in range(n):
        ids = (1, 2, 3)
        calls = []
        for _ in range(int(rng.integers(2, 5))):
            ids = ids + tuple(range(next_id, next_id + int(rng.integers(1, 6))))
            next_id += 6
            calls.append((float(rng.choice([0.0, 0.05, 0.5])),
                          Call(len(ids) * 16 - int(rng.integers(0, 16)), int(rng.integers(1, 80)),
                               hash_ids=ids, block_size=16)))
        out.append((float(rng.uniform(0, 0.5)), calls))
    return out


def run(profile, raw: bool, fast_decode: bool = True, keep_gaps: bool = False, seed: int = 3):
    """Closed-loop conversations on a twin; returns what each call's event gave, in completion order."""
    env = simpy.Environment()
    twin = make_twin(env, profile, keep_gaps=keep_gaps, fast_decode=fast_decode)
    done = []

    def client(arrival, calls):
        yield env.timeout(arrival)
        for gap, call in calls:
            if gap:
                yield env.timeout(gap)
            done.append((yield twin.submit_call_raw(call) if raw else twin.submit_call(call)))

    for arrival, calls in conversations(seed):
        env.process(client(arrival, calls))
    env.run()
    return done, twin


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("keep_gaps", [False, True])
def test_raw_record_carries_the_completion_figures(fast, keep_gaps):
    profile = make_profile()
    raws, _ = run(profile, raw=True, fast_decode=fast, keep_gaps=keep_gaps)
    completions, _ = run(profile, raw=False, fast_decode=fast, keep_gaps=keep_gaps)
    assert len(raws) == len(completions) > 20
    for req, c in zip(raws, completions):
        assert type(req) is TwinRequest
        assert req.event is None and not req.in_group  # resolved, settled out of the decode group
        assert (req.submitted, req.first_token, req.last_token, req.prompt, req.generated) == \
               (c.submitted, c.first_token, c.end, c.input_tokens, c.output_tokens)
        assert (req.cached_tokens or 0, req.itl_count, req.preemptions) == (c.cached_tokens, c.itl_count, c.preemptions)
        assert req.itl_max == (c.itl_max or 0.0)
        assert req.gaps == (c.gaps if keep_gaps else None)
        assert req.generated == req.target and req.computed >= req.prompt
    assert any(c.cached_tokens for c in completions) and any(c.itl_count for c in completions)
    if keep_gaps:
        assert all(len(req.gaps) == req.itl_count for req in raws)


def test_a_new_record_has_every_field_set():
    req = TwinRequest(10, 5, Holding((), 0, 10), 0.0, None, "tag", None)
    for f in dataclasses.fields(TwinRequest):
        getattr(req, f.name)  # an unset slot would raise AttributeError
    assert not hasattr(req, "__dict__")
    with pytest.raises(AttributeError):
        req.undeclared = 1  # type: ignore[attr-defined]


@pytest.mark.parametrize("sections", [
    {},
    {"scheduler": {"async_scheduling": True}},
    {"scheduler": {"async_scheduling": True}, "step_time": {"schedule_fixed": 0.05}},  # scheduling-bound
    {"spec_decode": {"num_tokens": 3, "acceptance": 0.6}, "step_time": {"per_prefill_attention": 1e-9}},
])
def test_decode_terms_give_duration_to_the_bit(sections):
    model = StepTimeModel.from_profile(make_profile(**sections))
    rng = np.random.default_rng(0)
    for seqs in (1, 2, 7, 64, 300):
        base, add, floor = model.decode_terms(seqs)
        for context in rng.integers(1, 10**7, size=50).tolist():
            compute = base + model.per_context_token * context + add
            assert (compute if compute > floor else floor) == model.duration(0, 0, seqs, context)


@pytest.mark.parametrize("spec", [{"num_tokens": 3, "acceptance": 0.6}, {"num_tokens": 1, "acceptance": 0.9},
                                  {"num_tokens": 2, "acceptance": 1.0}, {"num_tokens": 4, "acceptance": 0.0}])
def test_steps_to_emit_is_the_fewest_steps_reaching_the_tokens(spec):
    twin = make_twin(simpy.Environment(), make_profile(spec_decode=spec))
    for step in (0, 1, 5, 99, 12345):
        emitted = [twin.emitted(g) for g in range(step, step + 400)]
        for tokens in (1, 2, 3, 7, 50, 333):
            steps = twin._steps_to_emit(step, tokens)
            assert sum(emitted[:steps]) >= tokens > sum(emitted[:steps - 1])


@pytest.mark.parametrize("sections", [{"scheduler": {"async_scheduling": True}},
                                      {"scheduler": {"async_scheduling": True}, "step_time": {"schedule_fixed": 0.05}}])
def test_fast_decode_matches_single_stepping_with_async_scheduling(sections):
    profile = make_profile(**sections)
    slow, slow_twin = run(profile, raw=False, fast_decode=False, keep_gaps=True, seed=8)
    fast, fast_twin = run(profile, raw=False, fast_decode=True, keep_gaps=True, seed=8)
    assert fast_twin.stats.fast_chunks > 0
    assert fast == slow  # every field, every gap, bit for bit
    assert fast_twin.stats.steps == slow_twin.stats.steps
    assert fast_twin.stats.busy_time == pytest.approx(slow_twin.stats.busy_time)  # summed by step or by run
