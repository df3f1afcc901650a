"""Speed of the workload model: fit time on the whole shared Weka Claude Code set, and calls per second
of wall time for `generate` (library call, then with the native file written).

Run: .venv/bin/python benchmarks/generate_speed.py [--tasks 600]
Targets (issue): generate >= 200k calls/s; fitting the whole Weka set < 30 s.
"""

from __future__ import annotations

import argparse
import io
import time
from pathlib import Path

from simulator.model.fit import fit_model
from simulator.model.generate import generate
from simulator.traces import load, native

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"


def _generate(name: str, model, tasks: int, rate: float) -> None:
    start, cpu = time.perf_counter(), time.process_time()
    workload = generate(model, tasks=tasks, seed=1, rate=rate)
    gen_s = time.perf_counter() - start
    gen_cpu = time.process_time() - cpu
    _, calls, _ = workload.counts()
    ids = sum(len(c.hash_ids) for c in workload.all_calls())
    buf = io.BytesIO()
    start = time.perf_counter()
    native.write(workload, buf)
    write_s = time.perf_counter() - start
    print(f"{name}: {tasks} tasks, {calls} calls, {ids / calls:.0f} hash ids per call")
    print(f"  generate         {gen_s:7.2f} s  {calls / gen_s:>12,.0f} calls/s  {ids / gen_s:>14,.0f} hash ids/s"
          f"  (CPU time {gen_cpu:.2f} s: {calls / gen_cpu:,.0f} calls/s; the rest is waiting for a shared CPU)")
    print(f"  + native write   {gen_s + write_s:7.2f} s  {calls / (gen_s + write_s):>12,.0f} calls/s  ({len(buf.getvalue()) / 1e6:.0f} MB)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=600, help="Claude Code tasks to generate (each ~25 calls of ~2k hash ids)")
    ap.add_argument("--azure-tasks", type=int, default=200000)
    args = ap.parse_args()

    start = time.perf_counter()
    weka = load([SHARED / "weka-claude-code"])
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    model = fit_model(weka, allow_fallback=True)
    fit_s = time.perf_counter() - start
    tasks, calls, _ = weka.counts()
    print(f"Weka set: {tasks} sessions, {calls} calls: import {load_s:.1f} s, fit {fit_s:.1f} s (target < 30 s)")
    _generate("Claude Code model", model, args.tasks, rate=0.1)

    azure = load([SHARED / "azure-2023"])
    start = time.perf_counter()
    azure_model = fit_model(azure, allow_fallback=True)
    print(f"\nAzure code trace: {len(azure.tasks)} requests, fit {time.perf_counter() - start:.1f} s")
    _generate("Azure code model", azure_model, args.azure_tasks, rate=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
