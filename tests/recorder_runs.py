"""What the recorder's end-to-end tests and benchmarks share: a generated agent workload with sub-agents,
servers and the recorder as child processes, and how recorded tasks are matched to the replayed ones."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import yaml

from grouping_replay import matched_pairs
from simulator.model.generate import generate
from simulator.model.schema import WorkloadModel
from simulator.traces import native
from simulator.workload import Call, SubTask, Task, Workload

ROOT = Path(__file__).resolve().parents[1]


def agent_workload(tasks: int, rate: float, seed: int, spawn_prob: float = 0.08, token_scale: float = 0.02,
                   gap_span: float = 0.3) -> Workload:
    """Claude Code tasks drawn from the shipped model, sub-agents made common (`spawn_prob` after each call),
    prompts scaled by `token_scale`, and every gap g squashed smoothly to ``gap_span * g / (g + 10)`` (an
    hour of think time becomes `gap_span` s, a second about a tenth of that). The model draws whole
    seconds; each gap but a (sub-)task's first gets a uniform fraction of a second added, so that no gap value repeats (a
    recorder sees every gap a millisecond or two longer, the client's own time: on a distribution of a few
    repeated values that shift alone would read as a large KS distance)."""
    raw = yaml.safe_load((ROOT / "models" / "claude-code.yaml").read_text())
    for cls in raw["classes"].values():
        cls["structure"]["subagents"]["spawn_prob"] = spawn_prob
    model = WorkloadModel.model_validate(raw)
    drawn = generate(model, tasks=tasks, rate=rate, seed=seed)
    rng = np.random.default_rng(seed)

    def scaled(call: Call, first: bool) -> Call:
        tokens = max(16, round(call.input_tokens * token_scale))
        out = max(1, round(call.output_tokens * token_scale))
        keep = min(len(call.hash_ids), tokens // max(call.block_size, 1)) if call.block_size else 0
        return dataclasses.replace(call, input_tokens=tokens, output_tokens=min(out, 64),
                                   hash_ids=call.hash_ids[:keep],
                                   gap=gap_span * (g := call.gap + (0.0 if first else rng.random())) / (g + 10.0))

    def task(t: Task) -> Task:
        subs = tuple(SubTask(s.after_call, task(s.task), s.wait) for s in t.subtasks)
        return dataclasses.replace(t, calls=tuple(scaled(c, k == 0) for k, c in enumerate(t.calls)), subtasks=subs)

    return Workload(tuple(task(t) for t in drawn.tasks), drawn.provenance)


def write_native(workload: Workload, path: Path) -> Path:
    with open(path, "wb") as fh:
        native.write(workload, fh)
    return path


@contextmanager
def python_child(*argv: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """``python ARGV`` in a child process serving HTTP; yields the URL its first line ends with and the
    process, whose ``log()`` gives everything else it printed (stdout and stderr, kept in a file: a pipe
    nobody reads would stop the child once full) and, once the block is left, ``said`` all of it. The
    child is stopped with SIGTERM when the block ends, if it still runs."""
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, stderr=log, cwd=ROOT)

    def read_log() -> bytes:
        log.seek(0)
        return log.read() + (proc.stdout.read() if proc.poll() is not None else b"")

    proc.log = read_log  # type: ignore[attr-defined]
    try:
        line = proc.stdout.readline().decode()
        if "http://" not in line:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"{' '.join(argv[:3])} did not start: {line!r} {read_log().decode()[-2000:]}")
        yield line.rsplit(" ", 1)[1].strip(), proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        proc.said = read_log().decode(errors="replace")  # type: ignore[attr-defined]
        log.close()


def child(*args: str):
    """``agentload ARGS`` in a child process (`python_child`)."""
    return python_child("-m", "simulator", *args)


def emulator(*extra: str):
    """The built-in emulator with fast fixed timing (20 ms to the first token, 2 ms a token)."""
    return child("serve-emulator", "--host", "127.0.0.1", "--port", "0", "--ttft", "0.02", "--itl", "0.002", *extra)


def recorder(upstream: str, out: Path, *extra: str):
    return child("record", "--upstream", upstream, "--listen", "127.0.0.1:0", "-o", str(out), *extra)


def share_right(truth: Sequence[str], found: Sequence[str]) -> float:
    """Share of calls in the right task: true and found tasks matched one to one so that the matched pairs
    share the most calls (`grouping_replay.matched_pairs`); the calls of matched pairs count as right."""
    right, _ = matched_pairs(list(truth), list(found))
    return right / max(len(truth), 1)


def recorded_calls(recorded: Workload) -> dict[tuple[int, int], list[tuple[float, str, str]]]:
    """Per (input, output tokens): the recorded calls' (send time, top-level task, own (sub-)task), in
    order of sending."""
    out: dict[tuple[int, int], list[tuple[float, str, str]]] = {}

    def walk(top: Task, t: Task, start: float) -> None:
        for c in t.calls:
            out.setdefault((c.input_tokens, c.output_tokens), []).append((start + (c.sent_at or 0.0), top.id, t.id))
        for s in t.subtasks:
            # a sub-task's sent_at counts from its start: the end of the parent's call it follows
            parent_call = t.calls[s.after_call] if s.after_call >= 0 else None
            sub_start = start + ((parent_call.sent_at or 0.0) + (parent_call.server_time or 0.0) if parent_call else 0.0)
            walk(top, s.task, sub_start)

    for top in recorded.tasks:
        walk(top, top, top.arrival)
    for calls in out.values():
        calls.sort()
    return out


def matched_owners(records: Path, recorded: Workload) -> dict[str, list[str]]:
    """The true and found owners of each call the run sent and the recorder recorded: ``true_top``,
    ``found_top`` (top-level tasks), ``true_own``, ``found_own`` ((sub-)tasks). Calls are matched by their
    token counts, in order of sending (the run's `calls.jsonl` against the recording's send times)."""
    sent = []
    with open(records, "rb") as fh:
        for line in fh:
            r = json.loads(line)
            if r["ok"]:
                sent.append((r["actual_send"], (r["input_tokens"], r["output_tokens"]), r["task_id"]))
    sent.sort()
    found = recorded_calls(recorded)
    cursor: dict[tuple[int, int], int] = {}
    out: dict[str, list[str]] = {"true_top": [], "found_top": [], "true_own": [], "found_own": []}
    for _, key, task_id in sent:
        k = cursor.get(key, 0)
        if k >= len(found.get(key, ())):
            continue
        cursor[key] = k + 1
        _, top, own = found[key][k]
        out["true_top"].append(task_id.split(".sub")[0])
        out["true_own"].append(task_id)
        out["found_top"].append(top)
        out["found_own"].append(own)
    return out
