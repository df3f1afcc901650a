"""Scenario files: validation errors name the file, line and YAML path; overrides; path resolution;
shipped scenarios are valid and refer only to files inside the project; the JSON Schema is current."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from simulator import scenario as sc
from simulator.emulator.settings import EmulatorSettings, timing_record
from simulator.errors import InputError
from simulator.study import schema as study_schema
from simulator.traces.native import write
from simulator.workload import Call, Task, Workload

ROOT = Path(__file__).resolve().parents[1]
GOOD = """\
name: demo
workload:
  trace: data/trace.jsonl
run:
  max_in_flight: 4
  warmup: 1.5
slo:
  ttft_ms: {p99: 2000}
  task_s: {p50: 30, "p99.9": 300}
"""


def error_of(text: str, overrides=()) -> InputError:
    with pytest.raises(InputError) as err:
        sc.parse(text, "scen.yaml", overrides)
    return err.value


def test_good_scenario_parses_with_defaults():
    s = sc.parse(GOOD, "x/scen.yaml")
    assert s.display_name() == "demo" and s.target is None
    assert s.run.max_in_flight == 4 and s.run.seed == 0 and s.run.retries == 0
    assert s.slo.task_s.bounds() == {"p50": 30, "p99.9": 300} and s.slo.task_s.item_bound() == 300
    assert s.base_dir() == (Path.cwd() / "x").resolve()


@pytest.mark.parametrize(
    "text, path, line, words",
    [
        (GOOD.replace("  warmup: 1.5", "  warmup: 1.5\n  max_taks: 3"), "run.max_taks", 7, "unknown key"),
        (GOOD.replace("warmup: 1.5", "warmup: soon"), "run.warmup", 6, "valid number"),
        (GOOD.replace("{p99: 2000}", "{p98: 2000}"), "slo.ttft_ms.p98", 8, "unknown key"),
        (GOOD.replace("{p99: 2000}", "{p99: .inf}"), "slo.ttft_ms.p99", 8, "finite number"),
        (GOOD + "target:\n  base_url: http://x\n  api: grpc\n", "target.api", 12, "'completions' or 'chat'"),
        (GOOD + "target:\n  model: m\n", "target.base_url", 10, "required"),
        ("run: {seed: 1}\n", "workload", 1, "required"),
        (GOOD.replace("trace: data/trace.jsonl", "trace: a\n  model: m.yaml"), "workload", 2, "exactly one"),
    ],
)
def test_validation_errors_name_file_line_and_yaml_path(text, path, line, words):
    err = error_of(text)
    assert err.file == "scen.yaml" and err.path == path and err.line == line
    assert words in str(err)


def test_invalid_yaml_reports_its_line():
    err = error_of("workload:\n  trace: [a\nrun: {}\n")
    assert err.file == "scen.yaml" and err.line is not None and "invalid YAML" in str(err)


def test_top_level_must_be_a_mapping():
    assert "mapping" in str(error_of("- a\n- b\n"))


def test_emulator_settings_are_checked():
    err = error_of(GOOD + "emulator: {ttft: 0.1, tfft: 2}\n")
    assert err.path == "emulator.tfft" and err.line == 10 and "did you mean `ttft`?" in str(err)


def test_overrides_set_nested_typed_values_and_are_named_in_errors():
    s = sc.parse(GOOD, "scen.yaml", ["run.max_tasks=3", "target.base_url=http://h:8000", "slo.tpot_ms.p90=50"])
    assert s.run.max_tasks == 3 and s.target.base_url == "http://h:8000" and s.slo.tpot_ms.p90 == 50
    err = error_of(GOOD, ["run.max_tasks=lots"])
    assert err.path == "run.max_tasks" and "--set" in str(err) and err.line is None
    assert "key.path=value" in str(error_of(GOOD, ["run.max_tasks"]))
    assert "not a mapping" in str(error_of(GOOD, ["run.warmup.x=1"]))


def test_relative_trace_resolves_against_scenario_folder(tmp_path, monkeypatch):
    folder = tmp_path / "scen"
    (folder / "data").mkdir(parents=True)
    tasks = tuple(Task(f"t{i}", (Call(input_tokens=10, output_tokens=2),), arrival=float(5 - i)) for i in range(5))
    write(Workload(tasks), folder / "data" / "trace.jsonl")
    (folder / "s.yaml").write_text(GOOD)
    monkeypatch.chdir(tmp_path)
    s = sc.load(folder / "s.yaml", ["run.max_tasks=2", "workload.stagger=0.25"])
    workload = sc.load_workload(s)
    # sorted by arrival, re-spaced, then cut to the first two
    assert [t.id for t in workload.tasks] == ["t4", "t3"]
    assert [t.arrival for t in workload.tasks] == [0.0, 0.25]


def test_missing_scenario_file_is_an_input_error(tmp_path):
    with pytest.raises(InputError) as err:
        sc.load(tmp_path / "nope.yaml")
    assert "nope.yaml" in str(err.value)


def test_shipped_scenarios_are_valid_and_self_contained():
    files = sorted((ROOT / "scenarios").glob("*.yaml"))
    assert any(f.name == "quickstart.yaml" for f in files)
    for file in files:
        s = sc.load(file)
        for p in s.workload.trace_paths() + ([s.workload.model] if s.workload.model else []):
            resolved = (s.base_dir() / p).resolve()
            assert resolved.is_relative_to(ROOT), f"{file.name}: {p} is outside the project"
            assert resolved.exists(), f"{file.name}: {p} does not exist"
        assert s.target is None, f"{file.name}: shipped scenarios run against the built-in emulator"


def test_quickstart_loads_its_workload():
    s = sc.load(ROOT / "scenarios" / "quickstart.yaml")
    workload = sc.load_workload(s)
    assert len(workload.tasks) >= 3
    arrivals = [t.arrival for t in workload.tasks]
    assert len(set(arrivals)) == len(arrivals)  # staggered
    max_len = s.emulator.max_model_len
    if "max_model_len" in s.emulator.model_fields_set:
        assert max(c.input_tokens + c.output_tokens for c in workload.all_calls()) <= max_len


def test_schema_file_is_current():
    assert (ROOT / "docs" / "scenario.schema.json").read_text() == sc.schema_text(), (
        "regenerate: python -c \"from simulator.scenario import write_schema; write_schema()\"")
    schema = sc.json_schema()
    assert schema["additionalProperties"] is False and "workload" in schema["required"]
    yaml.safe_load(GOOD)  # the documented example is YAML


def test_model_workload_is_generated_with_the_scenario_options(tmp_path):
    from simulator.model.fit import fit_model
    from simulator.model.schema import save_model
    from simulator.traces import load as load_traces

    save_model(fit_model(load_traces([ROOT / "traces" / "claude-code"]), allow_fallback=True), tmp_path / "m.yaml")
    text = "workload:\n  model: m.yaml\n  generate: {tasks: 3, rate: 0.5}\nrun: {seed: 4}\n"
    (tmp_path / "g.yaml").write_text(text)
    first = sc.load_workload(sc.load(tmp_path / "g.yaml"))
    again = sc.load_workload(sc.load(tmp_path / "g.yaml"))
    other = sc.load_workload(sc.load(tmp_path / "g.yaml", ["run.seed=5"]))
    assert len(first.tasks) == 3 and first == again and first != other
    err = error_of("workload:\n  model: m.yaml\n  generate: {tasks: 3, duration: 10}\n")
    assert err.path == "workload.generate" and "not both" in str(err)


# ---- bad values (issue 17) ---------------------------------------------------------------------------------


@pytest.mark.parametrize("text, path, words", [
    (GOOD.replace("warmup: 1.5", "warmup: 1.5\n  drain: .inf"), "run.drain", "finite"),
    (GOOD.replace("  trace: data/trace.jsonl", "  trace: data/trace.jsonl\n  stagger: .inf"), "workload.stagger", "finite"),
    (GOOD.replace("  trace: data/trace.jsonl", "  trace: data/trace.jsonl\n  transforms: {token_scale: 1e308}"),
     "workload.transforms.token_scale", "less than or equal"),
    (GOOD + "emulator: {ttft: abc}\n", "emulator", "emulator.ttft must be a number"),
    (GOOD + "emulator: {faults: ['http_500:2']}\n", "emulator", "between 0 and 1"),
    (GOOD + "emulator: {max_model_len: 0}\n", "emulator", "positive whole number"),
    (GOOD + "target: {base_url: 'http://localhost:8000'}\nemulator: {ttft: 0.1}\n", "$", "only without a `target`"),
])
def test_bad_values_are_input_errors_naming_the_setting(text, path, words):
    err = error_of(text)
    assert err.path == path and words in str(err)


def test_set_overrides_are_checked_like_the_file():
    assert error_of(GOOD, ["emulator.ttft=abc"]).path == "emulator"
    assert "from --set" in str(error_of(GOOD, ["run.drain=.inf"]))
    s = sc.parse(GOOD, "scen.yaml", ["slo.ttft_ms.p99.9=500", "emulator.faults=[http_500:0.5]"])
    assert s.slo.ttft_ms.bounds() == {"p99": 2000, "p99.9": 500}
    assert s.emulator.faults == (("http_500", 0.5),)
    with_target = GOOD + "target: {base_url: 'http://localhost:8000'}\nemulator: {ttft: 0.1}\n"
    assert sc.parse(with_target, "scen.yaml", ["emulator=null"]).emulator.model_dump() == {}


def test_nesting_too_deep_is_an_input_error():
    err = error_of("workload:\n  transforms: " + "[" * 5000 + "]" * 5000 + "\n")
    assert "nested more than 64" in str(err)
    err = error_of(GOOD, ["run.duration=" + "[" * 5000 + "]" * 5000])
    assert "nested more than 64" in str(err) and "--set run.duration" in str(err)
    err = error_of("workload:\n" + "".join("  " * k + "a:\n" for k in range(1, 2000)))  # block style: PyYAML recurses
    assert "nested too deeply" in str(err)


def test_a_trace_path_too_long_for_the_file_system_is_an_input_error(tmp_path):
    s = sc.parse(GOOD.replace("data/trace.jsonl", "x" * 5000), str(tmp_path / "scen.yaml"))
    with pytest.raises(InputError) as err:
        sc.load_workload(s)
    assert "too long" in str(err.value)


def test_token_scale_keeps_an_output_token_and_refuses_calls_over_the_cap(tmp_path):
    trace = tmp_path / "t.jsonl"
    write(Workload((Task("a", (Call(1000, 1), Call(2000, 3))),)), trace)
    text = f"workload:\n  trace: {trace}\n  transforms: {{token_scale: 0.1}}\n"
    calls = sc.load_workload(sc.parse(text, str(tmp_path / "s.yaml"))).tasks[0].calls
    assert [c.output_tokens for c in calls] == [1, 1] and [c.input_tokens for c in calls] == [100, 200]
    big = text.replace("0.1", "100000")
    with pytest.raises(InputError) as err:
        sc.load_workload(sc.parse(big, str(tmp_path / "s.yaml")))
    assert err.value.path == "workload.transforms" and "16,777,216" in str(err.value)


def test_a_non_utf8_scenario_file_is_an_input_error(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_bytes(GOOD.encode() + b"# caf\xe9\n")
    with pytest.raises(InputError) as err:
        sc.load(path)
    assert "UTF-8" in str(err.value)


def test_an_emulator_profile_name_too_long_is_an_input_error():
    err = error_of(GOOD + "emulator: {profile: " + "x" * 5000 + "}\n")
    assert err.path == "emulator.profile" and "too long" in str(err)


# ---- the emulator section, typed (issue 32) ------------------------------------------------------------------


def test_the_emulator_section_is_the_emulators_typed_settings_recorded_as_given():
    text = GOOD + "emulator: {itl: 1, ttft: 0.005, faults: ['http_500:0.1'], port: 0, seed: 4}\n"
    s = sc.parse(text, "scen.yaml")
    assert isinstance(s.emulator, EmulatorSettings)
    assert (s.emulator.ttft, s.emulator.itl, s.emulator.seed, s.emulator.port) == (0.005, 1, 4, 0)
    assert s.emulator.faults == (("http_500", 0.1),) and s.emulator.max_model_len == 131072  # default, not set
    assert timing_record(s.emulator)["kind"] == "fixed"
    # run.json's settings.emulator: what was set, in the order written, a whole number still whole
    assert json.dumps(s.model_dump(mode="json", by_alias=True)["emulator"]) == (
        '{"itl": 1, "ttft": 0.005, "faults": [["http_500", 0.1]], "port": 0, "seed": 4}')
    assert sc.parse(GOOD, "scen.yaml").model_dump(mode="json")["emulator"] == {}


def test_a_scenario_made_in_code_takes_its_source_through_with_source(tmp_path):
    made = sc.Scenario(workload=sc.WorkloadSpec(trace="t.jsonl"))
    placed = made.with_source(str(tmp_path / "study.yaml"))
    assert made.source is None and placed.source == str(tmp_path / "study.yaml")
    assert placed.base_dir() == tmp_path and placed.resolve("t.jsonl") == tmp_path / "t.jsonl"
    assert placed.model_copy(update={"name": "x"}).source == placed.source


def test_study_files_are_read_as_scenario_files_are(tmp_path):
    path = tmp_path / "study.yaml"
    path.write_bytes(b"workload: {trace: t.jsonl}\n# caf\xe9\n")
    with pytest.raises(InputError) as err:
        study_schema.load(path)
    assert "not UTF-8 text" in str(err.value)
    spec = study_schema.parse("workload: {trace: t.jsonl}\nconfigs: {base: {name: b, url: 'http://h:1'}}\n"
                              "load: {axis: rate, points: [1]}\n", "study.yaml")
    assert spec.with_source(str(tmp_path / "s.yaml")).base_dir() == tmp_path and spec.source == "study.yaml"
