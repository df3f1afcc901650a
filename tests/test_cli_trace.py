"""`agentload trace inspect|convert|compare` through `simulator.cli.main`."""

import json
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.traces import formats, load, native
from simulator.workload import Call, Provenance, SubTask, Task, Workload

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "traces" / "claude-code"  # in the repository: missing means broken, never skipped
SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"


def _workload() -> Workload:
    child = Task("t1/sub", (Call(100, 5, gap=0.5, hash_ids=(9, 10), block_size=64),))
    t1 = Task("t1", (
        Call(300, 20, hash_ids=(1, 2, 3), block_size=64, server_time=1.25, sent_at=0.0),
        Call(400, 7, gap=3.0, hash_ids=(1, 2, 3, 4), block_size=64, sent_at=4.25),
    ), arrival=1.5, subtasks=(SubTask(0, child),))
    t2 = Task("t2", (Call(10, 1),), arrival=2.0)
    t3 = Task("t3", (Call(20, 2), Call(30, 3, gap=1.0)), arrival=2.5)
    return Workload((t1, t2, t3), (Provenance("orig.json", "test", {}, ("joined 2 records into t3",)),))


@pytest.fixture
def native_file(tmp_path):
    path = tmp_path / "w.jsonl"
    native.write(_workload(), path)
    return path


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_inspect_json_counts(native_file, capsys):
    data = _json(capsys, ["trace", "inspect", str(native_file), "--json"])
    assert (data["tasks"], data["calls"], data["subtasks"]) == (3, 6, 1)
    assert data["calls_per_task"]["max"] == 3
    assert data["input_tokens"]["max"] == 400
    assert data["appended_tokens"]["count"] == 6
    assert data["provenance"][0]["notes"] == ["joined 2 records into t3"]
    assert data["arrivals"]["span_s"] == 1.0


def test_inspect_tables_show_sections_and_notes(native_file, capsys):
    assert main(["trace", "inspect", str(native_file)]) == 0
    out = capsys.readouterr().out
    for heading in ("Workload", "Distributions", "Prefix reuse", "Arrivals", "appended tokens"):
        assert heading in out
    assert "note: orig.json (test): joined 2 records into t3" in out


def test_inspect_several_files_reads_one_workload(native_file, tmp_path, capsys):
    other = tmp_path / "other.jsonl"
    native.write(Workload((Task("x", (Call(1, 1),)),)), other)
    data = _json(capsys, ["trace", "inspect", str(native_file), str(other), "--format", "native", "--json"])
    assert (data["tasks"], data["calls"]) == (4, 7)


def test_convert_round_trips(native_file, tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    assert main(["trace", "convert", str(native_file), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert str(out) in printed and "3 tasks, 6 calls, 1 sub-tasks" in printed
    again = load([out])
    assert again.tasks == _workload().tasks
    assert again.provenance == _workload().provenance


def test_missing_file_is_one_line_exit_2(tmp_path, capsys):
    missing = tmp_path / "nope.jsonl"
    assert main(["trace", "inspect", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(missing) in err and err.startswith("agentload: error:")


def test_bad_record_names_file_and_line_or_is_skipped(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"agentload_trace": 1}\n{"id": "a", "calls": [{"input_tokens": 1, "output_tokens": 1}]}\n'
                   '{"id": "b", "calls": [{"input_tokens": -3, "output_tokens": 1}]}\n')
    assert main(["trace", "inspect", str(bad), "--json"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{bad}:3" in err and "input_tokens" in err
    data = _json(capsys, ["trace", "inspect", str(bad), "--on-error", "skip", "--json"])
    assert data["tasks"] == 1
    assert any("skipped 1 record" in n for p in data["provenance"] for n in p["notes"])


def test_convert_to_unwritable_path_names_it(native_file, tmp_path, capsys):
    out = tmp_path / "no-such-dir" / "out.jsonl"
    assert main(["trace", "convert", str(native_file), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(out) in err


def test_unknown_format_is_rejected(native_file, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["trace", "inspect", str(native_file), "--format", "no-such-format"])
    assert exit_.value.code == 2


def test_compare_with_itself(native_file, capsys):
    data = _json(capsys, ["trace", "compare", str(native_file), str(native_file), "--json"])
    assert len(data["marginals"]) == 6
    for m in data["marginals"]:
        assert m["ks"] == 0.0
        assert (m["p50_ratio"], m["p90_ratio"], m["p99_ratio"]) == (1.0, 1.0, 1.0)
    assert main(["trace", "compare", str(native_file), str(native_file)]) == 0
    assert "KS" in capsys.readouterr().out


def _raw_counts(folder: Path, at_least: int) -> tuple[int, int, int]:
    """Tasks, calls and sub-tasks counted straight from kv-cache-tester JSON files."""

    def walk(requests):
        calls = subs = 0
        for r in requests:
            if r.get("type") == "subagent":
                c, s = walk(r.get("requests", []))
                calls, subs = calls + c, subs + s + 1
            else:
                calls += 1
        return calls, subs

    files = sorted(folder.glob("*.json"))
    assert len(files) >= at_least, f"{folder}: {len(files)} *.json files, expected at least {at_least}"
    tasks = calls = subs = 0
    for path in files:
        c, s = walk(json.loads(path.read_text())["requests"])
        tasks, calls, subs = tasks + 1, calls + c, subs + s
    return tasks, calls, subs


def test_claude_code_importer_is_registered():
    assert "claude-code" in formats()


@pytest.mark.parametrize("folder, at_least", [
    pytest.param(SAMPLES, 7, id="samples"),
    # outside the repository (the shared data folder): the only skip here
    pytest.param(SHARED / "weka-claude-code", 130, id="shared-weka", marks=pytest.mark.skipif(
        not (SHARED / "weka-claude-code").is_dir(), reason="shared traces not present")),
])
def test_inspect_claude_code_counts_match_raw_files(capsys, folder, at_least):
    data = _json(capsys, ["trace", "inspect", str(folder), "--json"])
    assert (data["tasks"], data["calls"], data["subtasks"]) == _raw_counts(folder, at_least)
    assert data["subtasks"] > 0


def test_convert_claude_code_file_round_trips(tmp_path, capsys):
    source = SAMPLES / "trace_0277.json"  # has sub-agents
    out = tmp_path / "t.jsonl"
    assert main(["trace", "convert", str(source), "-o", str(out)]) == 0
    assert "native format" in capsys.readouterr().out
    tasks = load([source]).tasks
    assert len(tasks) == 1 and len(tasks[0].subtasks) == 4
    assert load([out]).tasks == tasks
