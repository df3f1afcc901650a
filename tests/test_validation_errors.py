"""Every validation problem of a file at once, with "did you mean" for misspelt keys and choices: scenario
files, --set overrides, study files, server profiles and workload models; and the hint of a trace no
importer recognises, which names the setting where the trace came from (--format or workload.format)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from simulator import scenario as sc
from simulator.cli import main
from simulator.errors import InputError
from simulator.study import schema as study_schema
from simulator.traces import formats

SCENARIO = """\
workload:
  trace: data/trace.jsonl
  on_error: skipp
run:
  max_taks: 3
  warmup: -2
target:
  base_url: http://localhost:8000
  api: chats
"""


def error_of(parse, text: str, overrides=()) -> InputError:
    with pytest.raises(InputError) as err:
        parse(text, "f.yaml", overrides)
    return err.value


def by_path(err: InputError) -> dict[str, InputError]:
    return {p.path: p for p in err.problems}


def test_a_scenario_with_four_mistakes_reports_them_all_with_lines_and_suggestions():
    err = error_of(sc.parse, SCENARIO)
    found = by_path(err)
    assert set(found) == {"workload.on_error", "run.max_taks", "run.warmup", "target.api"}
    assert [p.line for p in err.problems] == [3, 5, 6, 9]  # in the file's order
    assert all(p.file == "f.yaml" for p in err.problems)
    assert found["run.max_taks"].message == "unknown key; did you mean `max_tasks`?"
    assert found["run.max_taks"].field == "max_taks"
    assert "'raise' or 'skip'" in found["workload.on_error"].message
    assert found["workload.on_error"].message.endswith("did you mean `skip`?")
    assert "'completions' or 'chat'" in found["target.api"].message
    assert found["target.api"].message.endswith("did you mean `chat`?")
    assert "greater than or equal to 0" in found["run.warmup"].message and "-2" in found["run.warmup"].message
    # the error itself reads as its first problem, for callers that look at one
    assert (err.file, err.line, err.path, err.field) == ("f.yaml", 3, "workload.on_error", "on_error")
    assert err.message == found["workload.on_error"].message
    lines = str(err).splitlines()
    assert lines[0] == "f.yaml: 4 problems"
    assert lines[2] == "  f.yaml:5: at run.max_taks: field 'max_taks': unknown key; did you mean `max_tasks`?"


def test_an_unknown_key_far_from_any_is_told_the_keys_allowed_there():
    err = error_of(sc.parse, "workload: {trace: a}\nrun: {zzz: 1}\n")
    assert err.path == "run.zzz" and "known here:" in err.message and "max_tasks" in err.message


def test_a_union_value_reports_one_problem_beside_the_others():
    # `trace` is a string or a list of strings: the list member's error is the one kept
    err = error_of(sc.parse, "workload:\n  trace: [a, 3]\nrun: {max_taks: 1}\n")
    assert [(p.path, p.line) for p in err.problems] == [("workload.trace.1", 2), ("run.max_taks", 3)]


def test_a_misspelt_set_key_is_told_the_key_path_and_that_it_came_from_set():
    good = "workload: {trace: a}\nrun: {seed: 1}\n"
    err = error_of(sc.parse, good, ["run.max_taks=3"])
    assert err.path == "run.max_taks" and err.line is None
    assert err.message == "unknown key; did you mean `run.max_tasks`? (from --set)"
    err = error_of(sc.parse, good, ["rn.max_tasks=3"])  # the misspelt part is a section
    assert err.path == "rn" and err.line is None
    assert err.message == "unknown key; did you mean `run.max_tasks`? (from --set)"


def test_unknown_emulator_settings_are_each_placed_with_a_suggestion():
    err = error_of(sc.parse, "workload: {trace: a}\nemulator:\n  ttft: 0.1\n  tfft: 2\n  itll: 1\n")
    assert [(p.path, p.line) for p in err.problems] == [("emulator.tfft", 4), ("emulator.itll", 5)]
    assert by_path(err)["emulator.itll"].message == "unknown emulator setting; did you mean `itl`?"


def test_a_misspelt_trace_format_is_told_the_formats():
    err = error_of(sc.parse, "workload:\n  trace: a\n  format: nativ\n")
    assert err.path == "workload.format" and err.line == 3
    assert all(name in err.message for name in formats()) and err.message.endswith("did you mean `native`?")


STUDY = """\
name: s
workload: {synthetic: {input_tokens: 8, output_tokens: 2, concurrency: 2}}
configs:
  base: {name: a, profile: tiny-vllm-cpu}
load: {axis: rates, points: [1]}
repeat: 3
confidence: 2
"""


def test_a_study_with_three_mistakes_reports_them_all_with_lines_and_suggestions():
    err = error_of(study_schema.parse, STUDY)
    found = by_path(err)
    assert [(p.path, p.line) for p in err.problems] == [("load.axis", 5), ("repeat", 6), ("confidence", 7)]
    assert found["load.axis"].message.endswith("did you mean `rate`?")
    assert found["repeat"].message == "unknown key; did you mean `repeats`?"
    assert "less than 1" in found["confidence"].message


def test_a_study_set_key_misspelt_is_told_the_key_path():
    err = error_of(study_schema.parse, STUDY.replace("repeat: 3\nconfidence: 2\n", "").replace("rates", "rate"),
                   ["capacity.loww=1"])
    found = by_path(err)  # `capacity` is made by --set, so its missing `low` is too
    assert found["capacity.loww"].message == "unknown key; did you mean `capacity.low`? (from --set)"
    assert found["capacity.low"].message == "required key missing (from --set)"
    assert all(p.line is None for p in err.problems)


def test_the_cli_prints_every_problem_on_its_own_line_and_exits_2(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(SCENARIO)
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert lines[0] == f"agentload: error: {path}: 4 problems"
    assert any(f"{path}:5: at run.max_taks" in line and "did you mean `max_tasks`?" in line for line in lines)
    assert sum(line.startswith(f"  {path}:") for line in lines) == 4


def test_a_profile_file_reports_all_its_problems_with_suggestions(tmp_path):
    from simulator.sim.profile import load_profile

    path = tmp_path / "p.yaml"
    path.write_text("base: tiny-vllm-cpu\nschedular: {max_num_seqs: 3}\nkv_cache: {enable_prefix_cachng: true}\n")
    with pytest.raises(InputError) as info:
        load_profile(path)
    found = by_path(info.value)
    assert set(found) == {"schedular", "kv_cache.enable_prefix_cachng"}
    assert found["schedular"].message == "unknown key; did you mean `scheduler`?"
    assert found["kv_cache.enable_prefix_cachng"].message == "unknown key; did you mean `enable_prefix_caching`?"
    assert all(p.file == str(path) for p in found.values())


def test_a_model_file_reports_all_its_problems_with_suggestions():
    from simulator.model.fit import fit_model
    from simulator.model.schema import dump_model, validate_model
    from simulator.traces import load

    model = fit_model(load([Path(__file__).resolve().parents[1] / "traces" / "claude-code"]), allow_fallback=True)
    data = yaml.safe_load(dump_model(model))
    name, cls = next(iter(data["classes"].items()))
    cls["sharre"] = 1.0
    cls["structure"]["cells"][0]["gap"]["kind"] = "lognormall"
    with pytest.raises(InputError) as info:
        validate_model(data, "m.yaml")
    found = by_path(info.value)
    assert found[f"$.classes.{name}.sharre"].message == "unknown key; did you mean `share`?"
    assert found[f"$.classes.{name}.structure.cells[0].gap"].message.endswith("did you mean `lognormal`?")


# --- the hint of a trace no importer recognises ----------------------------------------------------


@pytest.fixture
def garbage(tmp_path) -> Path:
    path = tmp_path / "garbage.bin"
    path.write_bytes(b"\x00\x01 this is no trace\nof any kind\n")
    return path


def test_a_garbage_trace_is_told_the_setting_of_where_it_came_from(tmp_path, garbage, capsys):
    # `agentload run` has no --format: its trace came from a scenario, whose workload.format forces one
    scenario = tmp_path / "s.yaml"
    scenario.write_text(f"workload:\n  trace: {garbage.name}\n")
    assert main(["run", str(scenario)]) == 2
    err = capsys.readouterr().err
    assert f"force one with workload.format in {scenario}" in err and "--format" not in err
    assert all(name in err for name in formats())
    # the trace commands have the flag
    assert main(["trace", "inspect", str(garbage)]) == 2
    err = capsys.readouterr().err
    assert "force one with --format" in err and "workload.format" not in err
    assert all(name in err for name in formats())


# --- the error type ----------------------------------------------------------------------------------


def test_several_of_one_is_that_one_and_an_error_alone_is_its_own_problem():
    one = InputError("bad", file="a", line=2)
    assert InputError.several([one]) is one and one.problems == (one,) and str(one) == "a:2: bad"
    many = InputError.several([InputError(f"p{i}", file="a", line=i) for i in range(1, 26)])
    text = str(many).splitlines()
    assert text[0] == "a: 25 problems" and text[1] == "  a:1: p1"
    assert len(text) == 1 + InputError.MAX_SHOWN + 1 and text[-1] == "  ... and 5 more"
