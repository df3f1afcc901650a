"""`agentload fit`, `generate` and `transform` end to end on a small native trace."""

import numpy as np
import pytest
import yaml

from simulator.cli import main
from simulator.traces import load, native
from simulator.workload import Call, Task, Workload


def _trace(path, n=60, same_arrival=False):
    rng = np.random.default_rng(0)
    tasks = []
    for i in range(n):
        calls, chain = [], ()
        for k in range(int(rng.integers(2, 6))):
            fresh = int(rng.integers(1, 20))
            chain = chain + tuple(range(100000 * i + 1000 * k, 100000 * i + 1000 * k + fresh))
            calls.append(Call(input_tokens=len(chain) * 8, output_tokens=int(rng.integers(5, 300)),
                              gap=0.0 if k == 0 else float(rng.lognormal(1, 1)), hash_ids=chain, block_size=8))
        tasks.append(Task(id=f"t{i}", calls=tuple(calls), arrival=0.0 if same_arrival else float(i * 1.5)))
    native.write(Workload(tuple(tasks)), path)


def test_fit_generate_transform(tmp_path, capsys):
    trace, model, out1, out2 = (tmp_path / n for n in ("t.jsonl", "m.yaml", "a.jsonl", "b.jsonl"))
    _trace(trace)
    assert main(["fit", str(trace), "-o", str(model)]) == 0
    assert "arrivals:" in capsys.readouterr().out
    assert yaml.safe_load(model.read_text())["agentload_model"] == 1
    assert main(["generate", str(model), "--tasks", "25", "--seed", "7", "-o", str(out1)]) == 0
    assert main(["generate", str(model), "--tasks", "25", "--seed", "7", "-o", str(out2)]) == 0
    assert out1.read_bytes() == out2.read_bytes()
    assert len(out1.read_text().splitlines()) == 26
    small = tmp_path / "s.jsonl"
    assert main(["transform", str(out1), "-o", str(small), "--sample", "5", "--gap-cap", "1"]) == 0
    lines = small.read_text().splitlines()
    assert len(lines) == 6


def test_bad_input_exits_2_with_the_place(tmp_path, capsys):
    trace, model = tmp_path / "t.jsonl", tmp_path / "m.yaml"
    _trace(trace, same_arrival=True)
    assert main(["fit", str(trace), "-o", str(model)]) == 0
    assert main(["generate", str(model), "--tasks", "5", "-o", str(tmp_path / "g.jsonl")]) == 2
    assert "--rate" in capsys.readouterr().err
    data = yaml.safe_load(model.read_text())
    data["classes"]["default"]["structure"]["block_size"] = -4
    model.write_text(yaml.safe_dump(data))
    assert main(["generate", str(model), "--tasks", "5", "--rate", "1", "-o", str(tmp_path / "g.jsonl")]) == 2
    assert "$.classes.default.structure.block_size" in capsys.readouterr().err
    assert main(["fit", str(trace), "-o", str(model), "--one-class"]) == 0
    tiny = tmp_path / "tiny.jsonl"
    _trace(tiny, n=5)
    assert main(["fit", str(tiny), "-o", str(model)]) == 2
    assert "--allow-fallback" in capsys.readouterr().err
    assert main(["fit", str(tiny), "-o", str(model), "--allow-fallback"]) == 0


def _arrival_gaps(path):
    return np.diff(sorted(t.arrival for t in load([path]).tasks))


def test_generate_burstiness_sets_the_gaps_coefficient_of_variation(tmp_path, capsys):
    trace, model = tmp_path / "t.jsonl", tmp_path / "m.yaml"
    _trace(trace)
    assert main(["fit", str(trace), "-o", str(model)]) == 0
    plain = tmp_path / "plain.jsonl"
    assert main(["generate", str(model), "--tasks", "4000", "--seed", "2", "-o", str(plain)]) == 0
    fitted_mean_gap = _arrival_gaps(plain).mean()
    for burstiness in (0.25, 4.0):
        out = tmp_path / f"b{burstiness}.jsonl"
        args = ["generate", str(model), "--tasks", "4000", "--seed", "2", "--burstiness", str(burstiness)]
        assert main([*args, "-o", str(out)]) == 0
        gaps = _arrival_gaps(out)
        assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(burstiness), rel=0.08)
        assert gaps.mean() == pytest.approx(fitted_mean_gap, rel=0.1)  # at the fitted rate
        again = tmp_path / "again.jsonl"
        assert main([*args, "-o", str(again)]) == 0 and again.read_bytes() == out.read_bytes()
        # the same tasks as without the knob: only their arrivals differ
        assert [t.calls for t in load([out]).tasks] == [t.calls for t in load([plain]).tasks]
    at_rate = tmp_path / "rate.jsonl"
    assert main(["generate", str(model), "--tasks", "4000", "--rate", "5", "--burstiness", "0.5",
                 "-o", str(at_rate)]) == 0
    assert _arrival_gaps(at_rate).mean() == pytest.approx(0.2, rel=0.08)


def test_a_scenario_generates_with_burstiness(tmp_path):
    from simulator import scenario as sc

    trace, model = tmp_path / "t.jsonl", tmp_path / "m.yaml"
    _trace(trace, same_arrival=True)  # no fitted arrivals: the rate comes from the scenario
    assert main(["fit", str(trace), "-o", str(model)]) == 0
    path = tmp_path / "s.yaml"
    path.write_text("workload:\n  model: m.yaml\n  generate: {tasks: 3000, rate: 2, burstiness: 0.25, seed: 1}\n")
    gaps = np.diff(sorted(t.arrival for t in sc.load_workload(sc.load(path)).tasks))
    assert gaps.mean() == pytest.approx(0.5, rel=0.1)
    assert gaps.std() / gaps.mean() == pytest.approx(2.0, rel=0.1)
