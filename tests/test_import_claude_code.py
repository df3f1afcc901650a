"""Claude Code (kv-cache-tester JSON) importer: counts and fields against the raw files, sub-agents,
hash id namespaces, native round trip, and errors that name the file, JSON path and field."""

import json
from pathlib import Path

import pytest

from simulator.errors import ErrorPolicy, InputError
from simulator.traces import claude_code, detect, load, native
from simulator.traces.prefix import namespace

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "traces" / "claude-code"
WEKA = Path(__file__).resolve().parents[2] / "shared" / "traces" / "weka-claude-code"
needs_weka = pytest.mark.skipif(not WEKA.is_dir(), reason="shared Weka traces not present")
SAMPLE_FILES = 7  # traces/claude-code/*.json in the repository
WEKA_FILES = 130  # shared/traces/weka-claude-code/*.json (see its SOURCES.md)


def _json_files(folder: Path, at_least: int) -> list[Path]:
    """The folder's *.json files, failing (not passing vacuously) when fewer than expected are there."""
    files = sorted(folder.glob("*.json"))
    assert len(files) >= at_least, f"{folder}: {len(files)} *.json files, expected at least {at_least}"
    return files


def _raw_counts(folder: Path, at_least: int) -> tuple[int, int, int]:
    """(files, requests including nested sub-agent requests, sub-agent entries), straight from JSON."""
    calls = subs = 0

    def walk(requests):
        nonlocal calls, subs
        for req in requests:
            if req.get("type") == "subagent":
                subs += 1
                walk(req["requests"])
            else:
                calls += 1

    files = _json_files(folder, at_least)
    for file in files:
        walk(json.loads(file.read_text())["requests"])
    return len(files), calls, subs


def _parent_requests(file: Path) -> list[dict]:
    return [r for r in json.loads(file.read_text())["requests"] if r.get("type") != "subagent"]


@needs_weka
def test_whole_shared_folder_counts_match_the_raw_json_and_round_trip(tmp_path):
    workload = load([WEKA])
    assert workload.counts() == _raw_counts(WEKA, WEKA_FILES)
    assert {t.id for t in workload.tasks} == {p.stem for p in _json_files(WEKA, WEKA_FILES)}
    assert workload.provenance[0].format == "claude-code"
    out = tmp_path / "weka.jsonl"  # about 100 MB: removed at once
    try:
        native.write(workload, out)
        assert load([out]).tasks == workload.tasks
    finally:
        out.unlink(missing_ok=True)


@needs_weka
def test_every_parent_call_carries_its_request_fields():
    tasks = {t.id: t for t in load([WEKA]).tasks}
    for file in _json_files(WEKA, WEKA_FILES):
        task = tasks[file.stem]
        raw = _parent_requests(file)
        assert [c.input_tokens for c in task.calls] == [r["in"] for r in raw]
        assert [c.output_tokens for c in task.calls] == [r["out"] for r in raw]
        assert [c.sent_at for c in task.calls] == [r["t"] for r in raw]
        assert [c.server_time for c in task.calls] == [r.get("api_time") for r in raw]
        assert [len(c.hash_ids) for c in task.calls] == [len(r["hash_ids"]) for r in raw]
        if not task.subtasks:
            assert [c.gap for c in task.calls] == [r.get("think_time", 0.0) for r in raw]
        assert task.task_class == "claude-code" and task.arrival == 0.0


def test_subagents_of_trace_0277():
    task = load([SAMPLES / "trace_0277.json"]).tasks[0]
    raw = json.loads((SAMPLES / "trace_0277.json").read_text())["requests"]
    subs = [r for r in raw if r.get("type") == "subagent"]
    assert len(task.subtasks) == 4
    assert [s.task.id for s in task.subtasks] == [f"trace_0277/{r['agent_id']}" for r in subs]
    assert [s.task.task_class for s in task.subtasks] == ["Explore", "Explore", "Explore", "Plan"]
    assert [len(s.task.calls) for s in task.subtasks] == [len(r["requests"]) for r in subs]
    # Each sub-agent ends at its entry's t and started duration_ms earlier, right after a parent call;
    # the parent sent nothing while they ran, so it waits for all of them.
    assert [s.after_call for s in task.subtasks] == [0, 0, 0, 6]
    assert all(s.wait for s in task.subtasks)
    first = task.subtasks[0].task.calls[0]
    assert (first.input_tokens, first.output_tokens, first.model) == (11651, 205, "claude-haiku-4-5-20251001")
    assert first.hash_ids[0] == namespace("trace_0277") | 1448
    # The call after the three waited Explore agents: recorded think_time 209 s includes the wait for
    # the longest of them (191.873 s), which the behaviour already spends joining them.
    assert task.calls[1].sent_at == 228.0
    assert task.calls[1].gap == pytest.approx(209.0 - 191.873)
    assert task.calls[2].gap == 8.0


def test_exact_fields_of_a_small_session():
    task = load([SAMPLES / "trace_0103.json"]).tasks[0]
    call = task.calls[1]
    assert (call.input_tokens, call.output_tokens, call.gap, call.sent_at) == (15966, 130, 2.0, 5.0)
    assert (call.server_time, call.stop_reason, call.block_size) == (2.04, "tool_use", 64)
    assert call.model == "claude-haiku-4-5-20251001"
    base = namespace("trace_0103")
    assert call.hash_ids[:3] == (base | 1, base | 2, base | 3)
    assert call.hash_ids[234] == base | 238  # where this prompt departs from the first one


def test_local_ids_never_collide_across_files_whatever_the_order():
    a, b = SAMPLES / "trace_0242.json", SAMPLES / "trace_0103.json"
    raw_a = json.loads(a.read_text())["requests"][0]["hash_ids"]
    raw_b = json.loads(b.read_text())["requests"][0]["hash_ids"]
    assert set(raw_a) & set(raw_b)  # the raw local ids do overlap
    one = {t.id: t for t in load([a, b]).tasks}
    two = {t.id: t for t in load([b, a]).tasks}
    assert one == two
    ids_a = {h for c in one["trace_0242"].calls for h in c.hash_ids}
    ids_b = {h for c in one["trace_0103"].calls for h in c.hash_ids}
    assert not ids_a & ids_b
    assert max(ids_a | ids_b) < 2**63


def test_global_scope_keeps_ids(tmp_path):
    path = tmp_path / "g.json"
    path.write_text(json.dumps({"id": "g", "block_size": 64, "hash_id_scope": "global", "requests": [
        {"t": 0.0, "in": 128, "out": 1, "hash_ids": [7, 8]}]}))
    call = load([path]).tasks[0].calls[0]
    assert call.hash_ids == (7, 8) and call.gap == 0.0 and call.server_time is None


def test_samples_round_trip_through_native(tmp_path):
    workload = load([SAMPLES])
    assert workload.counts() == _raw_counts(SAMPLES, SAMPLE_FILES)
    out = tmp_path / "w.jsonl"
    native.write(workload, out)
    again = load([out])
    assert again.tasks == workload.tasks
    assert again.provenance == workload.provenance


def test_sniff_claims_only_its_files(tmp_path):
    assert detect(SAMPLES / "trace_0288.json") is claude_code
    out = tmp_path / "n.jsonl"
    native.write(load([SAMPLES / "trace_0288.json"]), out)
    assert detect(out) is native
    assert not claude_code.sniff(out, out.read_bytes()[:65536])


# ---- malformed input -------------------------------------------------------------------------

def _session(requests, **top) -> dict:
    return {"id": "s", "block_size": 64, "hash_id_scope": "local", "requests": requests, **top}


def _req(t, n_in=128, out=5, **extra) -> dict:
    return {"t": t, "type": "n", "in": n_in, "out": out, "hash_ids": [1, 2], "think_time": 1.0, **extra}


def _write(tmp_path, doc, name="bad.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return path


@pytest.mark.parametrize(
    "bad, where, field",
    [
        ({"in": -3}, "$.requests[1].in", "in"),
        ({"out": "many"}, "$.requests[1].out", "out"),
        ({"in": None}, "$.requests[1].in", "in"),
        ({"t": 0.5}, "$.requests[1].t", "t"),  # goes backwards from 1.0
        ({"think_time": -1}, "$.requests[1].think_time", "think_time"),
        ({"hash_ids": [1, "x"]}, "$.requests[1].hash_ids", "hash_ids"),
    ],
)
def test_bad_request_names_file_path_and_field(tmp_path, bad, where, field):
    second = {**_req(2.0), **bad}
    path = _write(tmp_path, _session([_req(1.0), second, _req(3.0)]))
    with pytest.raises(InputError) as err:
        load([path])
    assert err.value.file == str(path) and err.value.path == where and err.value.field == field
    assert "bad.json" in str(err.value) and where in str(err.value)


def test_missing_field_is_reported(tmp_path):
    req = _req(1.0)
    del req["out"]
    with pytest.raises(InputError) as err:
        load([_write(tmp_path, _session([req]))])
    assert err.value.path == "$.requests[0].out" and "missing" in str(err.value)


def test_error_inside_a_subagent_has_the_nested_path(tmp_path):
    sub = {"t": 5.0, "type": "subagent", "agent_id": "a1", "subagent_type": "Explore", "duration_ms": 2000,
           "requests": [_req(0.0), _req(1.0, out=-1)]}
    with pytest.raises(InputError) as err:
        load([_write(tmp_path, _session([_req(1.0), sub, _req(6.0)]))])
    assert err.value.path == "$.requests[1].requests[1].out"


def test_skip_policy_leaves_bad_requests_out_and_counts_them(tmp_path):
    doc = _session([_req(1.0), _req(2.0, n_in=-1), _req(3.0, out="x"), _req(4.0), _req(2.5)])
    workload = load([_write(tmp_path, doc)], on_error="skip")
    task = workload.tasks[0]
    assert [c.sent_at for c in task.calls] == [1.0, 4.0]
    notes = workload.provenance[0].notes
    assert sum(int(n.split()[1]) for n in notes) == 3
    assert any("in:" in n for n in notes) and any("t:" in n for n in notes)


def test_skipped_subagent_request_keeps_the_rest(tmp_path):
    sub = {"t": 5.0, "type": "subagent", "agent_id": "a1", "duration_ms": 2000,
           "requests": [_req(0.0), _req(1.0, out=-1)]}
    task = load([_write(tmp_path, _session([_req(1.0), sub, _req(6.0)]))], on_error="skip").tasks[0]
    assert len(task.subtasks) == 1 and len(task.subtasks[0].task.calls) == 1
    assert task.subtasks[0].task.task_class == "subagent"
    assert task.subtasks[0].after_call == 0 and task.subtasks[0].wait


def test_background_subagent_does_not_block_the_parent(tmp_path):
    # Runs from t=2 to t=10 while the parent sends at t=4 and t=6.
    sub = {"t": 10.0, "type": "subagent", "agent_id": "bg", "duration_ms": 8000, "requests": [_req(0.0)]}
    task = load([_write(tmp_path, _session([_req(1.0), _req(4.0), _req(6.0), sub, _req(12.0)]))]).tasks[0]
    assert task.subtasks[0].after_call == 0 and not task.subtasks[0].wait
    assert [c.gap for c in task.calls] == [1.0, 1.0, 1.0, 1.0]


def test_nested_subagents(tmp_path):
    inner = {"t": 2.0, "type": "subagent", "agent_id": "inner", "duration_ms": 1000, "requests": [_req(0.0)]}
    outer = {"t": 5.0, "type": "subagent", "agent_id": "outer", "duration_ms": 4000,
             "requests": [_req(0.0), inner, _req(3.0)]}
    workload = load([_write(tmp_path, _session([_req(0.5), outer, _req(6.0)]))])
    assert workload.counts() == (1, 5, 2)
    outer_task = workload.tasks[0].subtasks[0].task
    assert outer_task.id == "s/outer" and outer_task.subtasks[0].task.id == "s/outer/inner"
    assert outer_task.subtasks[0].after_call == 0


def test_truncated_json_names_the_line(tmp_path):
    text = json.dumps(_session([_req(1.0), _req(2.0)]), indent=1)
    path = _write(tmp_path, text[: len(text) // 2])
    with pytest.raises(InputError) as err:
        claude_code.read(path, ErrorPolicy())
    assert err.value.line is not None and err.value.line > 1
    assert "invalid JSON" in str(err.value) and f"bad.json:{err.value.line}" in str(err.value)


def test_empty_file(tmp_path):
    path = _write(tmp_path, "   \n")
    with pytest.raises(InputError, match="empty file"):
        load([path], format="claude-code")
    with pytest.raises(InputError, match="empty file"):
        load([path])


def test_no_requests_at_all(tmp_path):
    with pytest.raises(InputError) as err:
        load([_write(tmp_path, _session([]))])
    assert err.value.path == "$.requests"
    with pytest.raises(InputError) as err:
        load([_write(tmp_path, {"id": "x", "block_size": 64, "requests": 3})])
    assert err.value.field == "requests"


def test_bad_block_size(tmp_path):
    with pytest.raises(InputError) as err:
        load([_write(tmp_path, _session([_req(1.0)], block_size=0))])
    assert err.value.field == "block_size"


# ---- bad input (issue 17) ----------------------------------------------------------------------------

def _session_file(tmp_path, requests) -> Path:
    return _write(tmp_path, _session(requests), "s.json")


def test_json_nested_too_deep_is_an_input_error(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text('{"block_size": 64, "requests": [], "x": ' + "[" * 20000 + "]" * 20000 + "}")
    with pytest.raises(InputError) as err:
        load([path])
    assert "JSON" in str(err.value)


def test_sub_agents_nested_too_deep_are_an_input_error(tmp_path):
    request = {"t": 0, "in": 10, "out": 1, "hash_ids": [1]}
    for _ in range(claude_code.MAX_DEPTH + 2):
        request = {"type": "subagent", "agent_id": "a", "t": 1, "requests": [{"t": 0, "in": 10, "out": 1, "hash_ids": [1]}, request]}
    with pytest.raises(InputError) as err:
        load([_session_file(tmp_path, [{"t": 0, "in": 10, "out": 1, "hash_ids": [1]}, request])])
    assert "nested more than" in str(err.value)


@pytest.mark.parametrize("request_, field", [
    ({"t": 0, "in": 10, "out": 1, "hash_ids": [True]}, "hash_ids"),
    ({"t": 0, "in": 10, "out": 1, "hash_ids": [0, 1.0]}, "hash_ids"),
    ({"t": 0, "in": 2**63, "out": 1, "hash_ids": []}, "in"),
    ({"t": 0, "in": 10, "out": 16777217, "hash_ids": []}, "out"),
    ({"t": 1e300, "in": 10, "out": 1, "hash_ids": []}, "t"),
])
def test_values_out_of_range_are_input_errors(tmp_path, request_, field):
    with pytest.raises(InputError) as err:
        load([_session_file(tmp_path, [request_])])
    assert err.value.field == field and err.value.path.startswith("$.requests[0]")


def test_a_float_equal_to_a_known_id_is_still_refused(tmp_path):
    requests = [{"t": 0, "in": 128, "out": 1, "hash_ids": [5, 6]}, {"t": 1, "in": 192, "out": 1, "hash_ids": [5, 6, 5.0]}]
    with pytest.raises(InputError) as err:
        load([_session_file(tmp_path, requests)])
    assert err.value.path == "$.requests[1].hash_ids" and "item 2" in str(err.value)


def test_calls_share_the_ids_they_repeat():
    wl = load([SAMPLES / "trace_0057.json"])
    calls = wl.tasks[0].calls
    chains = {id(c.hash_ids._chain) for c in calls}
    assert len(chains) < len(calls)
    for previous, call in zip(calls, calls[1:]):
        n = 0
        for a, b in zip(previous.hash_ids, call.hash_ids):
            if a != b:
                break
            n += 1
        assert call.hash_ids[:n] == previous.hash_ids[:n]


# ---- the current fields (issue 35): ttft, totals, background and spawn-timed sub-agents -------------------

SEMIANALYSIS = ROOT / "tests" / "fixtures" / "claude_code_semianalysis.json"


def _walk_requests(requests):
    for req in requests:
        yield req
        if req.get("type") == "subagent":
            yield from _walk_requests(req["requests"])


def test_each_sample_holds_the_totals_it_states_and_notes_its_ttfts():
    for file in _json_files(SAMPLES, SAMPLE_FILES):
        doc = json.loads(file.read_text())
        workload = load([file])
        task = workload.tasks[0]
        sub_calls = [c for s in task.subtasks for c in s.task.calls]
        stated = doc["totals"]
        assert sum(c.input_tokens for c in task.calls) == stated["parent_tokens"]["input"]
        assert sum(c.output_tokens for c in task.calls) == stated["parent_tokens"]["output"]
        assert sum(c.input_tokens for c in sub_calls) == stated["subagent_tokens"]["input"]
        assert sum(c.output_tokens for c in sub_calls) == stated["subagent_tokens"]["output"]
        assert len(task.subtasks) == stated["subagent_count"]
        notes = workload.provenance[0].notes
        requests = [r for r in _walk_requests(doc["requests"]) if r.get("type") != "subagent"]
        with_ttft = sum(1 for r in requests if r.get("ttft") is not None)
        ttft_notes = [n for n in notes if "ttft" in n]
        assert ttft_notes == ([f"{with_ttft} of {len(requests)} calls record a ttft (time to first token); a call keeps "
                               "its api_time as server_time and has no field for the ttft, which is not imported"]
                              if with_ttft else [])
        assert not any("disagree" in n for n in notes)
        # server_time stays api_time where a ttft was recorded too
        assert [c.server_time for c in task.calls] == [r.get("api_time") for r in _parent_requests(file)]


def test_subagent_tool_counts_and_statuses_go_to_the_notes():
    doc = json.loads((SAMPLES / "trace_0277.json").read_text())
    subs = [r for r in doc["requests"] if r.get("type") == "subagent"]
    notes = load([SAMPLES / "trace_0277.json"]).provenance[0].notes
    tools = sum(r["tool_use_count"] for r in subs)
    assert f"{len(subs)} sub-agents; {tools:,} tool uses by the count of the {len(subs)} that report one" in notes


def test_totals_that_disagree_with_the_requests_are_noted(tmp_path):
    doc = json.loads((SAMPLES / "trace_0103.json").read_text())
    doc["totals"]["parent_tokens"]["input"] += 7
    notes = load([_write(tmp_path, doc)]).provenance[0].notes
    read = doc["totals"]["parent_tokens"]["input"] - 7
    assert any(f"parent input: {read + 7:,} stated, {read:,} read" in n for n in notes)


def test_semianalysis_layout_times_subagents_from_their_spawn():
    workload = load([SEMIANALYSIS])
    assert detect(SEMIANALYSIS) is claude_code
    task = workload.tasks[0]
    assert workload.counts() == (1, 7, 2)
    explore, background = task.subtasks
    # Explore: spawned at 4.5 s after the first call (which ended at 4.0 s), ran 6 s, and the parent's next
    # call (12.0 s) came after it ended: waited. Its requests' t count from the session's start.
    assert (explore.after_call, explore.wait, explore.task.task_class) == (0, True, "Explore")
    assert [c.sent_at for c in explore.task.calls] == [0.1, 3.5]
    assert [c.gap for c in explore.task.calls] == [0.0, 1.9]
    # The parent's think_time 8.0 s includes the 6 s spent waiting for it.
    assert [c.gap for c in task.calls] == [0.0, 2.0, 1.0]
    assert [c.sent_at for c in task.calls] == [0.0, 12.0, 16.0]
    # async_launched: spawned after call 1, the parent goes on without it.
    assert (background.after_call, background.wait) == (1, False)
    assert [c.sent_at for c in background.task.calls] == [0.1, 3.8]
    notes = workload.provenance[0].notes
    assert "3 of 7 calls record a ttft" in notes[0]
    assert notes[1] == ("2 sub-agents (1 launched in the background: the parent does not wait for them); 3 tool uses "
                        "by the count of the 1 that report one; 2 timed on the session's clock from their spawn "
                        "(SemiAnalysis layout)")


def test_background_subagent_in_kv_cache_tester_layout_starts_at_its_launch(tmp_path):
    # As in kv-cache-tester's trace_0295: a background agent's t is its launch, right after the parent
    # call that spawned it (10 s + 3 s), its requests counted from its own start.
    sub = {"t": 13.2, "type": "subagent", "agent_id": "bg", "subagent_type": "general-purpose", "status": "async_launched",
           "duration_ms": None, "total_tokens": None, "tool_use_count": None,
           "requests": [_req(0.0, api_time=4.0), _req(5.0, api_time=30.0)]}
    requests = [_req(0.0, api_time=2.0), _req(10.0, api_time=3.0), sub, _req(14.0), _req(20.0)]
    task = load([_write(tmp_path, _session(requests))]).tasks[0]
    assert (task.subtasks[0].after_call, task.subtasks[0].wait) == (1, False)
    assert [c.gap for c in task.calls] == [1.0, 1.0, 1.0, 1.0]  # nothing waited, nothing taken off


def test_requests_without_hash_ids_load_without_blocks_and_are_noted(tmp_path):
    second = _req(2.0)
    del second["hash_ids"]
    third = {**_req(3.0), "hash_ids": None}
    workload = load([_write(tmp_path, _session([_req(1.0), second, third]))])
    calls = workload.tasks[0].calls
    assert [len(c.hash_ids) for c in calls] == [2, 0, 0]
    assert "2 calls carry no hash_ids: no prefix blocks for them" in workload.provenance[0].notes


@pytest.mark.parametrize("bad, where, field", [
    ({"ttft": -1}, "$.requests[1].ttft", "ttft"),
    ({"ttft": "fast"}, "$.requests[1].ttft", "ttft"),
    ({"api_time": 2.0e9}, "$.requests[1].api_time", "api_time"),
])
def test_bad_current_request_fields_name_file_path_and_field(tmp_path, bad, where, field):
    path = _write(tmp_path, _session([_req(1.0), {**_req(2.0), **bad}, _req(3.0)]))
    with pytest.raises(InputError) as err:
        load([path])
    assert err.value.file == str(path) and err.value.path == where and err.value.field == field
    workload = load([path], on_error="skip")
    assert [c.sent_at for c in workload.tasks[0].calls] == [1.0, 3.0]
    assert any(n.startswith(f"skipped 1 record(s): {field}:") for n in workload.provenance[0].notes)


def test_a_bad_tool_use_count_names_its_subagent(tmp_path):
    sub = {"t": 5.0, "type": "subagent", "agent_id": "a1", "duration_ms": 2000, "tool_use_count": -2,
           "requests": [_req(0.0)]}
    path = _write(tmp_path, _session([_req(1.0), sub, _req(6.0)]))
    with pytest.raises(InputError) as err:
        load([path])
    assert (err.value.path, err.value.field) == ("$.requests[1].tool_use_count", "tool_use_count")
    assert not load([path], on_error="skip").tasks[0].subtasks
