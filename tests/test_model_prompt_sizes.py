"""Prompt sizes that depend on each other: a task's first prompt goes with its number of calls, and a
rewrite's kept share of the previous prompt goes with how much it appends. Drawn apart, long tasks
start too big and rewrites pair big appends with whole prefixes: generated prompts come out too large."""

import numpy as np
import pytest

from simulator.model.fit import fit_model
from simulator.model.generate import _ReuseDraws, _prompt_sizes, generate
from simulator.model.schema import RewritePairs, TaskStarts
from simulator.workload import Call, Task, Workload

BS = 16
SHORT, LONG = 4, 40


def _task(rng, tid: str, arrival: float, ncalls: int, ids: list) -> Task:
    """Short tasks start big, long ones small; 1 call in 10 rewrites the prompt, either a compaction
    (a tenth kept, a big new context) or a trim (all but the last block kept, a little appended)."""
    calls = []
    chain: tuple = ()
    for i in range(ncalls):
        if i == 0:
            keep, add = 0, int(rng.lognormal(10.0 if ncalls == SHORT else 7.0, 0.2))
        elif rng.random() < 0.1:
            compaction = rng.random() < 0.5
            keep = len(chain) // 10 if compaction else max(0, len(chain) - 1)
            add = int(rng.lognormal(9.0, 0.2)) if compaction else int(rng.lognormal(4.0, 0.2))
        else:
            keep, add = len(chain), int(rng.lognormal(4.5, 0.3))
        inp = keep * BS + add
        fresh = inp // BS - keep
        chain = chain[:keep] + tuple(range(ids[0], ids[0] + fresh))
        ids[0] += fresh
        calls.append(Call(input_tokens=inp, output_tokens=100, gap=0.0 if i == 0 else 1.0, hash_ids=chain,
                          block_size=BS, stop_reason="tool_use"))
    return Task(id=tid, calls=tuple(calls), arrival=arrival, task_class="agent")


@pytest.fixture(scope="module")
def recorded() -> Workload:
    # 24 tasks of each length: too few for a first-call cell per length class (30 needed).
    rng = np.random.default_rng(11)
    ids = [1]
    return Workload(tuple(_task(rng, f"t{i}", 2.0 * i, SHORT if i % 2 else LONG, ids) for i in range(48)))


@pytest.fixture(scope="module")
def model(recorded):
    return fit_model(recorded, allow_fallback=True)


@pytest.fixture(scope="module")
def generated(model) -> Workload:
    return generate(model, tasks=400, seed=1, rate=1.0)


def test_first_prompt_follows_the_number_of_calls(generated):
    for ncalls, mu in ((SHORT, 10.0), (LONG, 7.0)):
        first = [t.calls[0].input_tokens for t in generated.tasks if len(t.calls) == ncalls]
        assert len(first) > 100
        assert np.median(first) == pytest.approx(np.exp(mu), rel=0.3)


def test_a_rewrite_keeps_and_appends_as_recorded_together(generated):
    kept_big = 0
    rewrites = 0
    for task in generated.tasks:
        for prev, call in zip(task.calls, task.calls[1:]):
            shared = 0
            for a, b in zip(call.hash_ids, prev.hash_ids):
                if a != b:
                    break
                shared += 1
            if shared < len(prev.hash_ids):
                rewrites += 1
                appended = call.input_tokens - shared * BS
                # A big new context only ever came with a compaction; independent draws put half of
                # them on top of a whole prefix.
                kept_big += shared >= len(prev.hash_ids) // 2 and appended > np.exp(8.0)
    assert rewrites > 200
    assert kept_big / rewrites < 0.02


def test_fitted_model_keeps_the_pairs_and_starts(recorded):
    structure = fit_model(recorded, allow_fallback=True).classes["agent"].structure
    pairs = structure.reuse.partial_pairs
    assert pairs is not None and len(pairs.kept) == len(pairs.appended) > 50
    assert sorted(structure.starts.calls) == structure.starts.calls
    assert len(structure.starts.first_input) == 48


def test_pairs_and_starts_must_have_matching_lengths():
    with pytest.raises(ValueError):
        RewritePairs(kept=[0.5, 1.0], appended=[10])
    with pytest.raises(ValueError):
        TaskStarts(calls=[1, 2], first_input=[100])


def test_neighbours_are_the_closest_lengths():
    starts = TaskStarts(calls=[1, 2, 10, 11, 50], first_input=[100, 200, 1000, 1100, 5000], neighbours=2)
    rng = np.random.default_rng(0)
    got = starts.sample(rng, np.asarray([1] * 200 + [10] * 200 + [60] * 200))
    assert set(got[:200]) == {100, 200}
    assert set(got[200:400]) == {1000, 1100}
    assert set(got[400:]) == {1100, 5000}


def test_a_turn_past_the_peak_drops_the_head_blocks_it_needs_to_append_in_full(model):
    # One task, first prompt 100 tokens, peak 1.5 times that: the third call, keeping all 15 blocks and
    # appending 50, would reach 200 > 150, so it keeps 10 blocks and still appends its 50.
    structure = model.classes["agent"].structure.model_copy(update={"block_size": 10, "context_limit": 10**6})
    appended = np.array([100.0, 50.0, 50.0])
    keep_all = _ReuseDraws(fraction=np.zeros(3), appended=np.zeros(3), full=np.ones(3, dtype=bool))
    inputs, shared = _prompt_sizes(structure, np.array([3]), np.array([0, 3]), appended, keep_all, np.array([1.5]))
    assert inputs.tolist() == [100, 150, 150]
    assert shared.tolist() == [0, 10, 10]
