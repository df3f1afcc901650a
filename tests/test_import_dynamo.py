"""Dynamo agent-trace importer: the shipped excerpt of a real capture against counts computed from its raw
lines, trajectory lineage turned into sub-tasks (spawn point, wait, gaps after a join), tool spans in the
notes, the spellings and containers Dynamo writes (wrapped or bare records, old field names, gzip members,
rolled segments), and bad records named by file, line and field."""

import gzip
import json
from pathlib import Path

import pytest

from simulator.errors import InputError
from simulator.traces import detect, dynamo, importers, load, native

ROOT = Path(__file__).resolve().parents[1]
EXCERPT = ROOT / "traces" / "dynamo" / "golden-trace-12x4_head2.jsonl"
FIXTURE = ROOT / "tests" / "fixtures" / "dynamo_agent_trace.jsonl"


def _events(path: Path) -> list[dict]:
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [line.get("event", line) for line in lines]


def test_excerpt_counts_match_its_raw_lines():
    events = [e for e in _events(EXCERPT) if e["event_type"] == "request_end"]
    wl = load([EXCERPT])
    sessions = {e["agent_context"]["session_id"] for e in events}
    assert wl.counts() == (len(sessions), len(events), 0)
    assert sorted(t.id for t in wl.tasks) == sorted(sessions)
    calls = {c.input_tokens: c for c in wl.all_calls()}
    for e in events:
        req = e["request"]
        call = calls[req["input_tokens"]]
        assert call.output_tokens == req["output_tokens"]
        assert call.server_time == pytest.approx(req["total_time_ms"] / 1000, abs=1e-6)
        assert call.hash_ids == tuple(h % 2**63 for h in req["replay"]["input_sequence_hashes"])
        assert call.block_size == req["replay"]["trace_block_size"] == 16
        assert (call.model, call.stop_reason) == (req["model"], req["finish_reason_metadata"]["finish_reason"])
    first = min(e["request"]["request_received_ms"] for e in events)
    assert sorted(t.arrival for t in wl.tasks) == pytest.approx(
        sorted((e["request"]["request_received_ms"] - first) / 1000 for e in events))
    # the orchestrators share their system prompt: the two prompts share their leading blocks
    a, b = (c.hash_ids for c in wl.all_calls())
    assert a[:443] == b[:443] and a[443] != b[443]
    # what traces/README.md says of it
    assert [(e["request"]["input_tokens"], e["request"]["output_tokens"]) for e in events] == [(7205, 229), (7186, 229)]


def test_lineage_becomes_sub_tasks_with_spawn_points_and_joins():
    wl = load([FIXTURE])
    by_id = {t.id: t for t in wl.tasks}
    assert sorted(by_id) == ["chat-7", "research-run-42"]
    run = by_id["research-run-42"]
    assert run.task_class == "deep_research"
    assert [c.input_tokens for c in run.calls] == [256, 384, 640]
    subs = {s.task.id: s for s in run.subtasks}
    fetcher = subs["research-run-42/research-run-42:fetcher"]
    researcher = subs["research-run-42/research-run-42:researcher"]
    # the fetcher started after call 0 ended and call 1 was sent while it ran: not waited for
    assert (fetcher.after_call, fetcher.wait) == (0, False)
    # the researcher started after call 1 ended, and call 2 came only after it finished: waited for
    assert (researcher.after_call, researcher.wait) == (1, True)
    # gaps from the previous end; call 2's from the researcher's end (5.0 s), not call 1's (2.5 s)
    assert [c.gap for c in run.calls] == [0.0, 0.5, 0.4]
    assert [c.sent_at for c in run.calls] == [0.0, 1.5, 5.4]
    assert [c.server_time for c in run.calls] == [1.0, 1.0, 1.2]
    assert [c.gap for c in researcher.task.calls] == [0.2, 0.8]  # from the spawning call's end, then between calls
    assert [c.stop_reason for c in run.calls] == ["tool_calls", "tool_calls", "stop"]
    # prompts share leading blocks across the parent and its sub-agents (the same system prompt)
    assert researcher.task.calls[0].hash_ids == run.calls[0].hash_ids[:3]
    chat = by_id["chat-7"]
    assert chat.arrival == 0.8 and [c.gap for c in chat.calls] == [0.0, 8.0] and chat.calls[1].hash_ids == ()
    notes = " ".join(wl.provenance[0].notes)
    # tool spans inside gaps between calls: 0.3 + 1.55 + 0.55 s (two overlapping reads counted once) of 11.4 s
    assert "8 tool records; tool spans cover 21.1% of the time between the calls of a trajectory" in notes
    assert "(2.400 of 11.400 s)" in notes and "1 requests have no replay hashes" in notes


def _variant(tmp_path: Path, name: str, change) -> Path:
    lines = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
    path = tmp_path / name
    path.write_text("".join(json.dumps(change(line)) + "\n" for line in lines))
    return path


def _shape(wl):
    return sorted((t.id, t.arrival, [(c.input_tokens, c.gap, c.hash_ids) for c in t.calls],
                   [(s.after_call, s.wait, s.task.id) for s in t.subtasks]) for t in wl.tasks)


def test_bare_records_and_old_field_names_read_the_same(tmp_path):
    want = _shape(load([FIXTURE]))
    assert _shape(load([_variant(tmp_path, "bare.jsonl", lambda line: line["event"])])) == want

    def old_names(line):
        ctx = line["event"]["agent_context"]
        for new, old in (("session_id", "workflow_id"), ("trajectory_id", "program_id"),
                         ("parent_trajectory_id", "parent_program_id"), ("session_type_id", "workflow_type_id")):
            if new in ctx:
                ctx[old] = ctx.pop(new)
        return line

    assert _shape(load([_variant(tmp_path, "old.jsonl", old_names)])) == want


def test_gzip_members_and_rolled_segments_read_as_one_trace(tmp_path):
    lines = FIXTURE.read_bytes().splitlines(keepends=True)
    one = tmp_path / "one" / "trace.000000.jsonl.gz"
    one.parent.mkdir()
    with open(one, "wb") as fh:  # the jsonl_gz sink appends one gzip member per flush
        fh.write(gzip.compress(b"".join(lines[:5])) + gzip.compress(b"".join(lines[5:])))
    assert detect(one) is dynamo
    want = _shape(load([FIXTURE]))
    assert _shape(load([one])) == want
    rolled = tmp_path / "rolled"
    rolled.mkdir()
    (rolled / "trace.000000.jsonl.gz").write_bytes(gzip.compress(b"".join(lines[:9])))
    (rolled / "trace.000001.jsonl.gz").write_bytes(gzip.compress(b"".join(lines[9:])))
    assert _shape(load([rolled])) == want  # trajectories that run across the two segments stay whole


def test_truncated_gzip_names_the_line_and_skip_keeps_what_was_read(tmp_path):
    data = gzip.compress(FIXTURE.read_bytes())
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=r"cut\.jsonl\.gz:\d+: the compressed stream ends early"):
        load([cut])
    wl = load([cut], on_error="skip")
    assert 0 < wl.counts()[1] < 9 and "ends early" in " ".join(wl.provenance[0].notes)


def test_sniffing_keeps_formats_apart():
    for path in (EXCERPT, FIXTURE):
        assert detect(path) is dynamo
        head = path.read_bytes()[:65536]
        assert [m.FORMAT for m in importers().values() if m.sniff(path, head)] == ["dynamo"]
    for sample in sorted((ROOT / "traces").rglob("*")) + sorted((ROOT / "tests" / "fixtures").glob("*")):
        if sample.is_file() and sample not in (EXCERPT, FIXTURE):
            assert not dynamo.sniff(sample, sample.read_bytes()[:65536]), sample


def test_round_trips_through_native(tmp_path):
    for path in (EXCERPT, FIXTURE):
        wl = load([path])
        native.write(wl, tmp_path / "w.jsonl")
        again = load([tmp_path / "w.jsonl"])
        assert again.tasks == wl.tasks and again.provenance == wl.provenance


def _request(rid="r1", trajectory="t1", parent=None, start=1000, total=500.0, **request):
    ctx = {"session_type_id": "k", "session_id": "s1", "trajectory_id": trajectory}
    if parent:
        ctx["parent_trajectory_id"] = parent
    req = {"request_id": rid, "model": "m", "input_tokens": 100, "output_tokens": 10, "request_received_ms": start,
           "total_time_ms": total, "replay": {"trace_block_size": 16, "input_length": 100,
                                             "input_sequence_hashes": [2**64 - 1, 5]}}
    req.update(request)
    return {"timestamp": 1, "event": {"schema": dynamo.SCHEMA, "event_type": "request_end",
                                      "event_time_unix_ms": start + int(total), "event_source": "dynamo",
                                      "agent_context": ctx, "request": req}}


def _drop(line: dict, *keys: str) -> dict:
    node = line["event"]
    for key in keys[:-1]:
        node = node[key]
    del node[keys[-1]]
    return line


@pytest.mark.parametrize("bad, path, field, words", [
    (_drop(_request("r2"), "request", "output_tokens"), "$.event.request.output_tokens", "output_tokens", "missing"),
    (_request("r2", input_tokens="100"), "$.event.request.input_tokens", "input_tokens", "whole number"),
    (_request("r2", output_tokens=-4), "$.event.request.output_tokens", "output_tokens", "whole number"),
    (_request("r2", total=-5.0), "$.event.request.total_time_ms", "total_time_ms", "non-negative"),
    (_request("r2", replay={"trace_block_size": 16, "input_length": 100, "input_sequence_hashes": [2**64]}),
     "$.event.request.replay.input_sequence_hashes", "input_sequence_hashes", "64-bit"),
    (_request("r2", replay={"trace_block_size": 0, "input_length": 100, "input_sequence_hashes": [1]}),
     "$.event.request.replay.trace_block_size", "trace_block_size", "positive"),
    (_drop(_request("r2"), "agent_context", "session_id"), "$.event.agent_context.session_id", "session_id", "missing"),
    (_drop(_request("r2"), "schema"), "$.event.schema", "schema", "missing"),
    (_request("r1"), "$.event.request.request_id", "request_id", "seen twice"),
])
def test_bad_record_names_file_line_path_and_field(tmp_path, bad, path, field, words):
    file = tmp_path / "bad.jsonl"
    file.write_text(json.dumps(_request("r1")) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(InputError) as err:
        load([file], format="dynamo")
    text = str(err.value)
    assert (err.value.line, err.value.path, err.value.field) == (2, path, field), text
    assert "bad.jsonl:2" in text and words in text


def test_bad_json_other_schema_and_no_requests(tmp_path):
    cut = tmp_path / "cut.jsonl"
    cut.write_text(json.dumps(_request()) + "\n" + json.dumps(_request("r2"))[:50] + "\n")
    with pytest.raises(InputError, match=r"cut\.jsonl:2: not JSON"):
        load([cut], format="dynamo")
    other = _request("r2")
    other["event"]["schema"] = "dynamo.agent.trace.v9"
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text(json.dumps(_request()) + "\n" + json.dumps(other) + "\n")
    with pytest.raises(InputError, match="not 'dynamo.agent.trace.v1'"):
        load([wrong])
    tools_only = tmp_path / "tools.jsonl"
    tool_lines = [line for line in FIXTURE.read_text().splitlines() if '"event_type":"tool_' in line]
    tools_only.write_text("\n".join(tool_lines) + "\n")
    with pytest.raises(InputError, match="no request_end records"):
        load([tools_only], format="dynamo")


def test_conflicting_parents_and_loops_are_bad(tmp_path):
    two = tmp_path / "two.jsonl"
    two.write_text(json.dumps(_request("a", "t1")) + "\n" + json.dumps(_request("b", "t2", parent="t1")) + "\n"
                   + json.dumps(_request("c", "t2", parent="t9", start=3000)) + "\n")
    with pytest.raises(InputError) as err:
        load([two])
    assert (err.value.line, err.value.field) == (3, "parent_trajectory_id") and "t1 and t9" in str(err.value)
    loop = tmp_path / "loop.jsonl"
    loop.write_text(json.dumps(_request("a", "t1")) + "\n" + json.dumps(_request("b", "t2", parent="t3")) + "\n"
                    + json.dumps(_request("c", "t3", parent="t2", start=3000)) + "\n")
    with pytest.raises(InputError) as err:
        load([loop])
    assert (err.value.line, err.value.field) == (2, "parent_trajectory_id") and "loop" in str(err.value)


def test_skip_leaves_bad_records_out_and_says_so(tmp_path):
    path = tmp_path / "bad.jsonl"
    unknown = _request("x")
    unknown["event"]["event_type"] = "request_start"
    path.write_text("\n".join([
        json.dumps(_request("r1")),
        json.dumps(_request("r2", output_tokens=-1, start=2000)),
        "{not json",
        json.dumps(unknown),
        json.dumps(_request("r3", start=3000)),
    ]) + "\n")
    wl = load([path], on_error="skip")
    assert wl.counts() == (1, 2, 0)
    notes = " ".join(wl.provenance[0].notes)
    assert "skipped 1 record(s): output_tokens" in notes and "not JSON" in notes
    assert "records of event types not read: request_start (1)" in notes
