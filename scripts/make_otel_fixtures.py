"""Regenerate the OpenTelemetry fixtures of tests/fixtures/ from the real instrumentation libraries.

A small agent (three chat loops whose history grows, five calls each, 50 ms of "tool time" between
calls, one system prompt shared by all loops) talks through the real OpenAI Python client to the
built-in emulator (`agentload serve-emulator`, started here as a subprocess). It runs twice:

- instrumented with OpenLLMetry (``opentelemetry-instrumentation-openai``), each loop inside a plain
  parent span (one trace per loop): ``otel_openllmetry.pb`` and ``otel_openllmetry.json``;
- instrumented with OpenInference (``openinference-instrumentation-openai``), each loop inside a span
  of kind AGENT: ``otel_openinference.pb`` (its JSON would repeat every prompt three times over);
- with ``--legacy-python``, once more under an older OpenLLMetry (0.47.x), which writes the older
  attributes (``llm.request.type``, ``gen_ai.prompt.N.*``, ``gen_ai.usage.prompt_tokens``):
  ``otel_openllmetry_legacy.pb``.

The spans are encoded by OpenTelemetry's own OTLP encoder (``encode_spans`` of
``opentelemetry-exporter-otlp-proto-common``) into an ``ExportTraceServiceRequest``, written as binary
protobuf (``.pb``) and as OTLP JSON (``.json``: protobuf's JSON mapping with the ids in hex and enums
as integers, as the OTLP/JSON specification asks).

Beside them, ``<name>.cached.json`` records what the emulator answered to every call (prompt tokens
and ``usage.prompt_tokens_details.cached_tokens``, in the order the calls were sent), so the replay
test compares the prefix-cache hits of a replay with those of the recording.

Packages this script needs (install them in a virtual environment of their own, e.g. /tmp/otelvenv;
it installs nothing itself): ``openai``, ``opentelemetry-sdk``, ``opentelemetry-exporter-otlp-proto-common``,
``opentelemetry-proto``, ``opentelemetry-instrumentation-openai``, ``openinference-instrumentation-openai``.
The legacy recording runs under the Python of a second environment with
``opentelemetry-instrumentation-openai==0.47.5``, ``opentelemetry-sdk==1.33.1``,
``opentelemetry-exporter-otlp-proto-common==1.33.1``, ``opentelemetry-proto==1.33.1`` and ``openai``.
The emulator runs from the project's own environment (``--agentload``, default ``.venv/bin/agentload``).

    /tmp/otelvenv/bin/python scripts/make_otel_fixtures.py [--out tests/fixtures] [--agentload PATH]
        [--legacy-python /tmp/otelvenv-old/bin/python]
"""

from __future__ import annotations

import argparse
import base64
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]

SYSTEM_PROMPT = (
    "You are a careful coding agent working inside a small repository. Read the task, plan the work in "
    "short steps, call one tool at a time and wait for its result before you go on. Keep every answer "
    "brief and say what you will do next. Never change files outside the repository and never run "
    "commands that reach the network. When the task is done say so in one line and stop."
)
TASKS = (
    "Rename the function parse_rows to read_rows everywhere and keep the tests passing.",
    "Find why the nightly report misses the last day of each month and fix the off by one.",
    "Add a command line flag that prints the version of the tool and exits with status zero.",
)
TOOL_RESULTS = (
    "tool result: grep found four matches in two files and one match in the tests folder",
    "tool result: the edit was applied cleanly and the file now reads as expected after the change",
    "tool result: the test run finished with twelve passed and no failures in one point two seconds",
    "tool result: the diff touches three files with eleven lines added and nine lines removed",
)
TURNS = 5
MAX_TOKENS = (24, 16, 20, 12, 8)
TOOL_SECONDS = 0.05
RECORDINGS = {"otel_openllmetry": True, "otel_openinference": False, "otel_openllmetry_legacy": False}
"""Recordings by fixture name: whether OTLP JSON is written beside the protobuf."""


def start_emulator(agentload: str) -> tuple[subprocess.Popen, str]:
    """Start `agentload serve-emulator` on a free port; (process, base URL)."""
    proc = subprocess.Popen(
        [agentload, "serve-emulator", "--port", "0", "--ttft", "0.02", "--itl", "0.002"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "http://" not in line:
        proc.kill()
        raise SystemExit(f"the emulator did not start: {line!r}")
    return proc, line.strip().split()[-1]


def run_agent(client: Any, model: str, tracer: Any, loop_span: Callable[[Any, int], Any]) -> list[dict[str, int]]:
    """Three chat loops, one after the other; the emulator's usage of every call, in order."""
    usage = []
    for number, task in enumerate(TASKS):
        with loop_span(tracer, number):
            messages: list[dict[str, str]] = [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": task},
            ]
            for turn in range(TURNS):
                reply = client.chat.completions.create(model=model, messages=messages, max_tokens=MAX_TOKENS[turn])
                details = reply.usage.prompt_tokens_details
                usage.append({"task": number, "turn": turn, "prompt_tokens": reply.usage.prompt_tokens,
                              "completion_tokens": reply.usage.completion_tokens,
                              "cached_tokens": details.cached_tokens if details else None})
                messages.append({"role": "assistant", "content": reply.choices[0].message.content})
                time.sleep(TOOL_SECONDS)
                messages.append({"role": "user", "content": TOOL_RESULTS[(number + turn) % len(TOOL_RESULTS)]})
    return usage


def otlp_json(request: Any) -> dict[str, Any]:
    """OTLP JSON of an ExportTraceServiceRequest: protobuf's JSON mapping, ids as hex, enums as integers."""
    from google.protobuf.json_format import MessageToDict

    doc = MessageToDict(request, use_integers_for_enums=True)
    for resource in doc.get("resourceSpans", []):
        for scope in resource.get("scopeSpans", []):
            for span in scope.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if span.get(key):
                        span[key] = base64.b64decode(span[key]).hex()
    return doc


def write(out: Path, name: str, spans: list, usage: list[dict[str, int]]) -> None:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    request = encode_spans(sorted(spans, key=lambda s: s.start_time))
    written = [out / f"{name}.pb", out / f"{name}.cached.json"]
    written[0].write_bytes(request.SerializeToString())
    written[1].write_text(json.dumps(usage) + "\n")
    if RECORDINGS[name]:
        written.append(out / f"{name}.json")
        written[-1].write_text(json.dumps(otlp_json(request)) + "\n")
    print(f"wrote {', '.join(str(p) for p in written)}: {len(spans)} spans, {len(usage)} calls")


def record(name: str, url: str, out: Path) -> None:
    """One recording: the agent under one instrumentation library, its spans written as fixtures."""
    import openai
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    if name.startswith("otel_openllmetry"):
        from opentelemetry.instrumentation.openai import OpenAIInstrumentor

        def loop_span(tracer: Any, number: int) -> Any:
            return tracer.start_as_current_span(f"chat-loop-{number}")
    else:
        from openinference.instrumentation.openai import OpenAIInstrumentor

        def loop_span(tracer: Any, number: int) -> Any:
            return tracer.start_as_current_span(
                f"chat-loop-{number}", attributes={"openinference.span.kind": "AGENT", "agent.name": "chat-loop"})

    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "chat-loops"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    OpenAIInstrumentor().instrument(tracer_provider=provider)
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    usage = run_agent(client, "agentload-emulator", provider.get_tracer("chat-loops"), loop_span)
    provider.force_flush()
    write(out, name, list(exporter.get_finished_spans()), usage)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "tests" / "fixtures"), help="folder to write the fixtures to")
    parser.add_argument("--agentload", default=str(ROOT / ".venv" / "bin" / "agentload"),
                        help="the agentload command that serves the emulator")
    parser.add_argument("--legacy-python", metavar="PYTHON",
                        help="Python of an environment with OpenLLMetry 0.47.x, for otel_openllmetry_legacy.pb")
    parser.add_argument("--record", choices=RECORDINGS, help=argparse.SUPPRESS)  # one recording, in a child process
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.record:
        record(args.record, args.url, out)
        return 0
    # each instrumentation in a process of its own (uninstrumenting does not always unwrap everything),
    # each against a fresh emulator, so that every recording starts with a cold prefix cache as its replay will
    for name in RECORDINGS:
        python = sys.executable
        if name.endswith("_legacy"):
            if not args.legacy_python:
                print(f"skipped {name}: give --legacy-python")
                continue
            python = args.legacy_python
        proc, url = start_emulator(args.agentload)
        try:
            subprocess.run([python, __file__, "--record", name, "--url", url, "--out", str(out)], check=True)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
