"""OTel spans from the real instrumentation libraries (OpenLLMetry, OpenInference) around the real OpenAI
client talking to the emulator (fixtures made by scripts/make_otel_fixtures.py): OTLP JSON and protobuf
read alike, hash ids come from the messages, and a replay against the emulator finds in its prefix cache
what the recorded conversation found."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from simulator import scenario as sc
from simulator.errors import InputError
from simulator.pipeline.live import run_scenario
from simulator.metrics import results
from simulator.model.stats import workload_stats
from simulator.traces import detect, load, otel
from simulator.workload import Workload

FIXTURES = Path(__file__).resolve().parent / "fixtures"
OPENLLMETRY_JSON = FIXTURES / "otel_openllmetry.json"
OPENLLMETRY_PB = FIXTURES / "otel_openllmetry.pb"
OPENINFERENCE_PB = FIXTURES / "otel_openinference.pb"
LEGACY_PB = FIXTURES / "otel_openllmetry_legacy.pb"  # OpenLLMetry 0.47: llm.request.type, gen_ai.prompt.N.*
BLOCK = 16


def recorded(trace: Path) -> list[dict]:
    """What the emulator answered while the trace was recorded, in send order."""
    return json.loads((FIXTURES / (trace.stem + ".cached.json")).read_text())


def sent_in_order(workload: Workload):
    """(task index, call index, call) in the order the calls were sent."""
    rows = [(t.arrival + c.sent_at, i, j, c) for i, t in enumerate(workload.tasks) for j, c in enumerate(t.calls)]
    return [(i, j, c) for _, i, j, c in sorted(rows, key=lambda r: r[0])]


def cache_hits(workload: Workload) -> list[int]:
    """Prompt tokens a block prefix cache (never evicting) would serve each call, in send order."""
    seen: set[int] = set()
    out = []
    for _, _, call in sent_in_order(workload):
        hits = 0
        for h in call.hash_ids:
            if h not in seen:
                break
            hits += 1
        cached = hits * call.block_size
        out.append(cached - call.block_size if cached and cached >= call.input_tokens else cached)
        seen.update(call.hash_ids)
    return out


@pytest.mark.parametrize("trace", [OPENLLMETRY_JSON, OPENLLMETRY_PB, OPENINFERENCE_PB, LEGACY_PB], ids=lambda p: p.name)
def test_real_instrumentation_reads_as_three_chat_loops(trace):
    assert detect(trace) is otel
    wl = load([trace])
    assert wl.counts() == (3, 15, 0)
    rec = recorded(trace)
    assert [(c.input_tokens, c.output_tokens) for _, _, c in sent_in_order(wl)] == [
        (r["prompt_tokens"], r["completion_tokens"]) for r in rec]
    for task in wl.tasks:
        assert [c.gap for c in task.calls[1:]] == pytest.approx([0.05] * 4, abs=0.03)
        assert all(c.model == "agentload-emulator" and c.stop_reason == "length" for c in task.calls)
        assert all(c.block_size == BLOCK and len(c.hash_ids) == c.input_tokens // BLOCK for c in task.calls)
        assert all(c.messages is None for c in task.calls)  # content is reduced to ids, not kept
    notes = " ".join(wl.provenance[0].notes)
    assert "hash ids from message content for 15 LLM calls" in notes and "estimated" in notes


def test_openinference_agent_spans_are_tasks():
    wl = load([OPENINFERENCE_PB])
    assert {t.task_class for t in wl.tasks} == {"chat-loop"}  # openinference.span.kind AGENT, agent.name
    assert all(len(t.calls) == 5 for t in wl.tasks)


def test_json_and_protobuf_give_the_same_workload():
    assert load([OPENLLMETRY_JSON]).tasks == load([OPENLLMETRY_PB]).tasks


def test_ids_follow_the_conversation():
    wl = load([OPENLLMETRY_JSON])
    for task in wl.tasks:
        for before, after in zip(task.calls, task.calls[1:]):
            # each turn's prompt holds the previous one: all of its full blocks are shared
            assert after.hash_ids[: len(before.hash_ids)] == before.hash_ids
    firsts = [t.calls[0].hash_ids for t in wl.tasks]
    shared = 0
    while all(ids[shared] == firsts[0][shared] for ids in firsts):
        shared += 1
    # the common system prompt (79 tokens with the emulator's template) is shared by all three tasks
    assert 4 <= shared <= 5
    assert len(set(firsts[0][shared:]) & set(firsts[1][shared:])) == 0


@pytest.mark.parametrize("trace", [OPENLLMETRY_JSON, OPENINFERENCE_PB, LEGACY_PB], ids=lambda p: p.name)
def test_hits_implied_by_the_ids_are_the_recorded_ones(trace):
    wl = load([trace])
    implied = cache_hits(wl)
    hits = [r["cached_tokens"] for r in recorded(trace)]
    firsts = {i for i, (_, j, _) in enumerate(sent_in_order(wl)) if j == 0}
    for n, (mine, real) in enumerate(zip(implied, hits)):
        if n in firsts:  # where the shared system prompt ends is estimated: within one block
            assert abs(mine - real) <= BLOCK, n
        else:
            assert mine == real, n
    stats = workload_stats(wl).prefix_reuse
    assert stats.hashed_input_share == 1.0
    assert stats.within_task > 0.6 and stats.across_tasks > stats.within_task


def _strip_content(tmp_path: Path) -> Path:
    doc = json.loads(OPENLLMETRY_JSON.read_text())
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for sp in ss["spans"]:
                sp["attributes"] = [a for a in sp.get("attributes", []) if "messages" not in a["key"]]
    path = tmp_path / "no_content.json"
    path.write_text(json.dumps(doc))
    return path


def test_without_content_there_is_no_reuse_unless_append_only_is_assumed(tmp_path):
    path = _strip_content(tmp_path)
    plain = load([path])
    assert all(not c.hash_ids for c in plain.all_calls())
    assert workload_stats(plain).prefix_reuse.within_task is None
    assert "15 LLM calls carry no messages" in " ".join(plain.provenance[0].notes)
    assumed = load([path], assume_append_only=True)
    implied = cache_hits(assumed)
    hits = [r["cached_tokens"] for r in recorded(OPENLLMETRY_JSON)]
    # within a conversation the structure gives the recorded hits; across conversations it cannot know
    assert [h for n, h in enumerate(implied) if n % 5] == [h for n, h in enumerate(hits) if n % 5]
    assert [implied[n] for n in (0, 5, 10)] == [0, 0, 0]
    assert "of 12 calls after a first call, 12 fit" in " ".join(assumed.provenance[0].notes)


def _replay(tmp_path: Path, trace: Path, extra: str = "") -> dict:
    text = (f"workload: {{trace: {trace}{extra}}}\n"
            "emulator: {ttft: 0.005, itl: 0.001}\n")
    scenario = sc.parse(text, str(tmp_path / "scenario.yaml"))
    workload = sc.load_workload(scenario)
    asyncio.run(run_scenario(scenario, workload, tmp_path / "run", handle_sigint=False))
    calls = results.read_calls(tmp_path / "run")
    assert len(calls) == 15 and all(c.ok for c in calls)
    order = {(workload.tasks[i].id, j): n for n, (i, j, _) in enumerate(sent_in_order(workload))}
    return {order[(c.task_id, c.call_index)]: c for c in calls}


def test_replay_against_the_emulator_hits_the_prefix_cache_as_recorded(tmp_path):
    replayed = _replay(tmp_path, OPENLLMETRY_JSON)
    rec = recorded(OPENLLMETRY_JSON)
    for n, r in enumerate(rec):
        call = replayed[n]
        assert call.input_tokens == r["prompt_tokens"], n
        if n % 5:  # later turns: the whole previous prompt, in full blocks, exactly as recorded
            assert call.cached_tokens == r["cached_tokens"], n
        else:  # first turns: the shared system prompt, its end estimated within one block
            assert abs(call.cached_tokens - r["cached_tokens"]) <= BLOCK, n
    assert sum(c.cached_tokens for c in replayed.values()) >= 0.9 * sum(r["cached_tokens"] for r in rec)


def test_replay_of_a_trace_without_content_with_the_scenario_key(tmp_path):
    path = _strip_content(tmp_path)
    replayed = _replay(tmp_path, path, ", assume_append_only: true")
    rec = recorded(OPENLLMETRY_JSON)
    assert [replayed[n].cached_tokens for n in range(15) if n % 5] == [r["cached_tokens"] for n, r in enumerate(rec) if n % 5]


# -- conventions and errors, on spans written here ----------------------------------------------------


def _span(span_id: str, start: float, attrs: dict, parent: str = "") -> dict:
    def value(v):
        if isinstance(v, bool):
            return {"boolValue": v}
        if isinstance(v, int):
            return {"intValue": str(v)}
        return {"stringValue": v}

    return {"traceId": "ab" * 16, "spanId": span_id, "parentSpanId": parent,
            "startTimeUnixNano": str(int(start * 1e9)), "endTimeUnixNano": str(int((start + 0.5) * 1e9)),
            "attributes": [{"key": k, "value": value(v)} for k, v in attrs.items()]}


def _export(tmp_path: Path, spans: list[dict], name: str = "spans.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": spans}]}]}))
    return path


def _legacy(turns: list[tuple[str, str]], n_in: int) -> dict:
    attrs = {"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": n_in, "gen_ai.usage.output_tokens": 10}
    for i, (role, content) in enumerate(turns):
        attrs[f"gen_ai.prompt.{i}.role"] = role
        attrs[f"gen_ai.prompt.{i}.content"] = content
    return attrs


def test_older_indexed_prompt_attributes_give_ids(tmp_path):
    system = ("system", "word " * 200)
    one = [system, ("user", "first question " * 10)]
    two = one + [("assistant", "an answer " * 10), ("user", "second question " * 10)]
    path = _export(tmp_path, [_span("01" * 8, 0.0, _legacy(one, 300)), _span("02" * 8, 1.0, _legacy(two, 360)),
                              _span("03" * 8, 2.0, {**_legacy(one, 300), "gen_ai.prompt.1.content": "other " * 20})])
    calls = load([path]).tasks[0].calls
    assert all(len(c.hash_ids) == c.input_tokens // BLOCK for c in calls)
    assert calls[1].hash_ids[: len(calls[0].hash_ids)] == calls[0].hash_ids
    # another question after the same system prompt (1,000 bytes, ~250 tokens as fitted to these calls):
    # shares the system prompt's blocks only
    common = next(i for i, (a, b) in enumerate(zip(calls[0].hash_ids, calls[2].hash_ids)) if a != b)
    assert 15 <= common <= 16 < len(calls[2].hash_ids)


def test_openinference_conventions_on_hand_written_spans(tmp_path):
    agent = _span("0a" * 8, 0.0, {"openinference.span.kind": "AGENT", "agent.name": "planner"})
    llm = _span("0b" * 8, 0.1, {"openinference.span.kind": "LLM", "llm.token_count.prompt": 40,
                                "llm.token_count.completion": 7, "llm.model_name": "m1", "llm.finish_reason": "stop",
                                "llm.input_messages.0.message.role": "user",
                                "llm.input_messages.0.message.content": "hello " * 30}, parent="0a" * 8)
    tool = _span("0c" * 8, 0.7, {"openinference.span.kind": "TOOL"}, parent="0a" * 8)
    task = load([_export(tmp_path, [agent, llm, tool])]).tasks[0]
    assert task.task_class == "planner"
    (call,) = task.calls
    assert (call.input_tokens, call.output_tokens, call.model, call.stop_reason) == (40, 7, "m1", "stop")
    assert len(call.hash_ids) == 2 and call.block_size == BLOCK


def test_openinference_span_without_counts_names_its_field(tmp_path):
    llm = _span("0b" * 8, 0.1, {"openinference.span.kind": "LLM", "llm.token_count.completion": 7})
    with pytest.raises(InputError) as err:
        load([_export(tmp_path, [llm])])
    assert err.value.field == "llm.token_count.prompt" and err.value.path.endswith("spans[0].attributes")


def test_bad_input_messages_name_file_span_and_field(tmp_path):
    attrs = {"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 40, "gen_ai.usage.output_tokens": 5,
             "gen_ai.input.messages": "[{\"role\": \"user\", \"parts\": ["}
    path = _export(tmp_path, [_span("0d" * 8, 0.0, attrs), _span("0e" * 8, 1.0, {**attrs, "gen_ai.input.messages": "[]"})])
    with pytest.raises(InputError) as err:
        load([path])
    text = str(err.value)
    assert text.startswith(str(path)) and "$.resourceSpans[0].scopeSpans[0].spans[0].attributes" in text
    assert "field 'gen_ai.input.messages'" in text and "not JSON" in text
    skipped = load([path], on_error="skip")
    assert skipped.counts() == (1, 1, 0) and "gen_ai.input.messages" in " ".join(skipped.provenance[0].notes)
    attrs["gen_ai.input.messages"] = "{\"role\": \"user\"}"
    with pytest.raises(InputError, match="expected a JSON list of messages"):
        load([_export(tmp_path, [_span("0d" * 8, 0.0, attrs)])])


def test_cut_protobuf_is_an_input_error(tmp_path):
    data = OPENLLMETRY_PB.read_bytes()
    cut = tmp_path / "cut.pb"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError) as err:
        load([cut], format="otel")
    assert str(err.value).startswith(str(cut)) and "not an OTLP protobuf trace request" in str(err.value)


def test_length_prefixed_protobuf_stream(tmp_path):
    """The collector's file exporter (format: proto) writes each request after its 4-byte length."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest()
    request.ParseFromString(OPENLLMETRY_PB.read_bytes())
    stream = b""
    (resource,) = request.resource_spans
    assert len(resource.scope_spans) == 2  # the agent's own loop spans, and the instrumentation's
    for scope in resource.scope_spans:  # one request per scope
        part = ExportTraceServiceRequest()
        rs = part.resource_spans.add()
        rs.resource.CopyFrom(resource.resource)
        rs.scope_spans.append(scope)
        raw = part.SerializeToString()
        stream += len(raw).to_bytes(4, "big") + raw
    path = tmp_path / "spans.binpb"
    path.write_bytes(stream)
    assert detect(path) is otel
    assert load([path]).tasks == load([OPENLLMETRY_PB]).tasks
    bad = tmp_path / "bad.binpb"
    bad.write_bytes(stream + (40).to_bytes(4, "big") + b"\xff" * 40)  # a third message, corrupt
    with pytest.raises(InputError) as err:
        load([bad], format="otel")
    assert err.value.path == "$[2]" and "message 2 of the length-prefixed stream" in str(err.value)


def test_simulate_on_the_twin_sees_the_same_hits(tmp_path):
    import yaml

    from simulator.sim.profile import load_profile
    from simulator.pipeline.twin import simulate_to_folder

    profile = {"name": "otel-test", "scheduler": {"max_num_seqs": 8, "max_num_batched_tokens": 512, "max_model_len": 2048},
               "kv_cache": {"block_size": BLOCK, "num_blocks": 4000},
               "step_time": {"fixed": 0.002, "per_token": 0.00001, "per_decode_seq": 0.0001}}
    (tmp_path / "profile.yaml").write_text(yaml.safe_dump(profile))
    workload = load([OPENLLMETRY_PB])
    simulate_to_folder(workload, load_profile(str(tmp_path / "profile.yaml")), tmp_path / "sim")
    order = {(workload.tasks[i].id, j): n for n, (i, j, _) in enumerate(sent_in_order(workload))}
    sim = {order[(c.task_id, c.call_index)]: c.cached_tokens for c in results.read_calls(tmp_path / "sim")}
    assert [sim[n] for n in range(15)] == cache_hits(workload)
