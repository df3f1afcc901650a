"""OpenTelemetry GenAI (OTLP JSON) importer: agent tasks, sub-agents with their spawn points, gaps and
server times from span times, JSON Lines exports, native round trip, and errors naming file, path, field."""

import copy
import json
from pathlib import Path

import pytest

from simulator.errors import InputError
from simulator.traces import detect, load, native, otel

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "otel_agent.json"
ROOT_ID = "otel-4bf92f35-00f067aa0ba902b7"


def _doc() -> dict:
    return json.loads(FIXTURE.read_text())


def _write(tmp_path: Path, doc: dict, name: str = "t.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def _span(doc: dict, span_id: str) -> dict:
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for sp in ss["spans"]:
                if sp["spanId"] == span_id:
                    return sp
    raise KeyError(span_id)


def test_agent_task_calls_and_gaps():
    assert detect(FIXTURE) is otel
    wl = load([FIXTURE])
    assert wl.counts() == (2, 9, 2)
    coder = wl.tasks[0]
    assert coder.id == ROOT_ID and coder.task_class == "coder" and coder.arrival == 0.0
    assert [(c.input_tokens, c.output_tokens) for c in coder.calls] == [(12000, 350), (13500, 120), (15000, 90), (15500, 600)]
    # gaps: 0.1 from the agent's start; 0.7 after a tool; 0.4 after the waited researcher (ended 14.8);
    # 0.8 after call 3, the linter running alongside
    assert [c.gap for c in coder.calls] == pytest.approx([0.1, 0.7, 0.4, 0.8])
    assert [c.server_time for c in coder.calls] == pytest.approx([2.5, 2.0, 2.0, 3.0])
    assert [c.sent_at for c in coder.calls] == pytest.approx([0.1, 3.3, 15.2, 18.0])
    assert [c.stop_reason for c in coder.calls] == ["tool_calls", "tool_calls", "tool_calls", "stop"]
    assert coder.calls[0].model == "claude-sonnet-4-5-20250929"  # response model preferred to request model


def test_sub_agents_spawn_points_and_waits():
    coder = load([FIXTURE]).tasks[0]
    researcher, linter = coder.subtasks
    # the researcher sits under an execute_tool span, started after call 1 ended; call 2 waited for it
    assert (researcher.after_call, researcher.wait) == (1, True)
    assert researcher.task.task_class == "researcher" and researcher.task.id == ROOT_ID + "/f4a5b6c7d8e9f0a1"
    assert [c.gap for c in researcher.task.calls] == pytest.approx([0.3, 1.4])  # 0.3 from the parent's call end
    assert [c.server_time for c in researcher.task.calls] == pytest.approx([2.0, 5.5])
    # the linter started after call 2; call 3 started while it still ran: not waited
    assert (linter.after_call, linter.wait) == (2, False)
    assert linter.task.task_class == "linter"
    assert [(c.input_tokens, c.output_tokens, c.model) for c in linter.task.calls] == [(3000, 150, "claude-haiku-4-5-20250929")]
    assert linter.task.calls[0].gap == pytest.approx(0.4)


def test_trace_without_agent_is_one_task():
    plain = load([FIXTURE]).tasks[1]
    assert plain.id == "otel-0af76519" and plain.task_class == "default"
    assert plain.arrival == pytest.approx(12.0)
    assert [(c.input_tokens, c.output_tokens, c.gap, c.stop_reason) for c in plain.calls] == [
        (800, 40, 0.0, "stop"), (1000, 60, pytest.approx(1.0), "length")]


def test_json_lines_of_exports_read_the_same(tmp_path):
    doc = _doc()
    lines = [json.dumps({"resourceSpans": [rs]}) for rs in doc["resourceSpans"]]
    # the collector may split one trace across exports: move the root agent span to its own line
    first = json.loads(lines[0])
    root = first["resourceSpans"][0]["scopeSpans"][0]["spans"].pop(0)
    lines[0] = json.dumps(first)
    lines.append(json.dumps({"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": [root]}]}]}))
    path = tmp_path / "spans.jsonl"
    path.write_text("\n".join(lines) + "\n")
    assert detect(path) is otel
    assert load([path]).tasks == load([FIXTURE]).tasks


def test_native_round_trip(tmp_path):
    wl = load([FIXTURE])
    native.write(wl, tmp_path / "w.jsonl")
    again = load([tmp_path / "w.jsonl"])
    assert again.tasks == wl.tasks and again.provenance == wl.provenance


def test_agent_totals_are_not_calls_and_tools_are_not_calls():
    wl = load([FIXTURE])
    # the fixture's agent spans carry gen_ai.usage.input_tokens; tool spans none: 9 LLM spans only
    assert sum(1 for _ in wl.all_calls()) == 9


@pytest.mark.parametrize(
    "span_id, mutate, path_part, field",
    [
        ("b7ad6b7169203331", lambda sp: sp["attributes"].pop(4), ".attributes", "gen_ai.usage.input_tokens"),
        ("b7ad6b7169203331", lambda sp: sp["attributes"][5]["value"].update(intValue="-3"), ".attributes",
         "gen_ai.usage.output_tokens"),
        ("b7ad6b7169203331", lambda sp: sp["attributes"][4]["value"].update(intValue="many"), ".attributes[4].value",
         "gen_ai.usage.input_tokens"),
        ("d2e3f4a5b6c7d8e9", lambda sp: sp.update(endTimeUnixNano="1"), ".endTimeUnixNano", "endTimeUnixNano"),
        ("d2e3f4a5b6c7d8e9", lambda sp: sp.update(startTimeUnixNano="noon"), ".startTimeUnixNano", "startTimeUnixNano"),
        ("d2e3f4a5b6c7d8e9", lambda sp: sp.pop("traceId"), ".traceId", "traceId"),
    ],
)
def test_bad_span_names_file_path_and_field(tmp_path, span_id, mutate, path_part, field):
    doc = _doc()
    mutate(_span(doc, span_id))
    path = _write(tmp_path, doc, "bad.json")
    with pytest.raises(InputError) as err:
        load([path])
    text = str(err.value)
    index = 1 if span_id == "b7ad6b7169203331" else 3
    assert text.startswith(str(path))
    assert f"$.resourceSpans[0].scopeSpans[0].spans[{index}]{path_part}" in text and f"field '{field}'" in text


def test_skip_mode_drops_bad_spans_and_counts(tmp_path):
    doc = _doc()
    _span(doc, "b7ad6b7169203331")["attributes"].pop(4)  # no input tokens
    _span(doc, "2c3d4e5f6a7b8c9d")["endTimeUnixNano"] = "5"  # ends before it starts
    wl = load([_write(tmp_path, doc)], on_error="skip")
    assert wl.counts() == (2, 7, 2)
    assert [c.input_tokens for c in wl.tasks[0].calls] == [13500, 15000, 15500]
    notes = " ".join(wl.provenance[0].notes)
    assert "skipped 1 record(s): gen_ai.usage.input_tokens" in notes and "skipped 1 record(s): endTimeUnixNano" in notes


def test_truncated_and_empty_files(tmp_path):
    text = FIXTURE.read_text()
    cut = tmp_path / "cut.json"
    cut.write_text(text[: len(text) // 2])
    with pytest.raises(InputError) as err:
        load([cut], format="otel")
    assert str(err.value).startswith(f"{cut}:") and "not JSON" in str(err.value)
    lines = tmp_path / "cut.jsonl"
    export = json.dumps(_doc())
    lines.write_text(export + "\n" + export[:100] + "\n")
    with pytest.raises(InputError, match=r"cut\.jsonl:2: not JSON"):
        load([lines], format="otel")
    wl = load([lines], format="otel", on_error="skip")
    assert wl.counts() == (2, 9, 2) and "not JSON" in " ".join(wl.provenance[0].notes)
    empty = tmp_path / "empty.json"
    empty.write_text("\n")
    with pytest.raises(InputError, match=r"empty\.json"):
        load([empty], format="otel")


def test_no_genai_spans_is_an_error(tmp_path):
    doc = _doc()
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for sp in ss["spans"]:
                sp["attributes"] = [a for a in sp["attributes"] if a["key"] != "gen_ai.operation.name"]
    with pytest.raises(InputError, match="no GenAI LLM spans"):
        load([_write(tmp_path, doc)])


def test_waited_subagent_without_next_call(tmp_path):
    doc = copy.deepcopy(_doc())
    spans = doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"] = [s for s in spans if s["spanId"] != "0a1b2c3d4e5f6a7b"]
    coder = load([_write(tmp_path, doc)]).tasks[0]
    linter = coder.subtasks[1]
    assert len(coder.calls) == 3 and (linter.after_call, linter.wait) == (2, True)  # the agent outlived it
