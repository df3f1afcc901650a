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


def _lines(wl: Workload) -> list[dict]:
    buf = io.BytesIO()
    native.write(wl, buf)
    return [json.loads(line) for line in buf.getvalue().splitlines()[1:]]


def test_hash_keep_writes_only_the_new_ids_and_reads_back_exact(tmp_path):
    calls = (
        Call(256, 1, hash_ids=(1, 2, 3, 4), block_size=64),
        Call(320, 1, hash_ids=(1, 2, 3, 4, 5), block_size=64),  # extends the previous prompt
        Call(192, 1, hash_ids=(1, 2, 9), block_size=64),  # a compaction: keeps 2, then new ids
        Call(128, 1, hash_ids=(1, 2), block_size=64),  # only kept ids
        Call(128, 1, hash_ids=(7, 8), block_size=64),  # nothing shared
        Call(128, 1, hash_ids=(7, 8), block_size=32),  # other block size: never kept
    )
    wl = Workload((Task("t", calls),))
    wire = _lines(wl)[0]["calls"]
    assert [c.get("hash_keep") for c in wire] == [None, 4, 2, 2, None, None]
    assert [c.get("hash_ids") for c in wire] == [[1, 2, 3, 4], [5], [9], None, [7, 8], [7, 8]]
    path = tmp_path / "k.jsonl"
    native.write(wl, path)
    assert load([path]).tasks == wl.tasks


def test_sub_tasks_chain_within_themselves(tmp_path):
    child = Task("p/sub", (Call(128, 1, hash_ids=(1, 2), block_size=64), Call(192, 1, hash_ids=(1, 2, 30), block_size=64)))
    parent = Task("p", (Call(128, 1, hash_ids=(1, 2), block_size=64), Call(192, 1, hash_ids=(1, 2, 3), block_size=64)),
                  subtasks=(SubTask(0, child),))
    wl = Workload((parent,))
    line = _lines(wl)[0]
    assert [c.get("hash_keep") for c in line["calls"]] == [None, 2]
    # The sub-task's first call shares ids with its parent's, but chains only within the sub-task.
    assert [c.get("hash_keep") for c in line["subtasks"][0]["task"]["calls"]] == [None, 2]
    path = tmp_path / "s.jsonl"
    native.write(wl, path)
    assert load([path]).tasks == wl.tasks


def test_weka_set_round_trips_and_shrinks(tmp_path):
    from pathlib import Path

    weka = Path(__file__).resolve().parents[1] / "traces" / "claude-code"
    files = sorted(weka.glob("*.json"))[:5]
    assert len(files) == 5
    sub = tmp_path / "weka"
    sub.mkdir()
    for f in files:
        (sub / f.name).write_bytes(f.read_bytes())
    wl = load([sub])
    path = tmp_path / "w.jsonl"
    native.write(wl, path)
    assert load([path]).tasks == wl.tasks
    ids = sum(len(c.hash_ids) for c in wl.all_calls())
    assert path.read_bytes().count(b",") < ids / 4  # most ids are kept, not written again


def _bad(tmp_path, line: str) -> str:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"agentload_trace": 1}\n{"id": "ok", "calls": [{"input_tokens": 1, "output_tokens": 1}]}\n' + line + "\n")
    with pytest.raises(InputError) as err:
        load([path])
    return str(err.value)


@pytest.mark.parametrize("line, where, says", [
    ('{"id": "a", "calls": [{"input_tokens": 3, "output_tokens": 1, "hash_ids": [1, 2], "block_size": 1},'
     ' {"input_tokens": 4, "output_tokens": 1, "hash_keep": 3, "hash_ids": [5], "block_size": 1}]}',
     "$.calls[1].hash_keep", "previous call has only 2"),
    ('{"id": "a", "calls": [{"input_tokens": 3, "output_tokens": 1, "hash_keep": 1, "hash_ids": [5], "block_size": 1}]}',
     "$.calls[0].hash_keep", "first call"),
    ('{"id": "a", "calls": [{"input_tokens": 1, "output_tokens": 1}], "subtasks": [{"after_call": 0, "task": {"id": "b",'
     ' "calls": [{"input_tokens": 1, "output_tokens": 1, "hash_keep": 0}]}}]}',
     "$.subtasks[0].task.calls[0].hash_keep", "first call"),
    ('{"id": "a", "calls": [{"input_tokens": 3, "output_tokens": 1, "hash_ids": [1]},'
     ' {"input_tokens": 4, "output_tokens": 1, "hash_keep": -1}]}',
     "$.calls[1].hash_keep", "integer >= 0"),
    ('{"id": "a", "calls": [{"input_tokens": 3, "output_tokens": 1, "hash_ids": [1], "block_size": 16},'
     ' {"input_tokens": 4, "output_tokens": 1, "hash_keep": 1, "block_size": 32}]}',
     "$.calls[1].hash_keep", "block_size"),
])
def test_bad_hash_keep_names_line_path_and_field(tmp_path, line, where, says):
    text = _bad(tmp_path, line)
    assert "bad.jsonl:3" in text and where in text and "field 'hash_keep'" in text and says in text


def test_bad_id_after_hash_keep_is_reported_by_validation(tmp_path):
    text = _bad(tmp_path, '{"id": "a", "calls": [{"input_tokens": 3, "output_tokens": 1, "hash_ids": [1]},'
                          ' {"input_tokens": 4, "output_tokens": 1, "hash_keep": 1, "hash_ids": ["x"]}]}')
    assert "bad.jsonl:3" in text and "$.calls[1].hash_ids[0]" in text  # the index in the line's list


def test_skip_policy_skips_a_bad_hash_keep_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"agentload_trace": 1}\n'
                    '{"id": "a", "calls": [{"input_tokens": 3, "output_tokens": 1, "hash_keep": 1}]}\n'
                    '{"id": "b", "calls": [{"input_tokens": 3, "output_tokens": 1}]}\nnot json\n')
    policy = ErrorPolicy("skip")
    wl = native.read(path, policy)
    assert [t.id for t in wl.tasks] == ["b"] and policy.total_skipped == 2


def test_common_prefix_matches_a_plain_count():
    import random

    rng = random.Random(5)
    for _ in range(300):
        a = tuple(rng.randrange(4) for _ in range(rng.randrange(40)))
        b = a[: rng.randrange(len(a) + 1)] + tuple(rng.randrange(4) for _ in range(rng.randrange(40)))
        plain = 0
        for x, y in zip(a, b):
            if x != y:
                break
            plain += 1
        assert native.common_prefix(a, b) == plain == native.common_prefix(b, a)


def test_schema_describes_hash_keep():
    call = native.task_json_schema()["$defs"]["Call"]["properties"]
    names = list(call)
    assert names.index("hash_keep") == names.index("hash_ids") - 1
    assert call["hash_keep"]["type"] == "integer" and call["hash_keep"]["minimum"] == 0


# ---- bounds and shared ids (issue 17) ---------------------------------------------------------------------

HEADER = '{"agentload_trace": 1}\n'


@pytest.mark.parametrize("call, field", [
    ('{"input_tokens": 9223372036854775808, "output_tokens": 1}', "input_tokens"),
    ('{"input_tokens": 16777217, "output_tokens": 1}', "input_tokens"),
    ('{"input_tokens": true, "output_tokens": 1}', "input_tokens"),
    ('{"input_tokens": 1.0, "output_tokens": 1}', "input_tokens"),
    ('{"input_tokens": 1, "output_tokens": 1, "sent_at": NaN}', "sent_at"),
    ('{"input_tokens": 1, "output_tokens": 1, "gap": Infinity}', "gap"),
    ('{"input_tokens": 1, "output_tokens": 1, "gap": 1e300}', "gap"),
    ('{"input_tokens": 1, "output_tokens": 1, "hash_ids": [true], "block_size": 4}', "hash_ids"),
    ('{"input_tokens": 1, "output_tokens": 1, "hash_ids": [9223372036854775808], "block_size": 4}', "hash_ids"),
    ('{"input_tokens": 1, "output_tokens": 1, "hash_ids": [-1], "block_size": 4}', "hash_ids"),
])
def test_values_out_of_range_are_input_errors(tmp_path, call, field):
    path = tmp_path / "bad.jsonl"
    path.write_text(HEADER + '{"id": "a", "calls": [' + call + "]}\n")
    with pytest.raises(InputError) as err:
        load([path])
    assert err.value.line == 2 and err.value.field == field


def test_sub_tasks_must_start_after_a_call_and_nest_at_most_max_depth(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(HEADER + '{"id": "a", "calls": [{"input_tokens": 1, "output_tokens": 1}], "subtasks": '
                    '[{"after_call": 1, "task": {"id": "b", "calls": []}}]}\n')
    with pytest.raises(InputError) as err:
        load([path])
    assert err.value.field == "after_call" and err.value.path == "$.subtasks[0].after_call"
    task: dict = {"id": "leaf", "calls": [{"input_tokens": 1, "output_tokens": 1}]}
    for depth in range(40):
        task = {"id": f"t{depth}", "calls": [{"input_tokens": 1, "output_tokens": 1}],
                "subtasks": [{"after_call": 0, "task": task}]}
    path.write_text(HEADER + json.dumps(task) + "\n")
    with pytest.raises(InputError) as err:
        load([path])
    assert "nested more than 32" in str(err.value)


def test_calls_of_a_task_share_one_copy_of_their_ids(tmp_path):
    """The reader keeps a task's ids once: calls that extend the previous one are views of one chain."""
    base = tuple(range(1000, 1400))
    calls = tuple(Call(64 * (400 + 10 * k), 5, hash_ids=base + tuple(range(5000, 5000 + 10 * k)), block_size=64)
                  for k in range(30))
    rewrite = Call(64 * 100, 5, hash_ids=base[:100], block_size=64)  # a compaction: keeps a part
    wl = Workload((Task("t", calls + (rewrite,)),))
    path = tmp_path / "w.jsonl"
    native.write(wl, path)
    got = load([path]).tasks[0].calls
    assert got == wl.tasks[0].calls
    assert len({id(c.hash_ids._chain) for c in got[:-1]}) == 1 and got[-1].hash_ids._chain is not got[0].hash_ids._chain
    chain = got[0].hash_ids._chain
    assert len(chain.firsts) <= 31  # runs of consecutive ids, not 700 ids


def test_arrival_span_and_its_words():
    from simulator.workload import describe_seconds

    wl = Workload(tuple(Task(f"t{i}", (Call(1, 1),), arrival=a) for i, a in enumerate((5.0, 6_204_866.0, 100.0))))
    assert wl.arrival_span() == 6_204_861.0 and Workload(()).arrival_span() == 0.0
    assert describe_seconds(6_204_861) == "71 days 19 h" and describe_seconds(45) == "45 s"
    assert describe_seconds(3 * 3600 + 20 * 60) == "3 h 20 min" and describe_seconds(725) == "12 min 5 s"


def test_repeated_task_ids_are_made_unique_sub_tasks_too(tmp_path):
    sub = Task("t1/agent", (Call(5, 1),))
    parent = Task("t1", (Call(10, 1),), subtasks=(SubTask(0, sub),))
    for name in ("one", "two"):
        native.write(Workload((parent, Task("lone", (Call(3, 1),), subtasks=(SubTask(0, sub),)))), tmp_path / f"{name}.jsonl")
    ids = [t.id for t in load([tmp_path / "one.jsonl", tmp_path / "two.jsonl"]).all_tasks()]
    assert sorted(ids) == sorted(["t1", "t1/agent", "lone", "t1/agent#1", "t1#1", "t1/agent#2", "lone#1", "t1/agent#3"])
