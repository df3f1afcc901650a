"""The native JSONL format: exact round trip, clear errors."""

import io
import json

import pytest

from simulator.errors import ErrorPolicy, InputError
from simulator.traces import load, native
from simulator.workload import Call, Provenance, SubTask, Task, Workload


def _workload() -> Workload:
    child = Task("t1/sub", (Call(100, 5, gap=0.5, hash_ids=(9, 10), block_size=64),))
    parent = Task(
        "t1",
        (
            Call(300, 20, hash_ids=(1, 2, 3), block_size=64, server_time=1.25, sent_at=0.0, stop_reason="tool_use"),
            Call(400, 7, gap=3.0, hash_ids=(1, 2, 3, 4), block_size=64, model="m", messages=({"role": "user", "content": "hi"},)),
        ),
        arrival=1.5,
        task_class="coder",
        subtasks=(SubTask(0, child, wait=False),),
    )
    return Workload((parent, Task("t2", (Call(1, 1),), arrival=2.0)), (Provenance("x.json", "claude-code", {"a": 1}, ("note",)),))


def test_round_trip_is_exact(tmp_path):
    wl = _workload()
    path = tmp_path / "w.jsonl"
    native.write(wl, path)
    again = load([path])
    assert again.tasks == wl.tasks
    assert again.provenance == wl.provenance
    native.write(again, tmp_path / "w2.jsonl")
    assert (tmp_path / "w2.jsonl").read_bytes() == path.read_bytes()


def test_defaults_are_left_out():
    buf = io.BytesIO()
    native.write(Workload((Task("a", (Call(3, 4),)),)), buf)
    line = json.loads(buf.getvalue().splitlines()[1])
    assert line == {"id": "a", "calls": [{"input_tokens": 3, "output_tokens": 4}]}


def test_bad_field_names_line_and_path(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"agentload_trace": 1}\n{"id": "a", "calls": [{"input_tokens": 3, "output_tokens": -4}]}\n')
    with pytest.raises(InputError) as err:
        load([path])
    text = str(err.value)
    assert "bad.jsonl:2" in text and "$.calls[0].output_tokens" in text and "output_tokens" in text


def test_skip_counts_bad_lines(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(
        '{"agentload_trace": 1}\n{"id": "a", "calls": [{"input_tokens": "x", "output_tokens": 1}]}\n'
        '{"id": "b", "calls": [{"input_tokens": 3, "output_tokens": 1}]}\n'
    )
    policy = ErrorPolicy("skip")
    wl = native.read(path, policy)
    assert [t.id for t in wl.tasks] == ["b"] and policy.total_skipped == 1


def test_wrong_version(tmp_path):
    path = tmp_path / "v.jsonl"
    path.write_text('{"agentload_trace": 99}\n')
    with pytest.raises(InputError, match="unsupported version"):
        load([path])


def test_empty_and_unknown_inputs(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(InputError, match="empty file"):
        load([tmp_path / "empty.jsonl"])
    (tmp_path / "odd.txt.json").write_text("hello world")
    with pytest.raises(InputError, match="unknown trace format"):
        load([tmp_path / "odd.txt.json"])
    with pytest.raises(InputError, match="no such file"):
        load([tmp_path / "missing"])
