"""Mutated inputs for every trace format and for scenarios, and the check of what loading them gives.

Shared by `tests/test_fuzz_inputs.py` (hypothesis drives the `random.Random` each case is drawn from, with
bounded example counts) and `benchmarks/fuzz_inputs.py` (a plain seeded `random.Random`, 100k+ cases).

A case is a seed file of one format (a few records cut from the samples in traces/ and tests/fixtures/)
mutated by one or more mutators: byte-level (flip, insert, delete, duplicate, truncate, non-UTF-8 bytes,
another encoding, NUL) and structure-level (a JSON value, a CSV cell or a YAML value replaced by a nasty
one: huge or negative numbers, NaN and infinities, booleans, deep nesting, long strings, wrong types).
Its outcome is one of:

- ``valid``: a workload that `check_workload` finds sound (every number in range, every hash id an int in
  [0, 2**63), sub-tasks after calls their parent has) and that the native format writes and reads back;
- ``input_error``: an `InputError`;
- ``invalid``: loaded, but `check_workload` or the round trip failed;
- ``other``: any other exception (what must never happen).
"""

from __future__ import annotations

import gzip
import io
import json
import math
import random
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from simulator import scenario as scenario_mod
from simulator.errors import InputError
from simulator.hash_ids import ID_LIMIT, HashIds
from simulator.traces import load, native
from simulator.workload import MAX_DEPTH, MAX_SECONDS, MAX_TOKENS, Task, Workload

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces"
FIXTURES = ROOT / "tests" / "fixtures"

OUTCOMES = ("valid", "input_error", "invalid", "other")


# ---- seeds ----------------------------------------------------------------------------------------------


def _head_lines(path: Path, n: int) -> bytes:
    return b"".join(path.read_bytes().splitlines(keepends=True)[:n])


def _native_seed() -> bytes:
    """A small native file with every feature: hash_keep, a rewrite, sub-tasks, messages, optional fields."""
    lines = [{"agentload_trace": 1, "provenance": [{"source": "fuzz", "format": "native"}]}]
    lines.append({"id": "t1", "arrival": 0.5, "task_class": "agent", "calls": [
        {"input_tokens": 64, "output_tokens": 8, "hash_ids": [11, 12, 13, 14], "block_size": 16,
         "server_time": 0.2, "sent_at": 0.0, "stop_reason": "tool_use", "model": "m"},
        {"input_tokens": 96, "output_tokens": 9, "gap": 1.5, "hash_keep": 4, "hash_ids": [15, 16], "block_size": 16},
        {"input_tokens": 40, "output_tokens": 3, "gap": 0.25, "hash_keep": 1, "hash_ids": [90, 91], "block_size": 16},
    ], "subtasks": [{"after_call": 0, "wait": False, "task": {"id": "t1/s", "calls": [
        {"input_tokens": 20, "output_tokens": 2, "hash_ids": [7], "block_size": 16}]}}]})
    lines.append({"id": "t2", "arrival": 3.0, "calls": [
        {"input_tokens": 30, "output_tokens": 5, "messages": [{"role": "user", "content": "list the files"}]},
        {"input_tokens": 60, "output_tokens": 5, "messages": [{"role": "user", "content": "list the files"},
                                                             {"role": "assistant", "content": "a.py b.py"}]}]})
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def _claude_seed() -> bytes:
    doc = json.loads((TRACES / "claude-code" / "trace_0103.json").read_text())
    doc["requests"] = doc["requests"][:4]
    doc["requests"].append({"type": "subagent", "agent_id": "a1", "t": doc["requests"][-1]["t"] + 5,
                            "duration_ms": 2000, "requests": [{"t": 0, "in": 100, "out": 5, "hash_ids": [1, 2]}]})
    # the current fields: a ttft, a background sub-agent, one timed from its spawn (SemiAnalysis layout)
    last = doc["requests"][-1]["t"]
    doc["requests"][0]["ttft"] = 0.5
    doc["requests"].append({"type": "subagent", "agent_id": "a2", "t": last + 1, "status": "async_launched",
                            "duration_ms": None, "tool_use_count": None,
                            "requests": [{"t": 0, "in": 90, "out": 4, "hash_ids": [1, 3], "api_time": 1.0}]})
    doc["requests"].append({"type": "subagent", "agent_id": "a3", "t": last + 2, "status": "completed",
                            "duration_ms": 3000, "tool_use_count": 2,
                            "requests": [{"t": last + 2.5, "in": 80, "out": 3, "hash_ids": [1, 4], "ttft": 0.2}]})
    return json.dumps(doc).encode()


def _recording_seed() -> bytes:
    """A recording as `agentload record` writes it: a task with a sub-task, a failed call, compact ids and
    a revision."""
    lines = [{"agentload_recording": 1, "hash": "agentload-prefix-v1", "block_size": 16, "started_unix": 1000.0,
              "upstream": "http://127.0.0.1:8000", "segment": 0},
             {"task": "t1", "i": 0, "t": 1.0, "end": 2.0, "input_tokens": 64, "output_tokens": 8, "hash_ids": [1, 2, 3, 4]},
             {"task": "t1/s1", "i": 0, "parent": "t1", "after_call": 0, "t": 2.05, "end": 2.5, "input_tokens": 32,
              "output_tokens": 4, "ttft": 0.1, "hash_ids": [9, 10]},
             {"task": "t1", "i": 1, "t": 2.6, "end": 2.7, "status": 503, "error": "http_503"},
             {"task": "t1", "i": 2, "t": 3.5, "end": 4.0, "input_tokens": 96, "output_tokens": 8, "hash_keep": 4,
              "hash_ids": [5, 6], "stop_reason": "stop", "model": "m", "api": "chat"},
             {"revise": "t1/s1", "parent": "t1", "after_call": 0},
             {"task": "t2", "i": 0, "t": 3.0, "end": 3.2, "input_tokens": 20, "output_tokens": 1, "hash_ids": [50]}]
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def seeds() -> dict[str, tuple[str, bytes]]:
    """Format name -> (file suffix, seed content)."""
    return {
        "claude-code": (".json", _claude_seed()),
        "tracelab": (".jsonl", _head_lines(TRACES / "tracelab" / "round_trace.jsonl", 3)),
        "tracelab-gz": (".jsonl.gz", gzip.compress(_head_lines(TRACES / "tracelab" / "round_trace.jsonl", 3), mtime=0)),
        "lmcache": (".jsonl", _head_lines(TRACES / "lmcache" / "taubench" / "5cacdab43997ef46db773ba7a7d4aa13.jsonl", 5)),
        "tracelab-csv": (".csv", (TRACES / "tracelab" / "multi_session_example.csv").read_bytes()),
        "mooncake": (".jsonl", _head_lines(TRACES / "mooncake" / "conversation_trace_head200.jsonl", 6)),
        "bailian": (".jsonl", _head_lines(TRACES / "bailian" / "bailian_sample_from_format.jsonl", 10)),
        "dynamo": (".jsonl", (FIXTURES / "dynamo_agent_trace.jsonl").read_bytes()),
        "dynamo-gz": (".jsonl.gz", gzip.compress((FIXTURES / "dynamo_agent_trace.jsonl").read_bytes(), mtime=0)),
        "otel": (".json", (FIXTURES / "otel_openllmetry.json").read_bytes()),
        "otel-proto": (".pb", (FIXTURES / "otel_openllmetry.pb").read_bytes()),
        "burstgpt": (".csv", (FIXTURES / "burstgpt_sessions.csv").read_bytes()),
        "azure": (".csv", _head_lines(TRACES / "azure-2023" / "AzureLLMInferenceTrace_code_rows1500-2499.csv", 12)),
        "native": (".jsonl", _native_seed()),
        "recording": (".jsonl", _recording_seed()),
    }


SCENARIO_SEED = """\
name: fuzz
workload:
  trace: {trace}
  on_error: raise
  transforms:
    token_scale: 0.5
    context_cap: 4096
    rate_scale: 2.0
    gap_cap: 30
  stagger: 1.0
emulator:
  ttft: 0.05
  itl: 0.01
  faults: ["http_500:0.01"]
run:
  duration: 60
  max_tasks: 5
  drain: 10
  retries: 1
slo:
  ttft_ms: {{p99: 2000}}
  task_s: {{p90: 60}}
"""


# ---- nasty values -----------------------------------------------------------------------------------------


def _deep(rng: random.Random) -> Any:
    depth = rng.choice([50, 1100, 5000])
    value: Any = 1
    for _ in range(depth):
        value = [value] if rng.random() < 0.5 else {"k": value}
    return value


NASTY_JSON: list[Callable[[random.Random], Any]] = [
    lambda r: r.choice([2**31, 2**32, 2**63 - 1, 2**63, 2**64, 10**30, -1, -(2**63), 0, 1, MAX_TOKENS + 1]),
    lambda r: r.choice([1e308, -1e308, 1e-308, 0.5, -0.0, 1.5, 1e16]),
    lambda r: r.choice([True, False, None]),
    lambda r: r.choice(["", "x", "1", "nan", "2024-13-45T99:99:99", "0001-01-01T00:00:00-23:59", "9999-12-31T23:59:59",
                        "\u0000", "\ud7ff" * 3, "é" * 10, "x" * 100_000]),
    lambda r: r.choice([[], {}, [True], [1.5], ["a"], [2**63], [-5], [None], [[1]], {"a": 1}]),
    _deep,
    lambda r: [r.randrange(0, 2**63) for _ in range(r.randrange(0, 20))],
    lambda r: list(range(r.randrange(0, 5000))),
]

NASTY_TEXT = ["", "-1", "1e400", "nan", "inf", "-inf", "9" * 5000, "640000000", "16777217", "1.5", "18.0", "0x10",
              "\u00e9t\u00e9", "\"", "\"\"", "a,b", "\n", "1\r2", "2023-11-16 18:17:03.9799600", "0001-01-01 00:00:00+23:59",
              "9999-12-31 23:59:59.9999999", "1970-01-01T00:00:00Z", "１２", "²"]

NASTY_YAML = [".inf", "-.inf", ".nan", "1e308", "-1", "0", "nan", "abc", "true", "null", "~", "[]", "{}", "'nan'",
              "\"http://\"", "2**63", "99999999999999999999999", "[" * 3000 + "]" * 3000, "{a: " * 400 + "1" + "}" * 400,
              "!!binary aGVsbG8=", "!!python/object:os.system ls", "*undefined", "&a [*a]", "x" * 5000,
              "[[1, 2], [3]]", "{ttft: abc}", "http_999:2", "- 1\n- 2"]

SET_KEYS = ["run.duration", "run.drain", "run.max_tasks", "run.warmup", "workload.stagger", "workload.format",
            "workload.transforms.token_scale", "workload.transforms.rate_scale", "workload.transforms.context_cap",
            "workload.transforms.rate_mode", "workload.trace", "emulator.ttft", "emulator.itl", "emulator.faults",
            "emulator.max_model_len", "emulator.profile", "emulator", "target.base_url", "target", "slo.ttft_ms.p99.9",
            "slo.ttft_ms.p99", "slo.task_s.max", "name", "x.y.z", "run", "run..x", "workload.transforms.time_scale",
            "workload.transforms.gap_scale", "workload.generate.tasks"]


# ---- mutators ---------------------------------------------------------------------------------------------


def _bytes_mutation(data: bytes, rng: random.Random) -> bytes:
    kind = rng.randrange(9)
    n = len(data)
    pos = rng.randrange(n + 1)
    if kind == 0 and n:  # flip a byte
        i = rng.randrange(n)
        return data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1:]
    if kind == 1:  # insert random bytes, often not UTF-8
        return data[:pos] + bytes(rng.randrange(256) for _ in range(rng.randrange(1, 8))) + data[pos:]
    if kind == 2 and n:  # delete a range
        end = min(n, pos + rng.randrange(1, 64))
        return data[:pos] + data[end:]
    if kind == 3 and n:  # duplicate a range
        end = min(n, pos + rng.randrange(1, 256))
        return data[:end] + data[pos:end] + data[end:]
    if kind == 4:  # truncate
        return data[:pos]
    if kind == 5:  # Latin-1 text where UTF-8 was
        return data[:pos] + rng.choice([b"\xe9t\xe9", b"\xff", b"\xfe\xff", b"\x80\x81", b"\xc3"]) + data[pos:]
    if kind == 6:  # the whole file in another encoding
        text = data.decode("utf-8", "replace")
        encoding = rng.choice(["utf-16", "utf-16-le", "utf-16-be", "latin-1", "utf-32", "utf-8-sig"])
        return text.encode(encoding, "replace")
    if kind == 7:  # NUL
        return data[:pos] + b"\x00" + data[pos:]
    return data + data  # the records twice (repeated ids, rounds, timestamps)


def _nodes(value: Any, path: tuple = ()) -> list[tuple]:
    """Paths to every value in a JSON document (iteratively)."""
    out = []
    stack = [(value, path)]
    while stack and len(out) < 5000:
        node, at = stack.pop()
        out.append(at)
        if isinstance(node, dict):
            stack.extend((v, at + (k,)) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, at + (i,)) for i, v in enumerate(node[:200]))
    return out


def _set_at(doc: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    node = doc
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return doc


def _json_doc_mutation(doc: Any, rng: random.Random) -> Any:
    path = rng.choice(_nodes(doc))
    action = rng.randrange(4)
    if action == 0 and path:  # drop the value
        parent = doc
        for part in path[:-1]:
            parent = parent[part]
        del parent[path[-1]]
        return doc
    if action == 1:  # add an unexpected key
        parent = doc
        for part in path:
            parent = parent[part]
        if isinstance(parent, dict):
            parent[rng.choice(["hash_keep", "type", "event_type", "x", "subtasks", "hash_ids"])] = rng.choice(NASTY_JSON)(rng)
            return doc
    return _set_at(doc, path, rng.choice(NASTY_JSON)(rng))


def _dumps(doc: Any) -> bytes:
    try:
        return json.dumps(doc, allow_nan=True).encode("utf-8", "surrogatepass")
    except (RecursionError, ValueError):
        return b"[" * 100_000


def _json_mutation(data: bytes, rng: random.Random, lines: bool) -> bytes:
    if lines:
        rows = data.splitlines()
        if not rows:
            return data
        i = rng.randrange(len(rows))
        try:
            doc = json.loads(rows[i])
        except (ValueError, RecursionError):  # an earlier mutation's work
            return data
        rows[i] = _dumps(_json_doc_mutation(doc, rng))
        return b"\n".join(rows) + b"\n"
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return data
    return _dumps(_json_doc_mutation(doc, rng))


def _csv_mutation(data: bytes, rng: random.Random) -> bytes:
    rows = data.decode("utf-8", "replace").splitlines()
    if not rows:
        return data
    i = rng.randrange(len(rows))
    cells = rows[i].split(",")
    j = rng.randrange(len(cells))
    action = rng.randrange(4)
    if action == 0:
        cells[j] = rng.choice(NASTY_TEXT)
    elif action == 1:
        del cells[j]
    elif action == 2:
        cells.insert(j, rng.choice(NASTY_TEXT))
    else:
        rows.insert(i + 1, rows[i])  # a repeated row
    rows[i] = ",".join(cells)
    text = "\n".join(rows) + "\n"
    return text.encode(rng.choice(["utf-8", "utf-8", "latin-1"]), "replace")


def mutate(fmt: str, data: bytes, rng: random.Random) -> bytes:
    """One to three mutations of a seed of `fmt`."""
    if fmt == "tracelab-gz" and rng.random() < 0.8:  # mostly the content, compressed again
        return gzip.compress(mutate("tracelab", gzip.decompress(data), rng), mtime=0)
    if fmt == "dynamo-gz" and rng.random() < 0.8:
        return gzip.compress(mutate("dynamo", gzip.decompress(data), rng), mtime=0)
    for _ in range(rng.randrange(1, 4)):
        if rng.random() < 0.35:
            data = _bytes_mutation(data, rng)
        elif fmt in ("tracelab-csv", "burstgpt", "azure"):
            data = _csv_mutation(data, rng)
        elif fmt in ("tracelab", "mooncake", "native", "lmcache", "bailian", "dynamo", "recording"):
            data = _json_mutation(data, rng, lines=True)
        elif fmt in ("claude-code", "otel"):
            data = _json_mutation(data, rng, lines=False)
        else:
            data = _bytes_mutation(data, rng)
    return data


def mutate_scenario(text: str, rng: random.Random) -> tuple[str, list[str]]:
    """A mutated scenario text and --set overrides."""
    lines = text.splitlines()
    for _ in range(rng.randrange(0, 3)):
        i = rng.randrange(len(lines))
        head, sep, _ = lines[i].partition(": ")
        if sep:
            lines[i] = f"{head}: {rng.choice(NASTY_YAML)}"
        elif rng.random() < 0.5:
            del lines[i]
    overrides = [f"{rng.choice(SET_KEYS)}={rng.choice(NASTY_YAML)}" for _ in range(rng.randrange(0, 3))]
    if rng.random() < 0.1:
        lines.append("target: {base_url: http://localhost:8000}")
    if rng.random() < 0.05:
        lines = ["workload:"] + ["  " * k + "a:" for k in range(1, 2000)]
    text = "\n".join(lines) + "\n"
    if rng.random() < 0.05:
        text = text.replace("trace: ", "trace: " + "x" * rng.choice([300, 5000]), 1)
    return text, overrides


# ---- checking what loading gives ---------------------------------------------------------------------------


def _number(value: Any, low: float, high: float) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and low <= value <= high


def _ids_ok(ids: Any) -> bool:
    if isinstance(ids, HashIds):
        return all(first >= 0 and first + count <= ID_LIMIT for first, count in ids.runs())
    return isinstance(ids, tuple) and all(type(i) is int and 0 <= i < ID_LIMIT for i in ids)


def _task_problems(task: Task, depth: int) -> Optional[str]:
    if depth > MAX_DEPTH + 1:
        return "sub-tasks nested too deep"
    if not isinstance(task.id, str) or not isinstance(task.task_class, str):
        return "task id or class not a string"
    if not _number(task.arrival, 0, MAX_SECONDS):
        return f"arrival {task.arrival!r}"
    for c in task.calls:
        for name in ("input_tokens", "output_tokens", "block_size"):
            value = getattr(c, name)
            if type(value) is not int or not 0 <= value <= MAX_TOKENS:
                return f"{name} {value!r}"
        if not _number(c.gap, 0, MAX_SECONDS):
            return f"gap {c.gap!r}"
        if c.server_time is not None and not _number(c.server_time, 0, MAX_SECONDS):
            return f"server_time {c.server_time!r}"
        if c.sent_at is not None and not _number(c.sent_at, -MAX_SECONDS, MAX_SECONDS):
            return f"sent_at {c.sent_at!r}"
        if not _ids_ok(c.hash_ids):
            return "hash ids not ints in [0, 2**63)"
        if c.stop_reason is not None and not isinstance(c.stop_reason, str):
            return "stop_reason not a string"
    for sub in task.subtasks:
        if type(sub.after_call) is not int or not -1 <= sub.after_call < len(task.calls):
            return f"after_call {sub.after_call!r} of a task of {len(task.calls)} calls"
        problem = _task_problems(sub.task, depth + 1)
        if problem:
            return problem
    return None


def check_workload(workload: Workload) -> Optional[str]:
    """What is wrong with a loaded workload (None: nothing); it must also write and read back as native."""
    if not workload.tasks:
        return "no tasks"
    for task in workload.tasks:
        problem = _task_problems(task, 0)
        if problem:
            return f"task {task.id!r}: {problem}"
    buffer = io.BytesIO()
    native.write(workload, buffer)
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as fh:
        fh.write(buffer.getvalue())
        fh.flush()
        again = load([fh.name])
    if again.tasks != workload.tasks:
        return "native round trip changed the tasks"
    return None


@dataclass
class Outcome:
    kind: str
    detail: str = ""


def _classify(run: Callable[[], Workload]) -> Outcome:
    try:
        workload = run()
    except InputError as exc:
        return Outcome("input_error", str(exc)[:200])
    except Exception as exc:  # noqa: BLE001 - what the fuzzing looks for
        tail = traceback.extract_tb(exc.__traceback__)[-1]
        return Outcome("other", f"{type(exc).__name__}: {str(exc)[:200]} at {Path(tail.filename).name}:{tail.lineno}")
    try:
        problem = check_workload(workload)
    except Exception as exc:  # noqa: BLE001
        return Outcome("invalid", f"check failed: {type(exc).__name__}: {str(exc)[:200]}")
    return Outcome("invalid", problem) if problem else Outcome("valid")


def trace_case(fmt: str, seed: tuple[str, bytes], rng: random.Random, folder: Path) -> Outcome:
    """Load one mutated file of `fmt` (detected, or forced with --format half the time)."""
    suffix, data = seed
    path = folder / f"case{suffix}"
    path.write_bytes(mutate(fmt, data, rng))
    forced = None if rng.random() < 0.5 else {"otel-proto": "otel", "tracelab-gz": "tracelab",
                                              "dynamo-gz": "dynamo"}.get(fmt, fmt)
    on_error = rng.choice(["raise", "skip"])
    return _classify(lambda: load([path], forced, on_error))


def folder_case(all_seeds: dict[str, tuple[str, bytes]], rng: random.Random, folder: Path) -> Outcome:
    """Load a folder of two or three mutated files of different formats."""
    sub = folder / "folder"
    sub.mkdir(exist_ok=True)
    for old in sub.iterdir():
        old.unlink()
    for k, fmt in enumerate(rng.sample(sorted(all_seeds), rng.randrange(2, 4))):
        suffix, data = all_seeds[fmt]
        (sub / f"f{k}{suffix}").write_bytes(mutate(fmt, data, rng) if rng.random() < 0.7 else data)
    return _classify(lambda: load([sub], None, rng.choice(["raise", "skip"])))


def scenario_case(rng: random.Random, folder: Path) -> Outcome:
    """Parse a mutated scenario (with --set overrides) and, when it parses, load its workload."""
    text, overrides = mutate_scenario(SCENARIO_SEED.format(trace=TRACES / "claude-code" / "trace_0103.json"), rng)
    source = str(folder / "scenario.yaml")

    def run() -> Workload:
        return scenario_mod.load_workload(scenario_mod.parse(text, source, overrides))

    return _classify(run)


class Fuzzer:
    """Runs cases in a scratch folder; `case(kind, rng)` with kind a format name, "folder" or "scenario"."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.seeds = seeds()

    def kinds(self) -> list[str]:
        return sorted(self.seeds) + ["folder", "scenario"]

    def case(self, kind: str, rng: random.Random) -> Outcome:
        if kind == "scenario":
            return scenario_case(rng, self.folder)
        if kind == "folder":
            return folder_case(self.seeds, rng, self.folder)
        return trace_case(kind, self.seeds[kind], rng, self.folder)

