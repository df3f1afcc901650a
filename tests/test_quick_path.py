"""`agentload run` and `simulate` without a scenario file: a trace or a workload model plus flags, and
`--save-scenario`, whose file replays the same workload."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from simulator import quick
from simulator import scenario as sc
from simulator.cli import main
from simulator.errors import InputError
from simulator.metrics import results
from simulator.traces.native import write
from simulator.workload import Call, Task, Workload

ROOT = Path(__file__).resolve().parents[1]


def trace(path: Path, n: int = 6, arrival_step: float = 0.0) -> Path:
    """`n` short tasks of three calls sharing a prefix; arrivals `arrival_step` apart (0: all at once, as
    the Claude Code sessions are)."""
    tasks = []
    for i in range(n):
        calls = tuple(Call(input_tokens=64 * (j + 2), output_tokens=4, gap=0.01 if j else 0.0,
                           hash_ids=tuple(range(1000 * i, 1000 * i + j + 2)), block_size=64) for j in range(3))
        tasks.append(Task(f"t{i}", calls, arrival=arrival_step * i))
    path.parent.mkdir(parents=True, exist_ok=True)
    write(Workload(tuple(tasks)), path)
    return path


def summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


def run_json(folder: Path) -> dict:
    return results.read_json(folder, results.RUN_FILE)


def test_a_quick_run_replays_on_the_emulator_and_its_saved_scenario_replays_the_same(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    trace(tmp_path / "data" / "w.jsonl")
    saved = tmp_path / "kept" / "mine.yaml"
    code = main(["run", "--trace", "data/w.jsonl", "--request-rate", "20", "--burstiness", "0.5",
                 "--max-concurrency", "3", "--tasks", "4", "--seed", "5", "--slo", "task_s.p90=30",
                 "--slo", "ttft_ms.p99=2000", "--no-progress", "-o", "quick", "--save-scenario", str(saved)])
    assert code == 0, capsys.readouterr().err
    first = summary(tmp_path / "quick")
    assert first["tasks"]["planned"] == 4 and first["calls"]["ok"] == 12 and first["calls"]["not_done"] == 0
    assert set(first["slo"]) >= {"task_s", "ttft_ms"}

    text = saved.read_text()
    assert text.startswith("# Scenario written by: agentload run --trace data/w.jsonl")
    data = yaml.safe_load(text)
    assert data["workload"]["trace"] == "../data/w.jsonl"  # relative to the saved file's folder
    assert data["workload"]["transforms"] == {"rate": 20.0, "burstiness": 0.5}
    assert data["run"] == {"max_in_flight": 3, "max_tasks": 4, "seed": 5}
    assert "target" not in data

    monkeypatch.chdir(tmp_path / "data")  # the saved file works from anywhere
    assert main(["run", str(saved), "--no-progress", "-o", str(tmp_path / "again")]) == 0
    again = summary(tmp_path / "again")
    assert run_json(tmp_path / "again")["fingerprint"] == run_json(tmp_path / "quick")["fingerprint"]
    for key in ("completed", "total_input_tokens", "total_output_tokens"):
        assert again[key] == first[key], key
    assert again["tasks"]["planned"] == first["tasks"]["planned"] and again["slo"].keys() == first["slo"].keys()


def test_a_quick_simulation_and_its_saved_scenario_give_the_same_summary(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trace(tmp_path / "w.jsonl", n=8, arrival_step=0.5)
    assert main(["simulate", "--trace", "w.jsonl", "-p", "tiny-vllm-cpu", "--rate-scale", "4", "--concurrency", "2",
                 "--warmup", "0.2", "--slo", "task_s.p90=5", "-o", "sim", "--save-scenario", "s.yaml"]) == 0
    assert yaml.safe_load((tmp_path / "s.yaml").read_text())["emulator"] == {"profile": "tiny-vllm-cpu"}
    assert "agentload simulate s.yaml -p tiny-vllm-cpu" in (tmp_path / "s.yaml").read_text()
    assert main(["simulate", "s.yaml", "-p", "tiny-vllm-cpu", "-o", "sim2"]) == 0
    first, again = summary(tmp_path / "sim"), summary(tmp_path / "sim2")
    for key in ("completed", "p99_ttft_ms", "mean_tpot_ms", "p90_e2el_ms", "total_output_tokens"):
        assert again[key] == first[key], key
    assert again["tasks"] == first["tasks"]
    assert run_json(tmp_path / "sim2")["fingerprint"] == run_json(tmp_path / "sim")["fingerprint"]


def test_flags_build_the_scenario_a_file_would_hold(tmp_path):
    path = trace(tmp_path / "w.jsonl")
    spec = quick.QuickSpec(traces=[str(path)], target="http://localhost:8000", served_model="m", api="chat",
                           vocab_size=1024, rate=0.5, burstiness=2.0, concurrency=8, duration=60, tasks=10, seed=3,
                           warmup=5, slo=["task_s.p90=60", "ttft_ms.p99.9=800"], gap_cap=30, name="try")
    assert quick.scenario_data(spec) == {
        "name": "try",
        "workload": {"trace": str(path), "transforms": {"rate": 0.5, "burstiness": 2.0, "gap_cap": 30}},
        "target": {"base_url": "http://localhost:8000", "model": "m", "api": "chat", "vocab_size": 1024},
        "run": {"max_in_flight": 8, "duration": 60, "max_tasks": 10, "seed": 3, "warmup": 5},
        "slo": {"task_s": {"p90": 60.0}, "ttft_ms": {"p99.9": 800.0}},
    }
    built = quick.build(spec, ["target.stall_timeout=120"])
    assert isinstance(built, sc.Scenario) and built.target.stall_timeout == 120 and built.slo.ttft_ms.p999 == 800
    model = quick.scenario_data(quick.QuickSpec(workload_model="m.yaml", rate=0.2, burstiness=0.5, tasks=50,
                                                vocab_size=1024))
    assert model["workload"] == {"model": "m.yaml", "generate": {"rate": 0.2, "burstiness": 0.5}}
    assert model["emulator"] == {"vocab_size": 1024} and model["run"] == {"max_tasks": 50}


def test_vllm_bench_serve_names_mean_the_same(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    trace(tmp_path / "w.jsonl")
    saved = {}
    for name, flags in (("ours", ["--target", "http://127.0.0.1:9", "--served-model", "m", "--rate", "2",
                                  "--concurrency", "4"]),
                        ("vllm", ["--base-url", "http://127.0.0.1:9", "--model", "m", "--request-rate", "2",
                                  "--max-concurrency", "4"])):
        # the target does not listen: the preflight fails (exit 3) after the scenario was saved
        assert main(["run", "--trace", "w.jsonl", *flags, "--seed", "1", "--save-scenario", f"{name}.yaml",
                     "--no-progress"]) == 3
        saved[name] = yaml.safe_load((tmp_path / f"{name}.yaml").read_text())
    assert saved["ours"] == saved["vllm"]
    assert saved["ours"]["target"] == {"base_url": "http://127.0.0.1:9", "model": "m"}


def test_a_scenario_file_and_flags_exclude_each_other(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    trace(tmp_path / "w.jsonl")
    (tmp_path / "s.yaml").write_text("workload: {trace: w.jsonl}\n")
    assert main(["run", "s.yaml", "--trace", "w.jsonl", "--rate", "2"]) == 2
    err = capsys.readouterr().err
    assert "s.yaml: give a scenario file or flags that describe the run, not both: --trace, --rate" in err
    assert main(["simulate", "s.yaml", "-p", "tiny-vllm-cpu", "--concurrency", "2"]) == 2
    assert "not both: --concurrency" in capsys.readouterr().err
    assert main(["run"]) == 2
    assert "a scenario file (SCENARIO), or a workload with --trace" in capsys.readouterr().err
    assert main(["run", "--rate", "2"]) == 2
    assert "--trace PATH... or --workload-model" in capsys.readouterr().err


def test_bad_flags_are_named_in_the_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    trace(tmp_path / "w.jsonl")
    cases = [
        (["--api", "chat"], "field '--api': --api applies to a --target server"),
        (["--slo", "task_s=5"], "field '--slo': expects TARGET.PERCENTILE=BOUND"),
        (["--slo", "task_s.p91=5"], "field '--slo task_s.p91': unknown key; did you mean `p99`?"),
        (["--rate", "2", "--rate-scale", "3"], "field '--rate, --rate-scale': give `rate`"),
        (["--target", "ftp://x"], "field '--target': must be an http:// or https:// URL"),
        (["--set", "run.max_taks=3"], "(from --set)"),
    ]
    for flags, expected in cases:
        assert main(["run", "--trace", "w.jsonl", *flags]) == 2, flags
        assert expected in capsys.readouterr().err, flags
    assert main(["run", "--workload-model", "m.yaml"]) == 2
    assert "--tasks N or --duration S" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["run", "--trace", "w.jsonl", "--rate", "-1"])
    assert "--rate/--request-rate: -1 is not a number above 0" in capsys.readouterr().err


def test_a_saved_scenario_keeps_no_secret(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    trace(tmp_path / "w.jsonl")
    assert main(["run", "--trace", "w.jsonl", "--target", "http://user:hunter22@127.0.0.1:9",
                 "--save-scenario", "s.yaml"]) == 2
    err = capsys.readouterr().err
    assert "credentials in the target URL" in err and "hunter22" not in err and not (tmp_path / "s.yaml").exists()
    assert main(["run", "--trace", "w.jsonl", "--target", "http://127.0.0.1:9", "--set",
                 "target.headers={X-Api-Key: hunter22}", "--save-scenario", "s.yaml"]) == 2
    assert "target.headers" in capsys.readouterr().err and not (tmp_path / "s.yaml").exists()


def test_a_scenario_file_saved_again_keeps_its_overrides_and_paths_right(tmp_path, monkeypatch):
    trace(tmp_path / "a" / "w.jsonl")
    (tmp_path / "a" / "s.yaml").write_text("name: mine\nworkload: {trace: w.jsonl}\nslo: {task_s: {p90: 9}}\n")
    monkeypatch.chdir(tmp_path)
    scenario = sc.load(tmp_path / "a" / "s.yaml", ["run.max_tasks=2"])
    quick.save(scenario, tmp_path / "b" / "c" / "t.yaml", "run a/s.yaml --set run.max_tasks=2")
    again = sc.load(tmp_path / "b" / "c" / "t.yaml")
    assert again.workload.trace == "../../a/w.jsonl" and again.run.max_tasks == 2 and again.name == "mine"
    assert sc.load_workload(again) == sc.load_workload(scenario)


def test_simulate_fails_on_a_missed_slo_and_on_failed_calls(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    trace(tmp_path / "w.jsonl")
    base = ["simulate", "--trace", "w.jsonl", "-p", "tiny-vllm-cpu", "--slo", "task_s.p90=0.001"]
    assert main([*base, "-o", "a"]) == 0
    assert main([*base, "-o", "b", "--fail-on-slo"]) == 4
    assert "SLO missed: task_s p90" in capsys.readouterr().err
    # prompts past the profile's 4096-token context fail on the twin as on vLLM
    assert main(["simulate", "--trace", "w.jsonl", "-p", "tiny-vllm-cpu", "--token-scale", "20", "-o", "c"]) == 1
    assert "call attempts failed" in capsys.readouterr().err
    assert main(["simulate", "--trace", "w.jsonl", "-p", "tiny-vllm-cpu", "--token-scale", "20", "-o", "d",
                 "--max-failed-share", "1"]) == 0


def test_the_readme_line_runs_on_the_emulator(tmp_path, monkeypatch):
    """README's one-line quick path, without --target (so on the built-in emulator), cut to two tasks of
    a twentieth of their tokens."""
    readme = (ROOT / "README.md").read_text()
    words = re.search(r"`(agentload run --trace traces/claude-code [^`]*)`", readme).group(1).split()
    assert "--target" in words and "--rate" in words
    at = words.index("--target")
    words = words[1:at] + words[at + 2:]
    monkeypatch.chdir(ROOT)
    out = tmp_path / "readme"
    assert main([*words, "--tasks", "2", "--gap-cap", "0.05", "--token-scale", "0.05", "--no-progress", "-o", str(out)]) == 0
    assert summary(out)["tasks"]["planned"] == 2


def test_an_unwritable_saved_scenario_is_bad_input(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    trace(tmp_path / "w.jsonl")
    (tmp_path / "file").write_text("")
    assert main(["run", "--trace", "w.jsonl", "--save-scenario", "file/s.yaml", "--no-progress"]) == 2
    assert "--save-scenario" in capsys.readouterr().err
    with pytest.raises(InputError):
        quick.save(quick.build(quick.QuickSpec(traces=["w.jsonl"])), tmp_path / "file" / "x.yaml", "run")
