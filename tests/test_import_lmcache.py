"""LMCache agent traces (lmcache-agent-trace JSONL: timestamp, input text, output text, session_id): counts,
order and timing against the raw lines, token estimates, hash ids from the text, units, native round trip,
and errors that name the file, the line and the field."""

import json
import math
from pathlib import Path

import pytest

from simulator.errors import InputError
from simulator.hash_ids import common_prefix
from simulator.traces import detect, lmcache, load, native
from simulator.traces.content import BYTES_PER_TOKEN

SAMPLES = Path(__file__).resolve().parents[1] / "traces" / "lmcache"
FILES = sorted(SAMPLES.glob("*/*.jsonl"))
MINISWE = SAMPLES / "miniswe" / "189f0222310bd8eee310f204e91b9c84.jsonl"
TAUBENCH = SAMPLES / "taubench" / "5cacdab43997ef46db773ba7a7d4aa13.jsonl"


def _raw(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _estimate(text: str) -> int:
    return math.ceil(len(text.encode("utf-8")) / BYTES_PER_TOKEN)


def test_the_excerpt_is_the_three_published_files():
    assert [f.relative_to(SAMPLES).parts[0] for f in FILES] == ["magagent", "miniswe", "taubench"]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.parent.name)
def test_each_file_imports_with_its_sessions_and_calls_in_time_order(path):
    rows = _raw(path)
    assert detect(path) is lmcache
    workload = load([path])
    assert workload.counts() == (len({r["session_id"] for r in rows}), len(rows), 0)
    for task in workload.tasks:
        mine = sorted((r for r in rows if r["session_id"] == task.id), key=lambda r: r["timestamp"])
        first = mine[0]["timestamp"]
        assert [c.sent_at for c in task.calls] == [round((r["timestamp"] - first) / 1e6, 6) for r in mine]
        assert [c.input_tokens for c in task.calls] == [_estimate(r["input"]) for r in mine]
        assert [c.output_tokens for c in task.calls] == [_estimate(r["output"]) for r in mine]
        assert task.calls[0].gap == 0.0
        assert [c.gap for c in task.calls[1:]] == [round((b["timestamp"] - a["timestamp"]) / 1e6, 6)
                                                   for a, b in zip(mine, mine[1:])]
        assert all(c.server_time is None and c.messages is None for c in task.calls)
        assert all(len(c.hash_ids) <= c.input_tokens // 16 for c in task.calls)
        assert task.task_class == "lmcache"
    notes = workload.provenance[0].notes
    assert notes[0].startswith(f"sessions: 1, calls: {len(rows)}; the trace has text, not token counts")
    assert notes[1].startswith("timestamps read as microseconds")


def test_an_agent_that_appends_to_its_prompt_shares_its_previous_blocks():
    rows = sorted(_raw(MINISWE), key=lambda r: r["timestamp"])
    calls = load([MINISWE]).tasks[0].calls
    for (a, b), (prev, call) in zip(zip(rows, rows[1:]), zip(calls, calls[1:])):
        assert b["input"].startswith(a["input"])  # mini-SWE-agent appends each command's output
        # all blocks but those of the paragraph the new text continues
        assert common_prefix(prev.hash_ids, call.hash_ids) >= len(prev.hash_ids) - 2
        assert len(call.hash_ids) > len(prev.hash_ids) or call.input_tokens - prev.input_tokens < 16


def test_equal_prompts_get_equal_ids_and_other_prompts_do_not():
    rows = sorted(_raw(TAUBENCH), key=lambda r: r["timestamp"])
    calls = load([TAUBENCH]).tasks[0].calls
    for (a, b), (prev, call) in zip(zip(rows, rows[1:]), zip(calls, calls[1:])):
        if a["input"] == b["input"]:
            assert call.hash_ids == prev.hash_ids
        elif not b["input"].startswith(a["input"][:16 * BYTES_PER_TOKEN]):
            assert common_prefix(prev.hash_ids, call.hash_ids) == 0


def test_the_same_text_in_two_files_gets_the_same_ids(tmp_path):
    line = _raw(MINISWE)[0]
    for name in ("a", "b"):
        (tmp_path / f"{name}.jsonl").write_text(json.dumps({**line, "session_id": name}) + "\n")
    one, two = load([tmp_path]).tasks
    assert one.calls[0].hash_ids == two.calls[0].hash_ids and len(one.calls[0].hash_ids) > 50


def test_sample_folder_round_trips_through_native(tmp_path):
    workload = load([SAMPLES])
    assert workload.counts() == (3, sum(len(_raw(f)) for f in FILES), 0)
    out = tmp_path / "w.jsonl"
    native.write(workload, out)
    again = load([out])
    assert again.tasks == workload.tasks and again.provenance == workload.provenance


@pytest.mark.parametrize("stamps, unit, gaps", [
    ([0, 120, 240], "seconds", [120.0, 120.0]),  # seconds from the trace's start (coordination_agent)
    ([1_700_000_000_000, 1_700_000_002_500, 1_700_000_003_000], "milliseconds", [2.5, 0.5]),
    ([1_760_000_000_000_000, 1_760_000_001_000_000, 1_760_000_001_250_000], "microseconds", [1.0, 0.25]),
])
def test_the_timestamp_unit_comes_from_the_magnitude(tmp_path, stamps, unit, gaps):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"timestamp": t, "input": f"step {i}", "output": "ok", "session_id": "s"}) + "\n"
                            for i, t in enumerate(reversed(stamps))))
    workload = load([path])
    assert [c.gap for c in workload.tasks[0].calls[1:]] == gaps
    assert workload.provenance[0].notes[1].startswith(f"timestamps read as {unit}")


def test_sessions_of_one_file_arrive_at_their_first_call(tmp_path):
    lines = [{"timestamp": 10, "input": "a", "output": "", "session_id": "x"},
             {"timestamp": 40, "input": "b", "output": "", "session_id": "y"},
             {"timestamp": 55, "input": "a\n\nmore", "output": "", "session_id": "x"}]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    tasks = {t.id: t for t in load([path]).tasks}
    assert (tasks["x"].arrival, tasks["y"].arrival) == (0.0, 30.0)
    assert [c.sent_at for c in tasks["x"].calls] == [0.0, 45.0]
    assert tasks["x"].calls[1].output_tokens == 0


def test_sniffing_tells_it_from_the_other_line_formats():
    assert detect(FILES[0]) is lmcache
    for other in ("tracelab/round_trace.jsonl", "mooncake/conversation_trace_head200.jsonl"):
        path = SAMPLES.parent / other
        assert not lmcache.sniff(path, path.read_bytes()[:65536])
    # a first line longer than the head still sniffs: the keys come first
    long_line = json.dumps({"timestamp": 1, "input": "x" * 100_000, "output": "", "session_id": "s"}).encode()
    assert lmcache.sniff(Path("long.jsonl"), long_line[:65536])
    assert not lmcache.sniff(Path("n.jsonl"), b'{"agentload_trace": 1}\n{"input": "x", "timestamp": 1}')


GOOD = {"timestamp": 1_760_000_000_000_000, "input": "hello", "output": "hi", "session_id": "s"}


@pytest.mark.parametrize("line, field", [
    ({**GOOD, "timestamp": -5}, "timestamp"),
    ({**GOOD, "timestamp": "now"}, "timestamp"),
    ({k: v for k, v in GOOD.items() if k != "timestamp"}, "timestamp"),
    ({**GOOD, "input": ["hello"]}, "input"),
    ({k: v for k, v in GOOD.items() if k != "output"}, "output"),
    ({**GOOD, "session_id": 7}, "session_id"),
    ({**GOOD, "session_id": ""}, "session_id"),
])
def test_a_bad_line_names_file_line_and_field(tmp_path, line, field):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n" + json.dumps(line) + "\n")
    with pytest.raises(InputError) as err:
        load([path], format="lmcache")
    assert (err.value.file, err.value.line, err.value.field) == (str(path), 3, field)
    assert f"t.jsonl:3: field '{field}'" in str(err.value)
    workload = load([path], format="lmcache", on_error="skip")
    assert workload.counts() == (1, 1, 0)
    assert any(n.startswith(f"skipped 1 record(s): {field}:") for n in workload.provenance[0].notes)


def test_a_cut_last_line_and_an_empty_file(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps(GOOD)[:30])
    with pytest.raises(InputError) as err:
        load([path])
    assert err.value.line == 2 and "invalid JSON" in str(err.value)
    assert load([path], on_error="skip").counts() == (1, 1, 0)
    path.write_text("\n")
    with pytest.raises(InputError, match="empty file"):
        load([path], format="lmcache")


def test_times_beyond_a_workload_are_input_errors(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({**GOOD, "timestamp": 0}) + "\n" + json.dumps({**GOOD, "timestamp": 5e10}) + "\n")
    with pytest.raises(InputError) as err:
        load([path])
    assert (err.value.line, err.value.field) == (2, "timestamp")
