"""Fit a model to a synthetic workload drawn from known distributions, then generate from it."""

import io
from collections import Counter

import numpy as np
import pytest
import yaml

from simulator.errors import InputError
from simulator.model.dists import fit_empirical
from simulator.model.fit import LENGTH_BUCKETS, POSITION_BUCKETS, bucket_of, fit_model
from simulator.model.generate import _buckets_of, generate
from simulator.model.schema import dump_model, load_model, validate_model
from simulator.model.stats import workload_samples
from simulator.traces import native
from simulator.workload import Call, SubTask, Task, Workload, appended_tokens

BS = 16


def _task(rng, tid: str, arrival: float, ncalls: int, ids: list, sub: bool = True) -> Task:
    calls = []
    chain: tuple = ()
    inp = 0
    stop = "tool_use"
    for i in range(ncalls):
        if i == 0:
            inp = int(rng.lognormal(7.0, 0.3))
            keep = 0
        elif rng.random() < 0.1:  # a compaction: keep a quarter of the previous prompt
            keep = len(chain) // 4
            inp = keep * BS + int(rng.lognormal(6.0, 0.4))
        else:
            keep = len(chain)
            inp = keep * BS + int(rng.lognormal(5.0, 0.5))
        fresh = inp // BS - keep
        chain = chain[:keep] + tuple(range(ids[0], ids[0] + fresh))
        ids[0] += fresh
        prev_stop = stop
        stop = "end_turn" if rng.random() < (0.5 if prev_stop == "end_turn" else 0.2) else "tool_use"
        gap = 0.0 if i == 0 else float(rng.lognormal(4.0 if prev_stop == "end_turn" else 0.5, 0.8))
        calls.append(Call(input_tokens=inp, output_tokens=int(rng.lognormal(5.5, 0.6)), gap=gap,
                          hash_ids=chain, block_size=BS, stop_reason=stop))
    subs = ()
    if sub and ncalls > 2 and rng.random() < 0.3:
        subs = tuple(SubTask(after_call=1, task=_task(rng, f"{tid}.s{j}", 0.0, 4, ids, sub=False)) for j in range(2))
    return Task(id=tid, calls=tuple(calls), arrival=arrival, task_class="agent", subtasks=subs)


@pytest.fixture(scope="module")
def recorded() -> Workload:
    rng = np.random.default_rng(11)
    arrivals = np.cumsum(rng.exponential(2.0, 200))
    ids = [1]
    counts = rng.choice([2, 5, 12], size=200, p=[0.5, 0.3, 0.2])
    return Workload(tuple(_task(rng, f"t{i}", float(a), int(n), ids) for i, (a, n) in enumerate(zip(arrivals, counts))))


@pytest.fixture(scope="module")
def model(recorded):
    return fit_model(recorded)


def test_fit_recovers_structure(model):
    cls = model.classes["agent"]
    s = cls.structure
    assert cls.arrivals.use == "poisson"
    assert cls.arrivals.processes["poisson"].rate == pytest.approx(0.5, rel=0.2)
    assert dict(zip(s.calls_per_task.values, s.calls_per_task.probs)) == pytest.approx({2: 0.5, 5: 0.3, 12: 0.2}, abs=0.08)
    assert s.stops.after["end_turn"]["end_turn"] == pytest.approx(0.5, abs=0.1)
    assert s.stops.after["tool_use"]["end_turn"] == pytest.approx(0.2, abs=0.05)
    assert s.reuse.full_prob == pytest.approx(0.9, abs=0.04)
    assert s.block_size == BS
    assert s.subagents is not None and s.subagents.fan_out.values == [2]
    cells = {(c.from_call, c.after_stop): c for c in s.cells}
    first = cells[(0, "start")]
    assert first.appended.kind in {"lognormal", "lognormal_pareto", "empirical"}
    # The gap after an end of turn is the long one (lognormal mu 4 vs 0.5).
    long_gap = cells[(None, "end_turn")].gap.sample(np.random.default_rng(0), 4000)
    short_gap = cells[(None, "tool_use")].gap.sample(np.random.default_rng(0), 4000)
    assert np.median(long_gap) == pytest.approx(np.exp(4.0), rel=0.25)
    assert np.median(short_gap) == pytest.approx(np.exp(0.5), rel=0.25)


def test_generate_is_deterministic_per_seed(model):
    def dump(seed):
        buf = io.BytesIO()
        native.write(generate(model, tasks=60, seed=seed), buf)
        return buf.getvalue()

    assert dump(3) == dump(3)
    assert dump(3) != dump(4)


def _without_peak_cap(model):
    cls = model.classes["agent"]
    structure = cls.structure.model_copy(update={"peak_growth": {}, "context_limit": 10**9})
    return model.model_copy(update={"classes": {"agent": cls.model_copy(update={"structure": structure})}})


def test_generated_prefixes_grow_and_share_as_modelled(model):
    w = generate(_without_peak_cap(model), tasks=400, seed=1)
    seen_fresh: set = set()
    full = partial = 0
    for task in w.all_tasks():
        top_level = "sub" not in task.id
        prev = None
        for call in task.calls:
            assert len(call.hash_ids) == call.input_tokens // BS
            if prev is None:
                fresh = call.hash_ids
            else:
                shared = 0
                for a, b in zip(call.hash_ids, prev.hash_ids):
                    if a != b:
                        break
                    shared += 1
                # Whatever is not the reused leading part of the previous prompt is fresh.
                assert set(call.hash_ids[:shared]) <= set(prev.hash_ids)
                fresh = call.hash_ids[shared:]
                if top_level and shared == len(prev.hash_ids):
                    full += 1
                elif top_level:
                    partial += 1
            assert not seen_fresh.intersection(fresh)
            seen_fresh.update(fresh)
            prev = call
    assert full / (full + partial) == pytest.approx(model.classes["agent"].structure.reuse.full_prob, abs=0.04)


def test_peak_cap_keeps_prefix_reuse_near_the_recorded(recorded, model):
    # `fit` no longer writes a peak cap; a hand-written one (the recorded growths) still applies.
    ratios = [max(c.input_tokens for c in t.calls) / t.calls[0].input_tokens for t in recorded.tasks]
    cls = model.classes["agent"]
    structure = cls.structure.model_copy(update={"peak_growth": {0: fit_empirical(np.asarray(ratios))}})
    capped = model.model_copy(update={"classes": {"agent": cls.model_copy(update={"structure": structure})}})
    w = generate(capped, tasks=400, seed=1)
    top = max(ratios)
    for task in w.all_tasks():
        first = task.calls[0].input_tokens
        assert max(c.input_tokens for c in task.calls) <= first * top + BS
    got = workload_samples(w).prefix_reuse.within_task
    # Trimming the prompt's tail at the peak costs a little reuse (documented).
    assert got == pytest.approx(workload_samples(recorded).prefix_reuse.within_task, abs=0.08)


def test_generated_marginals_follow_the_recorded(recorded, model):
    w = generate(model, tasks=600, seed=2)
    def per_call(wl):
        app, out, calls = [], [], []
        for t in wl.all_tasks():
            prev = None
            for c in t.calls:
                app.append(appended_tokens(c, prev))
                out.append(c.output_tokens)
                prev = c
        return np.array(app), np.array(out)
    (ra, ro), (ga, go) = per_call(recorded), per_call(w)
    from scipy.stats import ks_2samp
    assert ks_2samp(ra, ga).statistic < 0.08
    assert ks_2samp(ro, go).statistic < 0.08
    counts = Counter(len(t.calls) for t in w.tasks)
    assert set(counts) <= {2, 5, 12}
    assert sum(len(t.subtasks) for t in w.tasks) > 0
    assert all(s.task.task_class == "subagent" for t in w.tasks for s in t.subtasks)


def test_duration_and_rate(model):
    w = generate(model, duration=100.0, seed=5, rate=2.0)
    arrivals = [t.arrival for t in w.tasks]
    assert max(arrivals) < 100.0
    assert len(arrivals) == pytest.approx(200, rel=0.25)
    assert arrivals == sorted(arrivals)
    assert len({t.id for t in w.tasks}) == len(w.tasks)


def test_single_session_needs_a_rate(recorded):
    same_time = Workload(tuple(Task(id=t.id, calls=t.calls, task_class="agent") for t in recorded.tasks))
    m = fit_model(same_time)
    assert m.classes["agent"].arrivals.use == "user"
    assert any("--rate" in n for n in m.notes)
    with pytest.raises(InputError, match="--rate"):
        generate(m, tasks=5)
    assert len(generate(m, tasks=5, rate=1.0).tasks) == 5


def test_too_small_component_says_which_and_falls_back_only_when_allowed(recorded):
    small = Workload(recorded.tasks[:8])
    with pytest.raises(InputError, match="calls_per_task"):
        fit_model(small)
    m = fit_model(small, allow_fallback=True)
    assert any(n.startswith("fallback:") for n in m.notes)
    assert len(generate(m, tasks=3, seed=0).tasks) == 3


def test_yaml_round_trip(model, tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(dump_model(model))
    again = load_model(path)
    assert again == model
    a, b = io.BytesIO(), io.BytesIO()
    native.write(generate(model, tasks=10, seed=9), a)
    native.write(generate(again, tasks=10, seed=9), b)
    assert a.getvalue() == b.getvalue()


@pytest.mark.parametrize(
    "edit, path",
    [
        (lambda d: d["classes"]["agent"]["arrivals"]["processes"]["poisson"].update(rate=-1.0),
         "$.classes.agent.arrivals.processes.poisson.rate"),
        (lambda d: d["classes"]["agent"]["structure"]["calls_per_task"].update(probs=[0.5, 0.3, 0.3]),
         "$.classes.agent.structure.calls_per_task.probs"),
        (lambda d: d["classes"]["agent"]["structure"]["cells"][0].update(output={"kind": "gaussian", "mu": 1, "sigma": 1}),
         "$.classes.agent.structure.cells[0].output"),
        (lambda d: d["classes"]["agent"]["structure"].pop("context_limit"),
         "$.classes.agent.structure.context_limit"),
        (lambda d: d["classes"]["agent"]["structure"]["stops"]["first"].update(end_turn=0.9),
         "$.classes.agent.structure.stops.first"),
    ],
)
def test_model_errors_name_the_yaml_path(model, tmp_path, edit, path):
    data = yaml.safe_load(dump_model(model))
    edit(data)
    file = tmp_path / "bad.yaml"
    file.write_text(yaml.safe_dump(data))
    with pytest.raises(InputError) as err:
        load_model(file)
    assert err.value.path == path
    assert str(file) in str(err.value)


def test_version_is_checked():
    with pytest.raises(InputError, match="version"):
        validate_model({"agentload_model": 7, "classes": {}})


@pytest.mark.parametrize("kw", [dict(tasks=80, seed=4), dict(duration=60.0, seed=6, rate=1.0)])
def test_write_generated_is_native_write_of_generate(model, kw, tmp_path):
    from simulator.errors import ErrorPolicy
    from simulator.model.generate import write_generated

    expected = io.BytesIO()
    workload = generate(model, **kw)
    native.write(workload, expected)
    path = tmp_path / "g.jsonl"
    counts = write_generated(model, path, **kw)
    assert path.read_bytes() == expected.getvalue()
    assert counts == workload.counts()
    assert workload.counts()[2] > 0  # sub-tasks are covered
    assert b'"hash_keep"' in path.read_bytes()
    assert native.read(path, ErrorPolicy()).tasks == workload.tasks


def test_generated_ids_are_fresh_across_tasks_and_sub_tasks(model):
    w = generate(model, tasks=150, seed=8)
    first_use: dict = {}
    for task in w.all_tasks():
        prev: tuple = ()
        for call in task.calls:
            shared = native.common_prefix(call.hash_ids, prev)
            for h in call.hash_ids[shared:]:
                assert h not in first_use  # every id after the shared prefix is new to the workload
                first_use[h] = task.id
            prev = call.hash_ids
    assert min(first_use) == 1 and max(first_use) == len(first_use)  # one counter, no gaps


def test_tasks_of_all_classes_start_in_arrival_order(model):
    """The SimPy arrival processes of two classes interleave: tasks come out in arrival order over
    both classes, ids follow that order, and each class keeps its share of the rate."""
    agent = model.classes["agent"]
    two = model.model_copy(update={"classes": {
        "agent": agent.model_copy(update={"share": 0.75}),
        "batch": agent.model_copy(update={"share": 0.25}),
    }})
    w = generate(two, duration=200.0, seed=3, rate=2.0)
    arrivals = [t.arrival for t in w.tasks]
    assert arrivals == sorted(arrivals)
    assert [t.id for t in w.tasks] == sorted(t.id for t in w.tasks)
    classes = [t.task_class for t in w.tasks]
    assert classes.count("batch") / len(classes) == pytest.approx(0.25, abs=0.08)
    # Interleaved, not one class after the other.
    switches = sum(a != b for a, b in zip(classes, classes[1:]))
    assert switches > 20
    assert generate(two, duration=200.0, seed=3, rate=2.0) == w


@pytest.mark.parametrize("buckets, first", [(POSITION_BUCKETS, 0), (LENGTH_BUCKETS, 1)])
def test_generate_puts_calls_in_the_buckets_fit_fitted_them_in(buckets, first):
    values = np.arange(first, 2 * max(buckets) + 2)
    assert _buckets_of(np.asarray(buckets), values).tolist() == [bucket_of(int(v), buckets) for v in values]
