"""TraceLab importers (round_trace.jsonl and replay CSVs) and the prefix id helper: counts and
fields against the raw rows, timing from events, synthesised prefix reuse, native round trip, errors."""

import csv
import gzip
import itertools
import json
from datetime import datetime
from pathlib import Path

import pytest

from simulator.errors import InputError
from simulator.traces import detect, load, native, tracelab, tracelab_csv
from simulator.traces.prefix import extend_prefix, fresh_ids, namespace

SAMPLES = Path(__file__).resolve().parents[1] / "traces" / "tracelab"
JSONL = SAMPLES / "round_trace.jsonl"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces" / "tracelab"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="shared TraceLab traces not present")


def _shared_prefix(a, b) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


# ---- prefix helper ---------------------------------------------------------------------------

def test_extend_prefix_keeps_whole_reused_blocks_then_fresh_ids():
    fresh = itertools.count(100)
    first = extend_prefix((), 0, 200, 64, fresh)
    assert first == (100, 101, 102)  # 200 // 64 blocks, the partial one has no id
    second = extend_prefix(first, 150, 400, 64, fresh)
    assert second == (100, 101, 103, 104, 105, 106)  # 150 // 64 = 2 reused
    # Reuse beyond the previous prompt can only repeat what it had.
    third = extend_prefix(first, 10_000, 320, 64, fresh)
    assert third[:3] == first and len(third) == 5 and third[3:] == (107, 108)
    assert extend_prefix(second, 400, 130, 64, fresh) == (100, 101)
    with pytest.raises(ValueError):
        extend_prefix((), 0, 10, 0, fresh)


def test_namespaces_are_deterministic_distinct_and_fit_int64():
    assert namespace("a") == namespace("a") != namespace("b")
    assert namespace("a") % 2**32 == 0 and namespace("zz") < 2**63
    assert next(fresh_ids("a")) == namespace("a") + 1


# ---- round_trace.jsonl -----------------------------------------------------------------------

def _raw_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize(
    "path",
    [JSONL]
    + ([SHARED / "example_sessions" / "derived" / "round_trace.jsonl"] if SHARED.is_dir() else []),
)
def test_jsonl_counts_and_token_fields_match_the_rows(path):
    rows = _raw_rows(path)
    workload = load([path])
    assert workload.counts() == (len({r["session_id"] for r in rows}), len(rows), 0)
    tasks = {t.id: t for t in workload.tasks}
    for session, task in tasks.items():
        mine = sorted((r for r in rows if r["session_id"] == session), key=lambda r: r["round_index"])
        assert [c.input_tokens for c in task.calls] == [r["input_tokens_total"] for r in mine]
        assert [c.output_tokens for c in task.calls] == [r["output_tokens"] for r in mine]
        assert task.task_class == mine[0]["provider"]
        for prev, call, row in zip(task.calls, task.calls[1:], mine[1:]):
            expected = min(row["prefix_tokens"] // 64, len(prev.hash_ids), len(call.hash_ids))
            assert _shared_prefix(prev.hash_ids, call.hash_ids) == expected
            assert len(call.hash_ids) == row["input_tokens_total"] // 64


def test_jsonl_timing_comes_from_events():
    rows = {(r["provider"], r["round_index"]): r for r in _raw_rows(JSONL)}
    tasks = {t.task_class: t for t in load([JSONL]).tasks}
    codex, claude = tasks["codex"], tasks["claude"]
    # Round 1 is sent when its last tool result arrived; round 0 ended with its usage report.
    assert codex.calls[1].gap == pytest.approx(
        _ts(rows["codex", 1]["timing_events"][2]["timestamp"]) - _ts(rows["codex", 0]["timing_events"][-1]["timestamp"])
    )
    assert codex.calls[1].gap == pytest.approx(1.162)
    # Parallel tools: the gap is the longest tool, not their sum.
    lat = [t["tool_wall_latency_ms"] for t in rows["claude", 0]["tools"]]
    assert claude.calls[1].gap == pytest.approx(max(lat) / 1000, abs=0.002)
    # A user message after a round without tools: the user's think time (19.9 s), which tool
    # latencies alone would miss.
    assert rows["claude", 4]["tools"] == []
    assert claude.calls[5].gap == pytest.approx(_ts("2026-06-01T05:42:43.333Z") - _ts("2026-06-01T05:42:23.420Z"))
    assert claude.calls[0].server_time == pytest.approx(_ts("2026-06-01T05:40:31.647Z") - _ts("2026-06-01T05:40:20.151Z"))
    assert claude.calls[0].sent_at == 0.0 and claude.calls[1].sent_at == pytest.approx(30.787)
    # Arrivals: relative to the earliest session in the file.
    assert codex.arrival == 0.0
    assert claude.arrival == pytest.approx(_ts("2026-06-01T05:40:20.151Z") - _ts("2026-03-21T10:05:59.328Z"))


def test_jsonl_without_timestamps_falls_back_to_tool_latency(tmp_path):
    rows = [
        {"session_id": "s", "round_index": 1, "input_tokens_total": 300, "prefix_tokens": 200, "output_tokens": 5},
        {"session_id": "s", "round_index": 0, "input_tokens_total": 200, "prefix_tokens": 0, "output_tokens": 9,
         "tools": [{"tool_wall_latency_ms": 1500}, {"tool_wall_latency_ms": 400}]},
    ]
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    task = load([path]).tasks[0]
    assert [c.output_tokens for c in task.calls] == [9, 5]  # ordered by round_index
    assert [c.gap for c in task.calls] == [0.0, 1.5]
    assert task.calls[1].server_time is None and task.arrival == 0.0 and task.task_class == "tracelab"


@pytest.mark.parametrize(
    "row, field",
    [
        ({"output_tokens": -1}, "output_tokens"),
        ({"input_tokens_total": "big"}, "input_tokens_total"),
        ({"prefix_tokens": 10_000}, "prefix_tokens"),
        ({"session_id": None}, "session_id"),
        ({"round_index": 0}, "round_index"),  # a second round 0
    ],
)
def test_jsonl_bad_row_names_line_and_field(tmp_path, row, field):
    good = {"session_id": "s", "round_index": 0, "input_tokens_total": 300, "prefix_tokens": 0, "output_tokens": 5}
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(good) + "\n\n" + json.dumps({**good, "round_index": 1, **row}) + "\n")
    with pytest.raises(InputError) as err:
        load([path])
    assert err.value.line == 3 and err.value.field == field and "r.jsonl:3" in str(err.value)
    workload = load([path], on_error="skip")
    assert workload.counts() == (1, 1, 0)
    assert "skipped 1 record(s)" in workload.provenance[0].notes[0]


def test_jsonl_bad_json_and_bad_timestamp(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"session_id": "s", "round_index": 0, "input_tokens_total": 1, "output_tokens": 1}\n{"session_id": ')
    with pytest.raises(InputError) as err:
        load([path], format="tracelab")
    assert err.value.line == 2 and "invalid JSON" in str(err.value)
    path.write_text(json.dumps({"session_id": "s", "round_index": 0, "input_tokens_total": 1, "output_tokens": 1,
                                "timing_events": [{"event_type": "text", "timestamp": "yesterday"}]}) + "\n")
    with pytest.raises(InputError) as err:
        load([path])
    assert err.value.path == "$.timing_events[0].timestamp"


def test_jsonl_empty_file(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text("\n")
    with pytest.raises(InputError, match="empty file"):
        load([path])
    with pytest.raises(InputError, match="empty file"):
        load([path], format="tracelab")


# ---- replay CSVs -----------------------------------------------------------------------------

def _csv_rows(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.parametrize("name", ["multi_session_example.csv", "multi_session_large.csv", "session_workload_example.csv"])
def test_csv_counts_and_fields_match_the_rows(name):
    path = SAMPLES / name
    rows = _csv_rows(path)
    tasks = {t.id: t for t in load([path]).tasks}
    sessions = {r["session_id"] for r in rows}
    assert set(tasks) == {f"{path.stem}:{s}" for s in sessions}
    assert sum(len(t.calls) for t in tasks.values()) == len(rows)
    for session in sessions:
        mine = sorted((r for r in rows if r["session_id"] == session), key=lambda r: int(r["round_idx"]))
        task = tasks[f"{path.stem}:{session}"]
        assert [c.input_tokens for c in task.calls] == [int(r["prefix_len"]) + int(r["input_len"]) for r in mine]
        assert [c.output_tokens for c in task.calls] == [int(r["output_len"]) for r in mine]
        assert [c.gap for c in task.calls] == [0.0] + [int(r["tool_wait_after_ms"]) / 1000 for r in mine[:-1]]
        assert task.arrival == int(mine[0].get("arrival_time") or 0) / 1000
        for prev, call, row in zip(task.calls, task.calls[1:], mine[1:]):
            assert _shared_prefix(prev.hash_ids, call.hash_ids) == min(int(row["prefix_len"]) // 64, len(prev.hash_ids))


def test_csv_exact_values_of_the_multi_session_example():
    tasks = {t.id: t for t in load([SAMPLES / "multi_session_example.csv"]).tasks}
    s2 = tasks["multi_session_example:2"]
    assert s2.arrival == 0.5
    assert [(c.input_tokens, c.output_tokens, c.gap) for c in s2.calls] == [(600, 64, 0.0), (784, 48, 0.05), (864, 48, 0.05)]
    assert s2.calls[1].hash_ids[:9] == s2.calls[0].hash_ids[:9] and len(s2.calls[1].hash_ids) == 12


def test_csv_canonical_header_form(tmp_path):
    path = tmp_path / "canon.csv"
    path.write_text("id,input_len,output_len,arrival_time,round_idx,tool_wait_after_ms,prefix_len\n"
                    "a,100,10,2500,1,0,228\n"
                    "a,200,20,2500,0,750,0\n")
    assert detect(path) is tracelab_csv
    task = load([path]).tasks[0]
    assert task.id == "canon:a" and task.arrival == 2.5
    assert [(c.input_tokens, c.output_tokens, c.gap) for c in task.calls] == [(200, 20, 0.0), (328, 10, 0.75)]


def test_csv_bad_cell_names_line_and_column(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("session_id,round_idx,prefix_len,input_len,output_len,tool_wait_after_ms\n"
                    "0,0,0,512,64,100\n"
                    "0,1,576,lots,64,0\n"
                    "0,2,576,-5,64,0\n")
    with pytest.raises(InputError) as err:
        load([path])
    assert err.value.line == 3 and err.value.field == "input_len" and "column 4" in str(err.value)
    workload = load([path], on_error="skip")
    assert workload.counts() == (1, 1, 0)
    assert "skipped 2 record(s)" in workload.provenance[0].notes[0]


def test_csv_missing_column_and_empty(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("session_id,round_idx,prefix_len,input_len,output_len\n0,0,0,1,1\n")
    with pytest.raises(InputError) as err:
        load([path], format="tracelab-csv")
    assert err.value.line == 1 and err.value.field == "tool_wait_after_ms"
    path.write_text("")
    with pytest.raises(InputError, match="empty file"):
        load([path], format="tracelab-csv")


# ---- both --------------------------------------------------------------------------------------

def test_sniffing_picks_the_right_importer():
    assert detect(JSONL) is tracelab
    assert detect(SAMPLES / "multi_session_large.csv") is tracelab_csv


def test_sample_folder_round_trips_through_native(tmp_path):
    workload = load([SAMPLES])
    assert {p.format for p in workload.provenance} == {"tracelab", "tracelab-csv"}
    assert workload.counts() == (2 + 52, 19 + 322, 0)
    out = tmp_path / "w.jsonl"
    native.write(workload, out)
    again = load([out])
    assert again.tasks == workload.tasks and again.provenance == workload.provenance


@needs_shared
def test_samples_equal_the_shared_originals():
    shared = load([SHARED / "example_sessions" / "sanitized" / "round_trace.jsonl"])
    assert shared.tasks == load([JSONL]).tasks
    assert load([SHARED / "replay" / "examples"]).counts() == (52, 322, 0)


def test_a_folder_skips_files_of_no_known_format_and_says_so(tmp_path):
    (tmp_path / "round_trace.jsonl").write_bytes(JSONL.read_bytes())
    (tmp_path / "round_trace.expanded.json").write_text("# a pretty-printed view\n===== round 0001 =====\n{\n")
    workload = load([tmp_path])
    assert workload.tasks == load([JSONL]).tasks
    notes = [n for p in workload.provenance for n in p.notes]
    assert any("skipped" in n and "round_trace.expanded.json" in n for n in notes)
    # a file named alone is still an error, and so is a folder with nothing known in it
    with pytest.raises(InputError, match="unknown trace format"):
        load([tmp_path / "round_trace.expanded.json"])
    (tmp_path / "round_trace.jsonl").unlink()
    with pytest.raises(InputError, match="no file in this folder"):
        load([tmp_path])


# ---- bad input and memory (issue 17) -----------------------------------------------------------------

def _round(**fields) -> dict:
    row = {"session_id": "s", "round_index": 0, "input_tokens_total": 100, "output_tokens": 5}
    row.update(fields)
    return row


@pytest.mark.parametrize("events, field", [
    ([{"timestamp": "2025-01-01T00:00:00", "event_type": ["user_message"]}], "event_type"),
    ([["2025-01-01T00:00:00"]], "timing_events"),
    ([{"timestamp": "2025-02-30T00:00:00"}], "timestamp"),
])
def test_jsonl_events_of_the_wrong_shape_are_input_errors(tmp_path, events, field):
    path = tmp_path / "round_trace.jsonl"
    path.write_text(json.dumps(_round(timing_events=events)) + "\n")
    with pytest.raises(InputError) as err:
        load([path])
    assert err.value.line == 1 and err.value.field == field


def test_jsonl_nested_too_deep_is_an_input_error(tmp_path):
    path = tmp_path / "round_trace.jsonl"
    path.write_text('{"round_index": 0, "input_tokens_total": 1, "x": ' + "[" * 5000 + "]" * 5000 + "}\n")
    with pytest.raises(InputError) as err:
        load([path], format="tracelab")
    assert err.value.line == 1 and "JSON" in str(err.value)


def test_jsonl_token_counts_beyond_the_cap_are_input_errors(tmp_path):
    path = tmp_path / "round_trace.jsonl"
    path.write_text(json.dumps(_round(input_tokens_total=2**63)) + "\n")
    with pytest.raises(InputError) as err:
        load([path])
    assert err.value.field == "input_tokens_total" and "16,777,216" in str(err.value)


def test_jsonl_times_beyond_a_workload_are_input_errors(tmp_path):
    path = tmp_path / "round_trace.jsonl"
    rows = [_round(session_id="a", timing_events=[{"timestamp": "2025-01-01T00:00:00", "event_type": "user_message"}]),
            _round(session_id="b", timing_events=[{"timestamp": "9999-01-01T00:00:00", "event_type": "user_message"}])]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(InputError) as err:
        load([path])
    assert err.value.line == 2 and "longer than" in str(err.value)
    assert [t.id for t in load([path], on_error="skip").tasks] == ["a"]


def test_csv_row_at_the_token_cap_costs_no_memory_and_one_beyond_is_refused(tmp_path):
    from simulator.workload import MAX_TOKENS

    path = tmp_path / "big.csv"
    path.write_text("session_id,round_idx,prefix_len,input_len,output_len,tool_wait_after_ms\n"
                    f"0,0,0,{MAX_TOKENS},10,0\n0,1,{MAX_TOKENS - 64},64,10,0\n")
    first, second = load([path]).tasks[0].calls
    assert len(first.hash_ids) == MAX_TOKENS // 64 and len(list(first.hash_ids.runs())) == 1  # one run, not 262,144 ints
    assert second.hash_ids[: len(first.hash_ids) - 1] == first.hash_ids[:-1]
    huge = tmp_path / "huge.csv"
    huge.write_text("session_id,round_idx,prefix_len,input_len,output_len,tool_wait_after_ms\n0,0,0,640000000,10,0\n")
    with pytest.raises(InputError) as err:
        load([huge])
    assert err.value.line == 2 and err.value.field == "input_len"


def test_csv_in_latin1_reads_with_a_note(tmp_path):
    path = tmp_path / "s.csv"
    path.write_bytes(b"session_id,round_idx,prefix_len,input_len,output_len,tool_wait_after_ms\nsessi\xf3n,0,0,100,10,0\n")
    wl = load([path])
    assert wl.tasks[0].id == "s:sessi\xf3n" and "Latin-1" in wl.provenance[0].notes[0]


def test_calls_of_a_session_share_their_hash_ids():
    wl = load([SAMPLES / "round_trace.jsonl"])
    task = max(wl.tasks, key=lambda t: len(t.calls))
    chains = {id(c.hash_ids._chain) for c in task.calls if c.hash_ids}
    assert len(chains) < len(task.calls)  # calls that extend the previous one share its chain


# ---- the current release (v0.0.1, issue 35): gzip asset, duplicated rounds, internal tool latency -------------

def test_the_release_gzip_file_reads_as_its_jsonl(tmp_path):
    # The release ships syfi_coding_trace.jsonl.gz: the rows of round_trace.jsonl, compressed.
    path = tmp_path / "syfi_coding_trace.jsonl.gz"
    path.write_bytes(gzip.compress(JSONL.read_bytes()))
    assert detect(path) is tracelab
    rows = _raw_rows(JSONL)
    workload = load([path])
    assert workload.counts() == (len({r["session_id"] for r in rows}), len(rows), 0)
    assert workload.tasks == load([JSONL]).tasks
    folder = tmp_path / "release"
    folder.mkdir()
    (folder / path.name).write_bytes(path.read_bytes())
    assert load([folder]).tasks == workload.tasks


def test_a_cut_gzip_file_is_an_input_error_naming_the_line(tmp_path):
    data = gzip.compress(JSONL.read_bytes())
    path = tmp_path / "syfi_coding_trace.jsonl.gz"
    path.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(InputError) as err:
        load([path])
    assert err.value.file == str(path) and err.value.line > 1 and "gzip" in str(err.value)
    path.write_bytes(data[:10] + b"\x00" * 40 + data[50:])  # damaged in the middle
    with pytest.raises(InputError, match="gzip"):
        load([path], format="tracelab")


def test_a_round_copied_into_two_session_files_is_read_once_and_noted(tmp_path):
    rows = _raw_rows(JSONL)
    path = tmp_path / "merged.jsonl"
    # the release repeats a round under the same session, index and round_id (a resumed session's copy)
    copy = {**rows[3], "project": "elsewhere"}
    path.write_text("".join(json.dumps(r) + "\n" for r in rows + [copy]))
    workload = load([path])
    assert workload.tasks == load([JSONL]).tasks
    assert workload.provenance[0].notes == (
        "rows repeating a round already read (same session_id, round_index and round_id), left out: 1",)
    # another round under the same index is still bad input, naming the first one's line
    path.write_text("".join(json.dumps(r) + "\n" for r in rows + [{**copy, "round_id": "msg_other"}]))
    with pytest.raises(InputError) as err:
        load([path])
    assert err.value.line == len(rows) + 1 and err.value.field == "round_index" and "first on line 4" in str(err.value)


def test_the_gap_falls_back_to_the_internal_tool_latency(tmp_path):
    rows = [
        {"session_id": "s", "round_index": 0, "input_tokens_total": 200, "output_tokens": 9,
         "tools": [{"tool_wall_latency_ms": None, "tool_internal_latency_ms": 2500},
                   {"tool_wall_latency_ms": 700, "tool_internal_latency_ms": 650}]},
        {"session_id": "s", "round_index": 1, "input_tokens_total": 300, "prefix_tokens": 200, "output_tokens": 5},
    ]
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert [c.gap for c in load([path]).tasks[0].calls] == [0.0, 2.5]
    rows[0]["tools"][0]["tool_internal_latency_ms"] = -4
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(InputError) as err:
        load([path])
    assert (err.value.line, err.value.field) == (1, "tool_internal_latency_ms")
