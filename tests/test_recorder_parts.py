"""The recorder's parts on their own: block ids of token ids, the stream tap, the recording file and its
importer (`simulator.traces.recording`)."""

from __future__ import annotations

import json

import orjson
import pytest

from simulator.errors import ErrorPolicy, InputError
from simulator.recorder.block_hash import block_ids
from simulator.recorder.journal import Journal, segment_path
from simulator.recorder.keys import KeySource
from simulator.recorder.stream_tap import StreamTap
from simulator.traces import load, recording


# ---- block ids ----------------------------------------------------------------------------------------


def test_block_ids_are_prefix_ids_of_full_blocks():
    a = list(range(100, 180))  # 5 full blocks of 16
    assert len(block_ids(a)) == 5 and len(block_ids(a[:79])) == 4 and block_ids(a[:15]) == []
    b = a[:40] + [7] + a[41:]  # differs in block 2
    ia, ib = block_ids(a), block_ids(b)
    assert ia[:2] == ib[:2] and all(x != y for x, y in zip(ia[2:], ib[2:]))
    # an id depends on everything before it: equal block 3 after a different block 2 still differs
    assert ia[3] != ib[3]
    # the same blocks in another order are other prefixes
    swapped = a[16:32] + a[:16] + a[32:]
    assert block_ids(swapped)[0] != ia[0] and block_ids(swapped)[1] != ia[1]
    assert all(0 <= x < 2 ** 63 for x in ia)
    assert block_ids(a, block_size=32) == block_ids(list(a), block_size=32) and len(block_ids(a, 32)) == 2


# ---- stream tap ---------------------------------------------------------------------------------------

CHUNKS = [
    b'data: {"id":"c","choices":[{"index":0,"text":"a","finish_reason":null}]}\n\n',
    b'data: {"id":"c","choices":[{"index":0,"text":"b","finish_reason":"length"}]}\n\ndata: {"id":"c","cho',
    b'ices":[],"usage":{"prompt_tokens":40,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":32}}}\n\n',
    b"data: [DONE]\n\n",
]


@pytest.mark.parametrize("cut", [None, 3, 7, 50])
def test_the_tap_strips_only_the_usage_it_asked_for(cut):
    raw = b"".join(CHUNKS)
    chunks = CHUNKS if cut is None else [raw[i:i + cut] for i in range(0, len(raw), cut)]
    tap = StreamTap(strip_usage=True)
    out = b"".join(tap.feed(c)[0] for c in chunks) + tap.close()
    assert out == CHUNKS[0] + CHUNKS[1].split(b"\n\n")[0] + b"\n\n" + CHUNKS[3]
    assert tap.usage["prompt_tokens"] == 40 and tap.usage["prompt_tokens_details"]["cached_tokens"] == 32
    assert tap.finish_reason == "length" and tap.first_token

    keep = StreamTap(strip_usage=False)
    passed = [keep.feed(c) for c in chunks]
    assert b"".join(p[0] for p in passed) == raw  # byte for byte, chunk for chunk
    assert sum(first for _, first in passed) == 1 and keep.usage["completion_tokens"] == 2


def test_the_tap_keeps_continuous_usage_and_events_with_choices():
    events = [b'data: {"choices":[{"delta":{"content":"x"}}],"usage":{"prompt_tokens":5,"completion_tokens":%d}}\n\n' % n
              for n in (1, 2, 3)]
    tap = StreamTap(strip_usage=True)
    out = b"".join(tap.feed(e)[0] for e in events)
    assert out == b"".join(events) and tap.usage["completion_tokens"] == 3


# ---- keys ---------------------------------------------------------------------------------------------


def test_keys_come_from_the_configured_places_in_order():
    keys = KeySource(("x-session-id",), traceparent=True, user_field=True)
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert keys.key({"x-session-id": "s1", "traceparent": tp}, {"user": "u"}) == "h:s1"
    assert keys.key({"traceparent": tp}, {"user": "u"}) == "w3c:4bf92f3577b34da6a3ce929d0e0e4736"
    assert keys.key({"traceparent": "garbage"}, {"user": "u"}) == "u:u"
    assert KeySource(("x-session-id",), traceparent=False).key({"traceparent": tp}, {"user": "u"}) is None


# ---- the recording file and its importer ----------------------------------------------------------------


def _journal(path, **kw):
    return Journal(path, {"hash": "agentload-prefix-v1", "block_size": 16, "started_unix": 1000.0}, **kw)


def _write_session(j: Journal) -> None:
    """A task t1 of three calls with a sub-task after its first call, the parent waiting for it."""
    j.call({"task": "t1", "i": 0, "t": 1.0, "end": 2.0, "input_tokens": 64, "output_tokens": 8}, [1, 2, 3, 4])
    j.call({"task": "t1/s1", "i": 0, "parent": "t1", "after_call": 0, "t": 2.05, "end": 2.5,
            "input_tokens": 32, "output_tokens": 4}, [9, 10])
    j.call({"task": "t1/s1", "i": 1, "t": 2.6, "end": 3.0, "input_tokens": 48, "output_tokens": 4}, [9, 10, 11])
    j.call({"task": "t1", "i": 1, "t": 3.5, "end": 4.0, "input_tokens": 96, "output_tokens": 8}, [1, 2, 3, 4, 5, 6])
    j.call({"task": "t1", "i": 2, "t": 4.2, "end": 4.3, "status": 500, "error": "http_500"})
    j.call({"task": "t1", "i": 3, "t": 5.0, "end": 5.5, "input_tokens": 112, "output_tokens": 2,
            "stop_reason": "stop"}, [1, 2, 3, 4, 5, 6, 7])
    j.call({"task": "t2", "i": 0, "t": 3.0, "end": 3.2, "input_tokens": 20, "output_tokens": 1}, [50])


def test_a_recording_reads_back_as_tasks_with_sub_tasks_gaps_and_compact_ids(tmp_path):
    path = tmp_path / "rec.jsonl"
    j = _journal(path)
    _write_session(j)
    j.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["agentload_recording"] == 1 and lines[4]["hash_keep"] == 4 and lines[4]["hash_ids"] == [5, 6]
    w = load([path])
    t1, t2 = w.tasks
    assert (t1.id, t1.arrival, t2.id, t2.arrival) == ("t1", 1.0, "t2", 3.0)
    assert [c.input_tokens for c in t1.calls] == [64, 96, 112]  # the failed call is left out
    assert tuple(t1.calls[2].hash_ids) == (1, 2, 3, 4, 5, 6, 7) and t1.calls[0].block_size == 16
    sub = t1.subtasks[0]
    assert sub.after_call == 0 and sub.wait and sub.task.task_class == "subagent"
    assert [round(c.gap, 6) for c in sub.task.calls] == [0.05, 0.1]
    # the parent waited for its sub-task: its next gap counts from the sub-task's end (3.0), not its own (2.0)
    assert [round(c.gap, 6) for c in t1.calls] == [0.0, 0.5, 1.0]
    assert t1.calls[2].stop_reason == "stop" and t1.calls[1].server_time == 0.5
    assert any("1 failed call" in n for n in w.provenance[0].notes)


def test_the_last_revision_of_a_sub_task_wins_wherever_it_was_written(tmp_path):
    path = tmp_path / "rec" / "traffic.jsonl"
    j = _journal(path, rotate_bytes=1)
    _write_session(j)
    j.revision("t1/s1", "t2", 0)  # first moved under t2 ...
    j.revision("t1/s1", None, None)  # ... then made a task of its own
    j.close()
    w = load([tmp_path / "rec"])
    assert sorted(t.id for t in w.tasks) == ["t1", "t1/s1", "t2"] and all(not t.subtasks for t in w.tasks)
    assert any("1 sub-task placement" in n or "2 sub-task placement" in n for n in w.provenance[0].notes)
    moved = _journal(tmp_path / "one.jsonl")
    _write_session(moved)
    moved.revision("t1/s1", "t2", 0)
    moved.close()
    t1, t2 = load([tmp_path / "one.jsonl"]).tasks
    assert not t1.subtasks and t2.subtasks[0].task.id == "t1/s1" and t2.subtasks[0].after_call == 0
    # t2's only call ended at 3.2 before the sub-task's first call (2.05): its gap cannot be negative
    assert t2.subtasks[0].task.calls[0].gap == 0.0


def test_rotated_files_read_as_one_recording_and_each_on_its_own(tmp_path):
    path = tmp_path / "rec" / "traffic.jsonl"
    j = _journal(path, rotate_bytes=1)  # a new file before every call
    _write_session(j)
    j.close()
    assert len(j.files) == 8 and j.files[1] == segment_path(path, 1) == tmp_path / "rec" / "traffic.1.jsonl"
    for whole in (load([tmp_path / "rec"]), load(j.files)):  # the folder, or its files named one by one
        assert len(whole.tasks) == 2 and len(whole.tasks[0].calls) == 3 and len(whole.tasks[0].subtasks) == 1
    alone = load([j.files[4]])  # t1's second call alone: ids written whole, no hash_keep across files
    assert tuple(alone.tasks[0].calls[0].hash_ids) == (1, 2, 3, 4, 5, 6)
    by_time = _journal(tmp_path / "timed" / "traffic.jsonl", rotate_seconds=1e-9)  # every file already old
    _write_session(by_time)
    by_time.close()
    assert len(by_time.files) == 8 and load([tmp_path / "timed"]).counts() == whole.counts()


def test_a_line_cut_short_is_left_out_and_every_finished_line_kept(tmp_path):
    path = tmp_path / "rec.jsonl"
    j = _journal(path)
    _write_session(j)
    j.close()
    data = path.read_bytes()
    path.write_bytes(data[:-25])  # as a recorder killed mid-write leaves it
    w = load([path])
    assert [t.id for t in w.tasks] == ["t1"]  # t2's line is the one cut
    assert sum(len(s.calls) for t in w.tasks for s in t.walk()) == 5
    assert any("cut short" in n for n in w.provenance[0].notes)


@pytest.mark.parametrize("line, field", [
    ({"task": "t", "i": 0, "t": 1.0, "end": 0.5}, "end"),
    ({"task": "", "i": 0, "t": 1.0, "end": 2.0}, "task"),
    ({"task": "t", "i": -1, "t": 1.0, "end": 2.0}, "i"),
    ({"task": "t", "i": 0, "t": 1.0, "end": 2.0, "input_tokens": -3}, "input_tokens"),
    ({"task": "t", "i": 0, "t": 1.0, "end": 2.0, "hash_keep": 2, "hash_ids": [1]}, "hash_keep"),
    ({"task": "t", "i": 0, "t": 1.0, "end": 2.0, "hash_ids": [True]}, "hash_ids"),
    ({"task": "t", "i": 0, "t": 1.0, "end": 2.0, "parent": "p", "after_call": "x"}, "after_call"),
])
def test_a_bad_line_names_file_line_and_field(tmp_path, line, field):
    path = tmp_path / "rec.jsonl"
    header = {"agentload_recording": 1, "block_size": 16, "started_unix": 0}
    path.write_bytes(orjson.dumps(header) + b"\n" + orjson.dumps(line) + b"\n")
    with pytest.raises(InputError) as err:
        load([path])
    assert err.value.field == field and err.value.line == 2 and str(path) in str(err.value)
    skipped = recording.read(path, ErrorPolicy("skip"))
    assert skipped.tasks == ()


def test_a_recording_of_another_version_is_refused(tmp_path):
    path = tmp_path / "rec.jsonl"
    path.write_text('{"agentload_recording": 2, "block_size": 16}\n')
    with pytest.raises(InputError, match="version 2"):
        load([path])
