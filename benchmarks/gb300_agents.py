"""The GB300 presets under agent traffic, ranked against their 512/512 ranking (not a test; prints a table).

Runs scenarios/gb300-agents.yaml on the twin of each of the five GB300 presets, as
`agentload simulate scenarios/gb300-agents.yaml -p PRESET` does (the same tasks for each: the workload
is generated once), and the published 512-in/512-out shape (256 closed-loop streams). Prints, per
preset: output tokens/s, p50 and p95 task completion time, p95 TTFT, the prefix-cache hit share
(cached prompt tokens over prompt tokens), and the rank of each preset under both loads.

    .venv/bin/python benchmarks/gb300_agents.py [--set KEY=VALUE ...] [--output DIR] [--exact-itl]

`--set` overrides scenario settings as the command line does (e.g. --set workload.generate.rate=0.5);
result folders go under a temporary folder unless `--output` is given. The ITL histogram is
approximated from each call's mean (as `agentload simulate --approx-itl`), which no column here uses.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from gb300_presets import STEPS

from simulator import scenario as scenario_mod
from simulator.behaviour import RetryPolicy
from simulator.pipeline.plan import measurement_window
from simulator.sim.profile import load_profile
from simulator.pipeline.twin import simulate_to_folder
from simulator.sim.shapes import fixed_shape_throughput

SCENARIO = Path(__file__).resolve().parents[1] / "scenarios" / "gb300-agents.yaml"


def ranks(values: list[float], reverse: bool) -> list[int]:
    """1-based rank of each value (1: best; `reverse` when higher is better)."""
    order = sorted(range(len(values)), key=lambda i: values[i], reverse=reverse)
    out = [0] * len(values)
    for rank, i in enumerate(order, 1):
        out[i] = rank
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default=str(SCENARIO))
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--output", help="folder for the five result folders (default: a temporary one)")
    parser.add_argument("--exact-itl", action="store_true", help="keep every inter-token gap (slower)")
    args = parser.parse_args()

    scenario = scenario_mod.load(args.scenario, args.overrides)
    start = time.perf_counter()
    workload = scenario_mod.load_workload(scenario)
    tasks, calls, subtasks = workload.counts()
    print(f"{scenario.display_name()}: {tasks} sessions, {calls} calls, {subtasks} sub-agents "
          f"(generated in {time.perf_counter() - start:.1f} s); window starts at {scenario.run.warmup:g} s")
    window = measurement_window(scenario, workload)
    run = scenario.run
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(args.output) if args.output else Path(tmp)
        for name, step, _published in STEPS:
            profile = load_profile(name)
            shape = fixed_shape_throughput(profile, 256, 512, 512)
            start = time.perf_counter()
            summary, _ = simulate_to_folder(
                workload, profile, base / name, window=window, slo=scenario.slo,
                retry=RetryPolicy(run.retries, run.backoff), duration=run.duration, keep_gaps=args.exact_itl,
                info={"scenario": scenario.display_name(), "scenario_file": scenario.source},
            )
            wall = time.perf_counter() - start
            task_time = summary["tasks"]["completion_time_s"]
            rows.append({
                "name": name, "step": step, "shape": shape.output_tokens_per_s,
                "output": summary["output_throughput"],
                "task_p50": task_time["p50"], "task_p95": task_time["p95"],
                "ttft_p95": summary["p95_ttft_ms"] / 1e3,
                "hit": summary["total_cached_tokens"] / max(1, summary["total_input_tokens"]),
                "failed": summary["calls"]["failed_attempts"], "wall": wall,
                "busy": summary["simulation"]["busy_fraction"],
            })
            simulated = summary["simulation"]["simulated_seconds"]
            print(f"  {name}: simulated {simulated:,.0f} s in {wall:.1f} s", flush=True)

    shape_rank = ranks([r["shape"] for r in rows], reverse=True)
    agent_rank = ranks([r["task_p50"] + 1e-9 * r["task_p95"] for r in rows], reverse=False)
    ttft_rank = ranks([r["ttft_p95"] for r in rows], reverse=False)
    print()
    print(f"{'preset':34s} {'512/512 tok/s':>13s} {'rank':>4s} | {'agents tok/s':>12s} {'task p50 s':>10s} "
          f"{'task p95 s':>10s} {'TTFT p95 s':>10s} {'prefix hit':>10s} {'busy':>5s} {'rank':>4s} {'TTFT rank':>9s}")
    for row, a, b, c in zip(rows, shape_rank, agent_rank, ttft_rank):
        print(f"{row['name']:34s} {row['shape']:13,.0f} {a:4d} | {row['output']:12,.0f} {row['task_p50']:10,.1f} "
              f"{row['task_p95']:10,.1f} {row['ttft_p95']:10,.2f} {row['hit']:10.1%} {row['busy']:5.0%} {b:4d} {c:9d}")
    same = shape_rank == agent_rank
    print(f"ranking by p50 task completion time {'matches' if same else 'differs from'} the 512/512 ranking"
          + ("" if same else f": 512/512 order {_order(rows, shape_rank)}; agents {_order(rows, agent_rank)}"))


def _order(rows: list[dict], rank: list[int]) -> str:
    return " > ".join(rows[i]["name"].removeprefix("gb300-nemotron-super-")
                      for i in sorted(range(len(rows)), key=lambda i: rank[i]))


if __name__ == "__main__":
    main()
