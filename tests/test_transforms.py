"""Workload transforms, each checked by hand on a tiny workload."""

import pytest

from simulator.errors import InputError
from simulator.transforms import (
    TransformSpec, apply, filter_classes, gap_cap, gap_scale, rate_scale, sample, time_scale, token_scale,
)
from simulator.workload import Call, SubTask, Task, Workload, appended_tokens


def _calls(*specs):
    return tuple(Call(input_tokens=i, output_tokens=o, gap=g, hash_ids=ids, block_size=4 if ids else 0) for i, o, g, ids in specs)


@pytest.fixture
def work() -> Workload:
    sub = Task(id="a.s", calls=_calls((8, 2, 0.0, (1, 2))))
    a = Task(id="a", arrival=10.0, task_class="x",
             calls=_calls((8, 4, 0.0, (1, 2)), (16, 6, 30.0, (1, 2, 3, 4))),
             subtasks=(SubTask(after_call=0, task=sub),))
    b = Task(id="b", arrival=14.0, task_class="y", calls=_calls((12, 2, 5.0, (1, 2, 9))))
    c = Task(id="c", arrival=20.0, task_class="x", calls=_calls((4, 1, 100.0, (7,))))
    return Workload((a, b, c))


def test_time_scale_stretches_arrivals_not_gaps(work):
    out = time_scale(work, 2.0)
    assert [t.arrival for t in out.tasks] == [10.0, 18.0, 30.0]
    assert [c.gap for c in out.all_calls()] == [c.gap for c in work.all_calls()]
    assert out.provenance[-1].format == "time_scale"


def test_gap_scale_and_cap_touch_every_call_including_subtasks(work):
    assert [c.gap for c in gap_scale(work, 0.5).all_calls()] == [0.0, 15.0, 0.0, 2.5, 50.0]
    assert [c.gap for c in gap_cap(work, 20.0).all_calls()] == [0.0, 20.0, 0.0, 5.0, 20.0]
    assert [t.arrival for t in gap_cap(work, 20.0).tasks] == [10.0, 14.0, 20.0]


def test_rate_scale_compress_divides_time(work):
    out = rate_scale(work, 2.0)
    assert [t.arrival for t in out.tasks] == [10.0, 12.0, 15.0]
    assert [t.id for t in out.tasks] == ["a", "b", "c"]


def test_rate_scale_overlay_keeps_the_span_and_separates_copies(work):
    out = rate_scale(work, 2.0, mode="overlay", seed=1)
    assert len(out.tasks) == 6
    period = 10.0 * 3 / 2
    assert all(10.0 <= t.arrival < 10.0 + period for t in out.tasks)
    ids = [t.id for t in out.tasks]
    assert len(set(ids)) == 6 and sum("~1" in i for i in ids) == 3
    copy_a = next(t for t in out.tasks if t.id == "a~1")
    # Copies carry their own hash ids (other users, other prompts), same structure.
    assert copy_a.calls[1].hash_ids == tuple(i + 10 for i in (1, 2, 3, 4))
    thinner = rate_scale(work, 0.5, mode="overlay", seed=1)
    assert len(thinner.tasks) == 2 and {t.id for t in thinner.tasks} <= {"a", "b", "c"}
    assert rate_scale(work, 2.0, mode="overlay", seed=1) == out


def test_rate_scale_overlay_gives_every_copy_s_sub_tasks_ids_of_their_own(work):
    named_under = Task(id="b/agent_1", calls=_calls((8, 2, 0.0, (5, 6))))
    b = Task(id="b", arrival=14.0, calls=_calls((12, 2, 5.0, (1, 2, 9))), subtasks=(SubTask(0, named_under),))
    work = Workload((work.tasks[0], b, work.tasks[2]))
    out = rate_scale(work, 3.0, mode="overlay", seed=1)
    every = [t.id for t in out.all_tasks()]
    assert len(every) == 15 and len(set(every)) == 15
    assert {"a.s~1", "a.s~2", "b~1/agent_1", "b~2/agent_1"} <= set(every)
    copy = next(t for t in out.tasks if t.id == "b~2")
    assert copy.subtasks[0].task.id == "b~2/agent_1"
    assert copy.subtasks[0].task.calls[0].hash_ids != named_under.calls[0].hash_ids


def test_filter_and_sample(work):
    assert [t.id for t in filter_classes(work, ["x"]).tasks] == ["a", "c"]
    with pytest.raises(InputError, match="classes present"):
        filter_classes(work, ["zzz"])
    picked = sample(work, 2, seed=3)
    assert len(picked.tasks) == 2 and picked == sample(work, 2, seed=3)
    assert [t.arrival for t in picked.tasks] == sorted(t.arrival for t in picked.tasks)
    assert len(sample(work, 10).tasks) == 3


def test_token_scale_halves_tokens_and_keeps_prefix_sharing(work):
    out = token_scale(work, 0.5)
    a = out.tasks[0]
    assert [(c.input_tokens, c.output_tokens) for c in a.calls] == [(4, 2), (8, 3)]
    first, second = a.calls
    # 4 tokens = 1 block of 4, 8 tokens = 2 blocks; the second prompt still starts with the first.
    assert len(first.hash_ids) == 1 and len(second.hash_ids) == 2
    assert second.hash_ids[:1] == first.hash_ids
    assert appended_tokens(second, first) == 4
    # Task b shared its first two original blocks with a: it still shares the first scaled block.
    b = out.tasks[1]
    assert b.calls[0].hash_ids[0] == first.hash_ids[0]
    # Task c shared nothing.
    assert not set(out.tasks[2].calls[0].hash_ids) & {i for c in a.calls for i in c.hash_ids}


def test_token_scale_up_keeps_sharing():
    t1 = Task(id="p", calls=_calls((8, 1, 0.0, (1, 2))))
    t2 = Task(id="q", calls=_calls((8, 1, 0.0, (1, 3))))
    out = token_scale(Workload((t1, t2)), 2.0)
    p, q = (t.calls[0] for t in out.tasks)
    assert p.input_tokens == 16 and len(p.hash_ids) == 4
    # The first original block became two blocks, shared; the second differs.
    assert p.hash_ids[:2] == q.hash_ids[:2] and p.hash_ids[2:] != q.hash_ids[2:]
    assert len(set(p.hash_ids)) == 4


def test_context_cap_limits_each_call(work):
    out = token_scale(work, 1.0, context_cap=10)
    for c in out.all_calls():
        assert c.input_tokens + c.output_tokens <= 10
        assert len(c.hash_ids) <= c.input_tokens // 4
    second = out.tasks[0].calls[1]
    assert (second.input_tokens, second.output_tokens) == (5, 5)
    assert second.hash_ids == (1,)


def test_apply_runs_the_spec_in_order(work):
    spec = TransformSpec(classes=["x"], time_scale=2.0, gap_cap=10.0, token_scale=2.0)
    out = apply(work, spec, seed=0)
    assert [t.id for t in out.tasks] == ["a", "c"]
    assert [t.arrival for t in out.tasks] == [10.0, 30.0]
    assert max(c.gap for c in out.all_calls()) == 10.0
    assert out.tasks[0].calls[0].input_tokens == 16
    assert [p.format for p in out.provenance] == ["filter_classes", "time_scale", "gap_cap", "token_scale"]
    assert apply(work, TransformSpec()) == work
    with pytest.raises(ValueError):
        TransformSpec(time_scale=0)


# ---- shared ids and bounds (issue 17) ----------------------------------------------------------------------

from simulator.hash_ids import HashIds  # noqa: E402


def _shared_work() -> Workload:
    first = HashIds.of((2**62 + 10, 2**62 + 11, 2**62 + 12))
    calls = (Call(48, 4, hash_ids=first, block_size=16), Call(80, 4, hash_ids=first.extend(3, (2**62 + 13, 2**62 + 14)),
                                                              block_size=16))
    return Workload((Task("a", calls), Task("b", (Call(16, 2, hash_ids=HashIds.of((7,)), block_size=16),), arrival=5.0)))


def test_overlay_copies_of_views_stay_views_below_2_63_and_apart():
    work = _shared_work()
    out = rate_scale(work, 3.0, mode="overlay", seed=2)
    ids = {tuple(c.hash_ids) for c in out.all_calls()}
    assert all(0 <= i < 2**63 for t in ids for i in t)
    copies = [t for t in out.tasks if t.id.startswith("a")]
    assert len({t.calls[0].hash_ids[0] for t in copies}) == len(copies)  # each copy its own ids
    for t in copies:  # a copy's calls still share their chain, and the second extends the first
        assert t.calls[1].hash_ids._chain is t.calls[0].hash_ids._chain
        assert t.calls[1].hash_ids[:3] == t.calls[0].hash_ids


def test_token_scale_keeps_one_output_token_and_shares_ids():
    work = _shared_work()
    out = token_scale(work, 0.01)
    assert all(c.output_tokens >= 1 for c in out.all_calls())
    up = token_scale(work, 2.0)
    a0, a1 = up.tasks[0].calls
    assert a1.hash_ids[: len(a0.hash_ids)] == a0.hash_ids and a1.hash_ids._chain is a0.hash_ids._chain


def test_scales_that_overflow_are_input_errors(work):
    with pytest.raises(InputError) as err:
        token_scale(work, 1e308)
    assert err.value.field == "token_scale"
    assert token_scale(work, 1e6, context_cap=1000).tasks[0].calls[0].input_tokens + \
        token_scale(work, 1e6, context_cap=1000).tasks[0].calls[0].output_tokens == 1000
    with pytest.raises(InputError):
        time_scale(work, 1e300)
    with pytest.raises(InputError):
        gap_scale(work, 1e300)
    with pytest.raises(InputError):
        rate_scale(work, 1e-300)
    with pytest.raises(Exception):
        TransformSpec(token_scale=1e308)


# ---------------------------------------------------------------- rate in tasks per second, burstiness

import numpy as np  # noqa: E402

from simulator.transforms import respace, task_rate  # noqa: E402


def _steady(n: int, step: float = 1.0) -> Workload:
    return Workload(tuple(Task(f"t{i}", _calls((100, 5, 0.0, ()), (200, 5, 1.0, ())), arrival=step * i) for i in range(n)))


def _gaps(w: Workload) -> np.ndarray:
    return np.diff(sorted(t.arrival for t in w.tasks))


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_burstiness_respaces_arrivals_as_gamma_gaps_of_that_shape(burstiness):
    steady = _steady(20_001)
    out = apply(steady, TransformSpec(burstiness=burstiness), seed=3)
    gaps = _gaps(out)
    # the coefficient of variation of gamma gaps of shape B is 1 / sqrt(B); the mean gap stays 1 s
    assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(burstiness), rel=0.05)
    assert gaps.mean() == pytest.approx(1.0, rel=0.05)
    assert [t.id for t in out.tasks] == [t.id for t in steady.tasks] and out.tasks[0].arrival == 0.0
    assert [t.calls for t in out.tasks] == [t.calls for t in steady.tasks]
    assert out.provenance[-1].options == {"process": "gamma", "burstiness": burstiness, "rate": 1.0, "seed": 3}
    assert apply(steady, TransformSpec(burstiness=burstiness), seed=3) == out
    assert apply(steady, TransformSpec(burstiness=burstiness), seed=4) != out


def test_rate_rescales_arrivals_to_tasks_per_second():
    steady = _steady(11, step=2.0)  # 0.5 tasks/s
    assert task_rate(steady) == 0.5
    faster = apply(steady, TransformSpec(rate=4.0))
    assert task_rate(faster) == pytest.approx(4.0) and np.allclose(_gaps(faster), 0.25)
    bursty = apply(steady, TransformSpec(rate=4.0, burstiness=0.5), seed=1)
    assert bursty.provenance[-1].options["rate"] == 4.0 and not np.allclose(_gaps(bursty), 0.25)
    overlaid = apply(_steady(400), TransformSpec(rate=3.0, rate_mode="overlay"), seed=1)
    assert len(overlaid.tasks) == 1200


def test_rate_spaces_tasks_that_arrive_at_once_as_poisson_arrivals():
    together = _steady(20_001, step=0.0)
    assert task_rate(together) is None
    out = apply(together, TransformSpec(rate=0.5), seed=2)
    gaps = _gaps(out)
    assert gaps.mean() == pytest.approx(2.0, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)  # Poisson: CV 1
    with pytest.raises(InputError, match="give a rate"):
        respace(together, 0.5)
    with pytest.raises(Exception, match="not both"):
        TransformSpec(rate=2.0, rate_scale=3.0)
