"""The config space searched by Optuna's TPE sampler (`space.method: tpe`) on the twin: the study file's
errors, the search's budget and determinism, candidates the server would not start, a study resumed
without simulating again what it ran, the Pareto front of several objectives, and the rank correlation
of the twin's predictions with the live measurements."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

from simulator.cli import main as cli_main
from simulator.errors import InputError
from simulator.study import feasible, schema, search
from simulator.study.backends import TwinBackend
from simulator.study.model import SpaceLive
from simulator.study.space_result import rank_correlation

pytest.importorskip("optuna")

# One step takes 25 ms whatever runs in it: a call of 4 output tokens holds a seat for 4 steps, so the
# twin completes at most max_num_seqs / 0.1 calls a second. max_model_len 1024 needs 64 blocks of 16.
FIXED_STEP = """\
name: fixed-step
scheduler: {max_num_seqs: 4, max_num_batched_tokens: 8192, max_model_len: 1024}
kv_cache: {block_size: 16, num_blocks: 100000, enable_prefix_caching: false}
step_time: {fixed: 0.025}
"""

# 40 one-call tasks, 20 a second: each candidate is one short simulation of its sweep point
STUDY = """\
name: search
workload:
  synthetic: {{input_tokens: 16, output_tokens: 4, concurrency: 40, calls: 40}}
  stagger: 0.05
slo:
  task_s: {{p50: 0.3}}
configs:
  base: {{name: base, profile: {profile}}}
load: {{axis: rate, points: [20]}}
space:
  method: tpe
  settings:
    scheduler.max_num_seqs: {{low: 1, high: 8}}
    kv_cache.num_blocks: {{low: 32, high: 128, step: 32}}
  budget: {budget}
  seed: 3
  top_k: 2
"""


@pytest.fixture
def profile(tmp_path) -> Path:
    path = tmp_path / "fixed.yaml"
    path.write_text(FIXED_STEP)
    return path


def write_study(tmp_path: Path, profile: Path, budget: int = 6, extra: str = "", name: str = "study.yaml") -> Path:
    path = tmp_path / name
    path.write_text(STUDY.format(profile=profile, budget=budget) + extra)
    return path


def run(path: Path, out: Path, *more: str) -> tuple[int, dict]:
    code = cli_main(["study", str(path), "-o", str(out), *more])
    return code, json.loads((out / "study.json").read_text())


def error_of(text: str, tmp_path: Path) -> InputError:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as caught:
        schema.load(path)
    return caught.value


# --- the study file ---------------------------------------------------------------------------------


def test_a_space_file_s_mistakes_name_the_file_line_and_field(tmp_path, profile):
    good = STUDY.format(profile=profile, budget=6)
    misspelt = error_of(good.replace("scheduler.max_num_seqs:", "scheduler.max_num_seq:"), tmp_path)
    assert misspelt.file.endswith("bad.yaml") and misspelt.line == 13
    assert misspelt.path == "space.settings.scheduler.max_num_seq" and "did you mean `scheduler.max_num_seqs`" in str(misspelt)

    reversed_range = error_of(good.replace("{low: 1, high: 8}", "{low: 8, high: 1}"), tmp_path)
    assert reversed_range.line == 13 and reversed_range.path == "space.settings.scheduler.max_num_seqs"
    assert "high must be above low" in str(reversed_range)

    not_whole = error_of(good.replace("{low: 1, high: 8}", "{low: 1.5, high: 8}"), tmp_path)
    assert not_whole.path == "space.settings" and "scheduler.max_num_seqs takes whole numbers" in str(not_whole)

    out_of_field = error_of(good.replace("{low: 1, high: 8}", "{low: 0, high: 8}"), tmp_path)
    assert "scheduler.max_num_seqs: 0.0: Input should be greater than or equal to 1" in str(out_of_field)

    off_step = error_of(good.replace("step: 32", "step: 30"), tmp_path)
    assert off_step.path == "space.settings.kv_cache.num_blocks" and "multiple of step 30" in str(off_step)

    flag_range = error_of(good.replace("kv_cache.num_blocks: {low: 32, high: 128, step: 32}",
                                       "scheduler.async_scheduling: {low: 0, high: 1}"), tmp_path)
    assert "scheduler.async_scheduling is no number: give its choices as a list" in str(flag_range)

    no_budget = error_of(good.replace("  budget: 6\n", ""), tmp_path)
    assert no_budget.line == 10 and no_budget.path == "space" and "needs `settings` and `budget`" in str(no_budget)

    grid_budget = error_of(good.replace("method: tpe", "method: grid").replace("  settings:", "  grid: {scheduler.max_num_seqs: [1, 2]}\n  settings:"), tmp_path)
    assert "settings and budget: for `method: tpe`" in str(grid_budget)

    one_objective = error_of(good + "  objectives: [goodput]\n", tmp_path)
    assert "objectives: two or more different ones" in str(one_objective)


def test_an_objective_the_study_cannot_measure_is_refused_before_anything_runs(tmp_path, profile, capsys):
    path = write_study(tmp_path, profile, extra="  objectives: [goodput, cost]\n")
    assert cli_main(["study", str(path), "-o", str(tmp_path / "out")]) == 2
    assert "study.yaml:18: at space.objectives: objective cost needs cost.gpu_hour" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_without_optuna_the_study_says_how_to_install_it(tmp_path, profile, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "optuna", None)
    code = cli_main(["study", str(write_study(tmp_path, profile)), "-o", str(tmp_path / "out")])
    assert code == 2
    err = capsys.readouterr().err
    assert "pip install 'agentload[search]'" in err and "study.yaml:11" in err


# --- what the server would not start --------------------------------------------------------------------


def test_what_the_server_would_not_start_is_infeasible():
    fits, none = feasible.profile_of("tiny-vllm-cpu", {})
    assert fits is not None and none is None
    _, pool = feasible.profile_of("tiny-vllm-cpu", {"kv_cache": {"num_blocks": 8}})
    assert "max_model_len 4096 exceeds the KV cache (8 blocks of 128 tokens)" in pool.reason and pool.violation == 1
    _, budget = feasible.profile_of("tiny-vllm-cpu", {"scheduler": {"max_num_seqs": 4096}})
    assert "max_num_batched_tokens 2,048 is below max_num_seqs 4,096" in budget.reason and budget.violation == 1
    # a hybrid model: each decoding sequence takes a block of Mamba state; 2e10 bytes hold 586 blocks
    _, mamba = feasible.profile_of("gb300-nemotron-super-default",
                                   {"kv_cache": {"memory_bytes": 2e10}, "scheduler": {"max_num_seqs": 1024}})
    assert "max_num_seqs 1,024 exceeds the pool's 586 blocks" in mamba.reason
    assert mamba.violation == pytest.approx((1024 - 586) / 586)
    running, fine = feasible.profile_of("gb300-nemotron-super-mtp3", {})  # starts, whatever it runs at once
    assert running is not None and fine is None


# --- the search ---------------------------------------------------------------------------------------


def searched(tmp_path: Path, space_yaml: str, objective, folder: str = "s") -> tuple[list[str], list[str]]:
    """A search of `space_yaml` against a made-up objective: (the trials' names, the candidates evaluated)."""
    spec = schema.parse(space_yaml, str(tmp_path / "s.yaml"))
    evaluated: list[str] = []
    trials: list[str] = []

    def evaluate(batch):
        out = []
        for candidate in batch:
            evaluated.append(candidate.name)
            value = objective(candidate.settings)
            out.append(value if isinstance(value, search.Outcome) else search.Outcome(values=(value,)))
        return out

    search.run(spec.space, ["goodput"], evaluate, tmp_path / folder, asked=lambda c: trials.append(c.name))
    return trials, evaluated


SPACE_ONLY = """\
workload: {synthetic: {input_tokens: 16, output_tokens: 4, concurrency: 4, calls: 4}}
configs: {base: {name: b, profile: tiny-vllm-cpu}}
load: {axis: rate, points: [1]}
space:
  method: tpe
  settings:
    scheduler.max_num_seqs: {low: 1, high: 64}
    scheduler.max_num_batched_tokens: [512, 1024, 2048, 4096]
  budget: 20
  seed: 5
"""


def peak(settings) -> float:
    """Best at 24 seats and 2,048 tokens a step."""
    return 100 - abs(settings["scheduler.max_num_seqs"] - 24) - abs(settings["scheduler.max_num_batched_tokens"] - 2048) / 64


def test_the_search_spends_its_budget_once_per_candidate_and_repeats_itself(tmp_path):
    trials, evaluated = searched(tmp_path, SPACE_ONLY, peak)
    assert len(evaluated) == 20 == len(set(evaluated))  # the budget: candidates evaluated, each once
    assert len(trials) >= 20 and set(trials) == set(evaluated)  # a candidate proposed again is not evaluated
    log = [json.loads(line) for line in (tmp_path / "s" / search.LOG_FILE).read_text().splitlines()]
    assert [entry["trial"] for entry in log] == list(range(len(trials)))
    assert all(isinstance(e["settings"]["scheduler.max_num_seqs"], int) for e in log)
    # the same seed asks the same candidates; another seed others
    assert searched(tmp_path, SPACE_ONLY, peak, "again") == (trials, evaluated)
    assert searched(tmp_path, SPACE_ONLY.replace("seed: 5", "seed: 6"), peak, "other")[1] != evaluated


def test_the_sampler_learns_where_the_best_is(tmp_path):
    _, evaluated = searched(tmp_path, SPACE_ONLY.replace("budget: 20", "budget: 40"), peak)
    values = sorted(peak(dict(zip(("scheduler.max_num_seqs", "scheduler.max_num_batched_tokens"),
                                  (int(n.split("-")[2].split(".")[0]), int(n.split("-")[-1]))))) for n in evaluated)
    # 3 of the 256 candidates are within 1 of the best (100): 40 random picks find one with probability 0.40
    assert values[-1] >= 99


def test_infeasible_candidates_cost_no_budget(tmp_path):
    def refuse_big(settings):
        if settings["scheduler.max_num_seqs"] > 32:
            return search.Outcome(infeasible=feasible.Infeasible("too many", settings["scheduler.max_num_seqs"] / 32 - 1))
        return peak(settings)

    trials, evaluated = searched(tmp_path, SPACE_ONLY, refuse_big)
    big = [n for n in evaluated if int(n.split("-")[2].split(".")[0]) > 32]
    assert big and len(evaluated) == 20 + len(big)  # 20 simulated, besides the infeasible ones


def test_a_space_of_few_candidates_ends_when_all_were_tried(tmp_path):
    few = SPACE_ONLY.replace("{low: 1, high: 64}", "[1, 2]").replace("[512, 1024, 2048, 4096]", "[2048]")
    trials, evaluated = searched(tmp_path, few, peak)
    assert sorted(evaluated) == sorted(set(trials)) and len(evaluated) == 2


def test_the_pareto_front():
    values = {"a": [10.0, 5.0], "b": [8.0, 3.0], "c": [10.0, 6.0], "d": [7.0, 4.0], "e": [None, 1.0]}
    # goodput higher is better, p95 lower: a beats c (same goodput, faster); d is beaten by b
    assert search.pareto_front(values, ["goodput", "p95_task"]) == ["a", "b"]
    assert search.pareto_front(values, ["goodput", "goodput"]) == ["c"]  # both higher: c beats a


def test_the_rank_correlation_says_what_it_rests_on():
    def live(*pairs):
        return [SpaceLive(name=f"c{i}", predicted_value=p, measured_value=m) for i, (p, m) in enumerate(pairs)]

    two = rank_correlation(live((10, 4), (8, 3)), "goodput")
    assert two.rho == 1 and two.n == 2 and "with 2 candidates it is only their order" in two.statement
    swapped = rank_correlation(live((10, 3), (8, 4)), "goodput")
    assert swapped.rho == -1 and "reverse of the measured order" in swapped.statement
    three = rank_correlation(live((10, 4), (8, 5), (6, 1)), "goodput")
    assert three.rho == pytest.approx(0.5) and "+0.50 over 3 candidates" in three.statement
    assert rank_correlation(live((10, 4), (None, 5)), "goodput").rho is None
    bounded = live((10, 4), (8, 3))
    bounded[0].measured_bound = "at_least"  # at least 4 above 3: the order holds
    assert "unsettled" not in rank_correlation(bounded, "goodput").statement
    bounded[1].measured_bound = "at_least"  # at least 3 may pass 4
    assert "c0, c1: a value that only bounds the figure" in rank_correlation(bounded, "goodput").statement
    assert "all equal" in rank_correlation(live((10, 4), (10, 5)), "goodput").statement


# --- on the twin, end to end -------------------------------------------------------------------------


def test_a_search_on_the_twin_reports_its_candidates_and_infeasible_ones(tmp_path, profile):
    code, study = run(write_study(tmp_path, profile), tmp_path / "out", "--csv", str(tmp_path / "csv"))
    assert code == 0 and study["complete"]
    space = study["space"]
    assert space["method"] == "tpe" and space["budget"] == 6 and space["evaluations"] == 6
    assert space["space_size"] == 8 * 4 and space["objectives"] == ["goodput"]
    infeasible = [c for c in space["candidates"] if c["infeasible"]]
    assert all(c["settings"]["kv_cache.num_blocks"] == 32 and "exceeds the KV cache" in c["infeasible"]
               for c in infeasible)
    assert space["infeasible"] == len(infeasible)
    assert not any((tmp_path / "out" / "twin" / "space" / c["name"]).exists() for c in infeasible)
    ran = [c for c in space["candidates"] if not c["infeasible"]]
    assert len(ran) == 6 and sorted(c["predicted_rank"] for c in ran) == list(range(1, 7))
    best = min(ran, key=lambda c: c["predicted_rank"])
    assert best["predicted_value"] == max(c["predicted_value"] for c in ran)
    assert space["live"] == []  # a twin base: nothing runs live
    # the CSV holds the same candidates, one row each, with study.json's values
    with open(tmp_path / "csv" / "study_space.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["candidate"] for r in rows] == [c["name"] for c in space["candidates"]]
    assert [r["infeasible"] for r in rows] == [c["infeasible"] or "" for c in space["candidates"]]
    assert [r["predicted_value"] for r in rows] == [repr(c["predicted_value"]) if c["predicted_value"] is not None
                                                    else "" for c in space["candidates"]]


def test_a_search_resumed_simulates_nothing_it_ran(tmp_path, profile, monkeypatch):
    path = write_study(tmp_path, profile)
    _, whole = run(path, tmp_path / "whole")

    simulated: list[str] = []
    real = TwinBackend.run_point

    def counted(self, scenario, workload, folder):
        simulated.append(str(folder))
        if len(simulated) == 4:
            raise KeyboardInterrupt  # the study stopped during its fourth simulation
        return real(self, scenario, workload, folder)

    monkeypatch.setattr(TwinBackend, "run_point", counted)
    assert cli_main(["study", str(path), "-o", str(tmp_path / "out")]) == 130
    before = list(simulated)
    simulated.clear()
    monkeypatch.setattr(TwinBackend, "run_point", lambda self, s, w, f: (simulated.append(str(f)), real(self, s, w, f))[1])
    code, again = run(path, tmp_path / "out")
    assert code == 0
    # the three points that finished were read back; the fourth and the rest ran
    assert not set(before[:3]) & set(simulated) and before[3] in simulated
    # and the search asked what it would have asked without the stop
    assert [c["name"] for c in again["space"]["candidates"]] == [c["name"] for c in whole["space"]["candidates"]]
    assert again["space"]["trials"] == whole["space"]["trials"]

    # a last line cut short by a stop is dropped; the rest is read back, nothing simulated again
    log = tmp_path / "out" / search.LOG_FILE
    lines = log.read_text().splitlines()
    log.write_text("\n".join(lines) + '\n{"trial": ' + str(len(lines)) + ', "sett')
    simulated.clear()
    code, third = run(path, tmp_path / "out")
    assert code == 0 and simulated == [] and third["space"]["candidates"] == again["space"]["candidates"]
    assert log.read_text().splitlines() == lines


PARETO = """\
  objectives: [goodput, p95_task]
"""


def test_several_objectives_give_the_pareto_front(tmp_path, profile):
    code, study = run(write_study(tmp_path, profile, budget=8, extra=PARETO), tmp_path / "out")
    assert code == 0
    space = study["space"]
    assert space["objectives"] == ["goodput", "p95_task"] and space["front"]
    ran = {c["name"]: c for c in space["candidates"] if not c["infeasible"]}
    values = {n: (c["predicted_values"]["goodput"], c["predicted_values"]["p95_task"]) for n, c in ran.items()}
    for name, (goodput, p95) in values.items():
        beaten = any(g >= goodput and p <= p95 and (g, p) != (goodput, p95) for g, p in values.values())
        assert ran[name]["on_front"] is (not beaten)
    assert set(space["front"]) == {n for n, c in ran.items() if c["on_front"]}
    goodputs = [values[n][0] for n in space["front"]]
    assert goodputs == sorted(goodputs, reverse=True)  # best first by the first objective


LIVE = """\
name: search-live
workload:
  synthetic: {{input_tokens: 16, output_tokens: 4, concurrency: 20, calls: 20}}
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
  method: tpe
  profile: {profile}
  settings:
    scheduler.max_num_seqs: [1, 8]
  args: {{scheduler.max_num_seqs: {{1: "--max-num-seqs 1", 8: ""}}}}
  budget: 2
"""


def test_a_candidate_that_adds_no_flag_is_measured_by_the_base_s_run(tmp_path, profile):
    path = tmp_path / "study.yaml"
    path.write_text(LIVE.format(python=sys.executable, profile=profile))
    code, study = run(path, tmp_path / "out")
    assert code == 0
    configs = {c["name"]: c for c in study["configs"]}
    # eight seats is the emulator's server as the base runs it: no second server of it
    assert list(configs) == ["emu", "space-max_num_seqs-1"] and configs["space-max_num_seqs-1"]["server"]["starts"] == 1
    live = {entry["name"]: entry for entry in study["space"]["live"]}
    assert live["space-max_num_seqs-8"]["config"] == "emu" and live["space-max_num_seqs-1"]["config"] == "space-max_num_seqs-1"
    for entry in live.values():
        assert entry["measured_value"] == configs[entry["config"]]["objective"]["value"]
    assert sorted(entry["measured_rank"] for entry in live.values()) == [1, 2]
