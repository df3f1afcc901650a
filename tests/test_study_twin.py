"""Studies on the twin: a study of two profiles end to end (reference run, sweep, capacity search, cost,
ranking, study.json), the live vLLM study run on the twin only (`--twin`), a config space searched on
the twin with its best two run live on the emulator, and the shipped study files."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from simulator.cli import main as cli_main
from simulator.sim.profile import load_profile
from simulator.sim.shapes import fixed_shape_throughput
from simulator.study import schema
from simulator.study.configs import resolve
from simulator.study.model import STUDY_VERSION

ROOT = Path(__file__).resolve().parents[1]

TWIN_STUDY = """\
name: twin-pair
scenario: {scenario}
set: [workload.transforms.gap_cap=0]
slo:
  task_s: {{p50: 1.5}}
  ttft_ms: {{p95: 250}}
configs:
  base: {{name: wide, profile: tiny-vllm-cpu}}
  variants:
    - {{name: narrow, overlay: {{scheduler: {{max_num_seqs: 1}}}}}}
load: {{axis: rate, points: [1, 4]}}
capacity: {{low: 1, high: 4, precision: 0.05, repeats: 2}}
repeats: 2
reference: {{label: 64/32 x 8, synthetic: {{input_tokens: 64, output_tokens: 32, concurrency: 8, calls: 32}}}}
cost: {{gpu_hour: 2.0, gpus: 2, api: {{input: 3.0, cached_input: 0.3, output: 15.0}}}}
"""


def run(args: list[str]) -> tuple[int, dict]:
    code = cli_main(args)
    out = Path(args[args.index("-o") + 1])
    return code, json.loads((out / "study.json").read_text())


def test_twin_study_of_two_profiles(tmp_path, capsys):
    path = tmp_path / "study.yaml"
    path.write_text(TWIN_STUDY.format(scenario=ROOT / "scenarios" / "vllm" / "claude-code.yaml"))
    code, study = run(["study", str(path), "-o", str(tmp_path / "out"), "--html", "--csv", str(tmp_path / "csv")])
    assert code == 0 and study["complete"] and study["agentload_study"] == STUDY_VERSION
    # the study command writes the study's report files as run and simulate write theirs
    page = (tmp_path / "out" / "report.html").read_text()
    assert "<svg" in page and "narrow" in page and (tmp_path / "csv" / "study_points.csv").exists()
    wide, narrow = study["configs"]
    assert narrow["differs_by"] == "scheduler.max_num_seqs=1" and narrow["kind"] == "twin"
    # the reference run is the fixed-shape benchmark of the twin (sim.shapes) by another road
    shape = fixed_shape_throughput(load_profile("tiny-vllm-cpu"), 8, 64, 32, rounds=4)
    assert wide["reference"]["output_tokens_per_s"] == pytest.approx(shape.output_tokens_per_s, rel=0.01)
    assert wide["reference"]["label"] == "64/32 x 8"
    # sweep: each load run twice (repeat seeds 0 and 1), the same tasks at each rate
    assert [(r["load"], r["repeats"]) for r in wide["sweep"]] == [(1, 2), (4, 2)]
    seeds = {p["seed"] for p in wide["points"] if p["source"] == "sweep"}
    assert seeds == {0, 1}
    completed = {p["tasks_completed"] for p in wide["points"] if p["source"] == "sweep"}
    assert completed == {7}
    # capacity: one search per repeat, the CI around the estimate, per minute as well
    for c in (wide, narrow):
        cap = c["capacity"]
        assert len(cap["repeats"]) == 2
        if cap["rate_per_s"] is not None:
            low, high = cap["ci_per_s"]
            assert low <= cap["rate_per_s"] <= high and cap["per_min"] == pytest.approx(cap["rate_per_s"] * 60)
    # one sequence at a time carries fewer sessions within the SLO
    assert study["ranking"]["order"] == ["wide", "narrow"]
    assert wide["rank"] == 1 and narrow["rank"] == 2
    # cost: 2 GPUs at $2/h over the tasks per hour at the capacity; the API price from the tokens
    cost = narrow["cost"]
    assert cost["self_hosted_per_task"] == pytest.approx(4.0 / (narrow["capacity"]["rate_per_s"] * 3600))
    assert cost["api_per_task"] > 0 and cost["utilisation_source"] == "twin engine busy share"
    assert 0 < cost["utilisation"] <= 1
    assert wide["quality"] is None and wide["gpu"]["available"] is False
    assert "ranking: wide > narrow" in capsys.readouterr().out


def test_the_live_vllm_study_runs_on_the_twin(tmp_path, capsys):
    code, study = run(["study", str(ROOT / "studies" / "vllm-cpu.yaml"), "--twin", "-o", str(tmp_path / "out")])
    assert code == 0
    names = [c["name"] for c in study["configs"]]
    assert names == ["default", "max-num-seqs-2"]  # bfloat16 changes only a flag: no twin equivalent
    assert all(c["kind"] == "twin" for c in study["configs"])
    printed = capsys.readouterr()
    assert "bfloat16: left out on the twin" in printed.err
    assert study["ranking"]["order"] == ["default", "max-num-seqs-2"]
    default, narrow = study["configs"]
    # 14 sessions: at the highest rates they arrive as one burst, which tests no sustained rate; the
    # default held at every rate they could test, so its capacity is a lower bound at a testable rate,
    # not the 128/s the search reached (460,800 tasks/h before)
    cap = default["capacity"]
    assert cap["status"] == "above_range" and cap["rate_per_s"] is None and cap["untestable_from_per_s"] is not None
    assert default["objective"]["bound"] == "at_least" and default["objective"]["value"] == cap["at_least_per_s"] * 3600
    bursts = [p for p in default["points"] if p["verdict"] == "untestable"]
    assert bursts and all(not p["tests_rate"] and p["sustained_tasks_per_hour"] is None for p in bursts)
    assert all(p["load"] <= cap["untestable_from_per_s"] for p in default["points"] if p["verdict"] == "held")
    # one repeat: no confidence interval, no significance claimed, the bisection's resolution said
    assert narrow["capacity"]["ci_per_s"] is None and narrow["objective"]["ci"] is None
    assert narrow["capacity"]["resolution_per_s"] > 0
    (comparison,) = study["ranking"]["comparisons"]
    assert comparison["tested"] is False and comparison["significant"] is None
    assert "not tested for significance" in printed.out and "within noise" not in printed.out
    assert "no confidence interval; the bisection placed it to ±" in printed.out
    # the table's throughput is no offered rate: the highest sweep rate's runs' own
    assert default["throughput_tasks_per_hour"] < default["offered_tasks_per_hour"]
    # --fail-on-slo (the same folder: every point read back): max-num-seqs-2 missed at the ranking load
    assert cli_main(["study", str(ROOT / "studies" / "vllm-cpu.yaml"), "--twin", "-o", str(tmp_path / "out"),
                     "--fail-on-slo"]) == 4
    assert "SLO missed: max-num-seqs-2 at 32" in capsys.readouterr().err


def test_set_repeats_reaches_the_capacity_searches(tmp_path, capsys):
    path = tmp_path / "study.yaml"
    path.write_text(TWIN_STUDY.format(scenario=ROOT / "scenarios" / "vllm" / "claude-code.yaml")
                    .replace("  variants:\n    - {name: narrow, overlay: {scheduler: {max_num_seqs: 1}}}\n", "")
                    .replace("load: {axis: rate, points: [1, 4]}\n", "").replace("reference: {label", "#"))
    code, study = run(["study", str(path), "-o", str(tmp_path / "out"), "--set", "repeats=1"])
    assert code == 0 and study["repeats"] == 1 and study["capacity_repeats"] == 1
    assert len(study["configs"][0]["capacity"]["repeats"]) == 1  # the file's capacity.repeats: 2 overridden
    assert any("capacity.repeats 2 overridden" in note for note in study["notes"])
    assert "capacity.repeats 2 overridden" in capsys.readouterr().err


SPACE_STUDY = """\
name: space
workload:
  synthetic: {{input_tokens: 16, output_tokens: 4, concurrency: 40, calls: 40}}
  stagger: 0.05
slo:
  task_s: {{p50: 0.3}}
configs:
  base:
    name: emu
    server:
      argv: [{python}, -m, simulator, serve-emulator, --port, "{{port}}", --decode-base, "0.025", --decode-per-seq, "0",
             --prefill-per-token, "0"]
      startup_timeout: 60
load: {{axis: rate, points: [20]}}
space:
  profile: {profile}
  grid: {{scheduler.max_num_seqs: [1, 2, 8]}}
  args: {{scheduler.max_num_seqs: "--max-num-seqs {{value}}"}}
  top_k: 2
"""

FIXED_STEP = """\
name: fixed-step
scheduler: {max_num_seqs: 4, max_num_batched_tokens: 8192, max_model_len: 4096}
kv_cache: {block_size: 16, num_blocks: 100000, enable_prefix_caching: false}
step_time: {fixed: 0.025}
"""


def test_config_space_on_the_twin_then_its_best_live(tmp_path):
    profile = tmp_path / "fixed.yaml"
    profile.write_text(FIXED_STEP)
    path = tmp_path / "study.yaml"
    path.write_text(SPACE_STUDY.format(python=sys.executable, profile=profile))
    code, study = run(["study", str(path), "-o", str(tmp_path / "out"), "--html"])
    assert code == 0
    space = study["space"]
    ranks = {c["settings"]["scheduler.max_num_seqs"]: c["predicted_rank"] for c in space["candidates"]}
    assert ranks[1] == 3  # one seat at 20 calls a second of 0.1 s each: the queue grows
    top = [entry["name"] for entry in space["live"]]
    assert len(top) == 2 and all(entry["measured_rank"] in (1, 2) for entry in space["live"])
    live = {c["name"]: c for c in study["configs"]}
    assert set(top) <= set(live)  # the best two ran live, the base's server with their flags
    for name in top:
        assert live[name]["differs_by"].startswith("--max-num-seqs ")
        assert live[name]["server"]["starts"] == 1
    # each one's predicted value beside its measured one, and how far the twin's order is the measured one
    predicted = {c["name"]: c["predicted_value"] for c in space["candidates"]}
    for entry in space["live"]:
        assert entry["predicted_value"] == predicted[entry["name"]] and entry["unit"] == "tasks/h"
        assert entry["measured_value"] == live[entry["name"]]["objective"]["value"]
    correlation = space["rank_correlation"]
    assert correlation["n"] == 2 and correlation["objective"] == "goodput" and correlation["statement"]
    page = (tmp_path / "out" / "report.html").read_text()
    assert "the twin&#39;s prediction against the live runs" in page or "the twin's prediction against the live runs" in page
    assert correlation["statement"].replace("'", "&#39;") in page or correlation["statement"] in page


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "studies").glob("*.yaml")))
def test_shipped_study_files_are_valid(name):
    spec = schema.load(ROOT / "studies" / name)
    configs = resolve(spec)
    assert configs[0].is_base and len({c.name for c in configs}) == len(configs)
    if spec.scenario:
        assert (spec.base_dir() / spec.scenario).resolve().is_file()


def test_the_synthetic_workload_in_a_plain_scenario(tmp_path):
    from simulator import scenario as sc

    text = "workload: {synthetic: {input_tokens: 512, output_tokens: 64, concurrency: 4, calls: 10}}\n"
    workload = sc.load_workload(sc.parse(text, "s.yaml"))
    # four closed-loop streams arriving at once, the ten calls spread 3/3/2/2, no prefix sharing
    assert [len(t.calls) for t in workload.tasks] == [3, 3, 2, 2]
    assert {t.arrival for t in workload.tasks} == {0.0}
    assert all(c.hash_ids == () and (c.input_tokens, c.output_tokens) == (512, 64) for c in workload.all_calls())
    path = tmp_path / "s.yaml"
    path.write_text(text)
    assert cli_main(["simulate", str(path), "-p", "tiny-vllm-cpu", "-o", str(tmp_path / "sim")]) == 0
    summary = json.loads((tmp_path / "sim" / "summary.json").read_text())
    assert summary["completed"] == 10 and summary["total_output_tokens"] == 640
    assert summary.get("total_cached_tokens", 0) == 0  # every prompt unique


async def test_the_studys_calibration_records_the_rounds_trend(tmp_path, monkeypatch):
    import asyncio

    from simulator.emulator.server import run_emulator
    from simulator.live.client import Target
    from simulator.calibration.sweep import design_sweep
    from simulator.study import calibration

    base = load_profile("tiny-vllm-cpu")
    # the sweep's bursts of up to two (as `calibrate --max-concurrency 2`), without the points that pause
    # before they are sent: what is checked here is the rounds' trend, not the fit
    monkeypatch.setattr(calibration, "design_sweep", lambda profile, **limits: [
        p for p in design_sweep(profile, max_concurrency=2, **limits) if not p.idle])
    async with run_emulator(prefill_per_token=2e-5, decode_base=0.004, decode_per_seq=0.0005) as url:
        profile = await asyncio.to_thread(calibration.calibrate, Target(base_url=url), base, tmp_path,
                                          repeat=3, max_prompt=64)
    drift = profile.calibration.drift
    assert drift is not None and abs(drift) < 0.5  # three rounds: a trend, of an emulator's steady times
    assert f"rounds' trend {drift:+.1%}" in profile.source
    assert f"{drift:+.1%}" in (tmp_path / "report.txt").read_text().splitlines()[-1]
    assert calibration.saved(tmp_path).calibration.drift == pytest.approx(drift)
