"""Speed of `generate`: calls per second, wall and CPU time, for the Claude Code model (long agent tasks,
~1,600 hash ids per call) and an Azure-like single-call model (fitted to the shared Azure code trace).

Three figures per model: `generate` (an in-memory Workload, whole hash-id tuples), `generate` then
`native.write` to a file, and `write_generated` (straight to the native file, as `agentload generate
-o` does; it checks that both files are the same bytes). Wall time counts waiting for a busy CPU too.
With --fit, the Claude Code model is fitted to the whole shared Weka set first (timed) instead of read
from models/claude-code.yaml.

Run: .venv/bin/python benchmarks/generate_speed.py [--tasks 600] [--azure-tasks 200000] [--fit]
Targets (issue): >= 200k calls/s of wall time, with the native file written; fitting Weka < 30 s.
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from pathlib import Path

from simulator.model.fit import fit_model
from simulator.model.generate import generate, write_generated
from simulator.model.schema import load_model
from simulator.traces import load, native

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"


def _timed(fn):
    """(result, wall s, CPU s) of fn()."""
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def _row(label: str, calls: int, wall: float, cpu: float, extra: str = "") -> None:
    print(f"  {label:<26} {wall:6.2f} s wall {calls / wall:>10,.0f} calls/s   CPU {cpu:6.2f} s {calls / cpu:>10,.0f} calls/s  {extra}")


def _generate(name: str, model, tasks: int, rate, tmp: Path) -> None:
    kw = dict(tasks=tasks, seed=1, rate=rate)
    workload, gen_wall, gen_cpu = _timed(lambda: generate(model, **kw))
    _, calls, _ = workload.counts()
    ids = sum(len(c.hash_ids) for c in workload.all_calls())
    written = tmp / "written.jsonl"
    _, w_wall, w_cpu = _timed(lambda: native.write(workload, written))
    del workload
    streamed = tmp / "streamed.jsonl"
    _, s_wall, s_cpu = _timed(lambda: write_generated(model, streamed, **kw))
    same = written.read_bytes() == streamed.read_bytes()
    print(f"{name}: {tasks} tasks, {calls} calls, {ids / calls:.0f} hash ids per call, "
          f"native file {written.stat().st_size / 1e6:.1f} MB")
    _row("generate (Workload)", calls, gen_wall, gen_cpu, f"{ids / gen_cpu:,.0f} hash ids/s of CPU")
    _row("generate + native.write", calls, gen_wall + w_wall, gen_cpu + w_cpu)
    _row("write_generated (file)", calls, s_wall, s_cpu, f"same bytes: {same}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=600, help="Claude Code tasks to generate (each ~25 calls of ~1.6k hash ids)")
    ap.add_argument("--azure-tasks", type=int, default=200000)
    ap.add_argument("--fit", action="store_true", help="fit the Claude Code model to the shared Weka set (timed)")
    args = ap.parse_args()

    if args.fit:
        start = time.perf_counter()
        weka = load([SHARED / "weka-claude-code"])
        load_s = time.perf_counter() - start
        start = time.perf_counter()
        model = fit_model(weka, allow_fallback=True)
        tasks, calls, _ = weka.counts()
        print(f"Weka set: {tasks} sessions, {calls} calls: import {load_s:.1f} s, fit {time.perf_counter() - start:.1f} s (target < 30 s)")
    else:
        model = load_model(ROOT / "models" / "claude-code.yaml")
    azure_model = fit_model(load([SHARED / "azure-2023"]), allow_fallback=True)
    with tempfile.TemporaryDirectory() as tmp:
        _generate("Claude Code model", model, args.tasks, 0.1, Path(tmp))
        print()
        _generate("Azure code model", azure_model, args.azure_tasks, None, Path(tmp))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
