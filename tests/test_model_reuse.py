"""Prefix reuse and cell choice conditioned on the previous stop reason: a rewrite of the prompt after
an end of turn is more frequent and appends far more than the usual turn, and an end of turn is
followed by a long gap whatever the task's length."""

import numpy as np
import pytest

from simulator.model.fit import _partial_reuse, fit_model
from simulator.model.generate import _lookup, generate
from simulator.model.schema import Cell
from simulator.model.dists import Constant
from simulator.workload import Call, Task, Workload, appended_tokens

BS = 16
REWRITE = {"end_turn": 0.4, "tool_use": 0.05}
"""Chance that a call drops most of the previous prompt, by the previous call's stop reason."""


def _task(rng, tid: str, arrival: float, ncalls: int, ids: list) -> Task:
    calls = []
    chain: tuple = ()
    stop = "tool_use"
    for i in range(ncalls):
        if i == 0:
            keep, add = 0, int(rng.lognormal(7.0, 0.3))
        elif rng.random() < REWRITE[stop]:  # a rewrite: a tenth kept, a whole new context appended
            keep, add = len(chain) // 10, int(rng.lognormal(9.0, 0.3))
        else:
            keep, add = len(chain), int(rng.lognormal(5.0, 0.5))
        inp = keep * BS + add
        fresh = inp // BS - keep
        chain = chain[:keep] + tuple(range(ids[0], ids[0] + fresh))
        ids[0] += fresh
        prev_stop = stop
        stop = "end_turn" if rng.random() < 0.3 else "tool_use"
        gap = 0.0 if i == 0 else float(rng.lognormal(4.0 if prev_stop == "end_turn" else 0.5, 0.5))
        calls.append(Call(input_tokens=inp, output_tokens=int(rng.lognormal(5.5, 0.6)), gap=gap,
                          hash_ids=chain, block_size=BS, stop_reason=stop))
    return Task(id=tid, calls=tuple(calls), arrival=arrival, task_class="agent")


def _rewrites(workload: Workload) -> dict[str, list[bool]]:
    """Per previous stop reason: whether each call dropped part of the previous prompt."""
    out: dict[str, list[bool]] = {"end_turn": [], "tool_use": []}
    for task in workload.tasks:
        for prev, call in zip(task.calls, task.calls[1:]):
            out[prev.stop_reason].append(call.hash_ids[:len(prev.hash_ids)] != prev.hash_ids)
    return out


def _appended(workload: Workload) -> np.ndarray:
    return np.asarray([appended_tokens(c, p) for t in workload.tasks for p, c in zip((None,) + t.calls, t.calls)], float)


@pytest.fixture(scope="module")
def recorded() -> Workload:
    rng = np.random.default_rng(5)
    ids = [1]
    return Workload(tuple(_task(rng, f"t{i}", 2.0 * i, int(n), ids) for i, n in enumerate(rng.choice([4, 20], size=300))))


@pytest.fixture(scope="module")
def model(recorded):
    return fit_model(recorded)


def test_reuse_is_fitted_per_previous_stop(model):
    reuse = model.classes["agent"].structure.reuse
    assert reuse.after_stop["end_turn"].full_prob == pytest.approx(1 - REWRITE["end_turn"], abs=0.05)
    assert reuse.after_stop["tool_use"].full_prob == pytest.approx(1 - REWRITE["tool_use"], abs=0.02)
    # Both had enough rewrites for their own distributions.
    assert reuse.after_stop["end_turn"].partial_appended is not None


def test_generated_rewrites_follow_the_previous_stop(model):
    # Without the peak cap, whose trims are partial reuses of their own.
    cls = model.classes["agent"]
    structure = cls.structure.model_copy(update={"peak_growth": {}, "context_limit": 10**9})
    uncapped = model.model_copy(update={"classes": {"agent": cls.model_copy(update={"structure": structure})}})
    got = _rewrites(generate(uncapped, tasks=600, seed=2))
    assert np.mean(got["end_turn"]) == pytest.approx(REWRITE["end_turn"], abs=0.05)
    assert np.mean(got["tool_use"]) == pytest.approx(REWRITE["tool_use"], abs=0.02)


def test_rewrites_are_not_counted_twice_in_appended_tokens(recorded, model):
    # Cells fit appended tokens on calls that kept the whole previous prompt; rewrites draw from the
    # reuse's own distribution. Counting rewrites in both would about double the large appends.
    rec, gen = _appended(recorded), _appended(generate(model, tasks=600, seed=3))
    big = np.exp(8.0)
    assert np.mean(gen > big) / np.mean(rec > big) == pytest.approx(1.0, abs=0.2)
    assert np.quantile(gen, 0.95) / np.quantile(rec, 0.95) == pytest.approx(1.0, abs=0.2)


def test_stop_reason_cell_comes_before_the_length_class():
    def cell(length, from_call, after):
        return Cell(task_length=length, from_call=from_call, after_stop=after, appended=Constant(value=1.0),
                    output=Constant(value=1.0), gap=Constant(value=1.0))

    cells = {(c.task_length, c.from_call, c.after_stop): c for c in
             (cell(None, None, None), cell(None, None, "end_turn"), cell(9, 4, None), cell(9, None, "end_turn"),
              cell(1, 4, None))}
    assert _lookup(cells, 9, 4, "end_turn") is cells[(9, None, "end_turn")]
    assert _lookup(cells, 1, 4, "end_turn") is cells[(None, None, "end_turn")]  # not its length's (1, 4) cell
    assert _lookup(cells, 9, 4, "tool_use") is cells[(9, 4, None)]
    assert _lookup(cells, 1, 4, "tool_use") is cells[(1, 4, None)]
    assert _lookup(cells, 1, 2, "tool_use") is cells[(None, None, None)]


def test_gaps_after_an_end_of_turn_stay_long_in_every_length_class(model):
    w = generate(model, tasks=600, seed=4)
    for n_calls in ({4}, {20}):
        gaps = [c.gap for t in w.tasks if len(t.calls) in n_calls for p, c in zip(t.calls, t.calls[1:])
                if p.stop_reason == "end_turn"]
        assert np.median(gaps) == pytest.approx(np.exp(4.0), rel=0.25)


def test_a_partial_reuse_keeps_the_shared_share_of_the_previous_ids():
    prev = Call(input_tokens=4 * BS, output_tokens=1, hash_ids=(1, 2, 3, 4), block_size=BS)

    def call(ids, inp=5 * BS, bs=BS):
        return Call(input_tokens=inp, output_tokens=1, gap=1.0, hash_ids=ids, block_size=bs)

    assert _partial_reuse(call((1, 2, 3, 4, 5)), prev, BS) is None
    assert _partial_reuse(call((1, 2, 9, 10, 11)), prev, 3 * BS) == (0.5, 3 * BS)
    assert _partial_reuse(call((9, 10, 11, 12, 13)), prev, 5 * BS) == (0.0, 5 * BS)
    # Ids of another block size do not compare: only a shorter prompt is a partial reuse, appending nothing.
    assert _partial_reuse(call((1, 2), inp=3 * BS, bs=2 * BS), prev, 3 * BS) == (0.75, 0.0)
    assert _partial_reuse(call((9, 10, 11), inp=6 * BS, bs=2 * BS), prev, 2 * BS) is None
