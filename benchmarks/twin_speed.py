"""How fast the server twin simulates (not run as a test; prints its figures).

1. 512 tokens in, 512 out, 256 closed-loop streams (8 requests each) on the GB300 default profile:
   simulated seconds per wall second (target: >= 1,000x real time).
2. An agent workload of N calls (default one million): tasks of ~20 calls whose prompt grows turn by
   turn over a shared prefix (hash ids), tool gaps of seconds, Poisson arrivals; wall seconds for the
   whole SimPy run, driver and generation included (target: < 60 s on one core; the process CPU time
   is printed beside wall time, which on a shared machine includes waiting for a core).

3. A scenario (`--scenario`, e.g. scenarios/gb300-agents.yaml on the GB300 default profile), as
   `agentload simulate` runs it with every inter-token gap kept: process CPU seconds of the simulation
   (records and histograms written, summary left out) and simulated seconds per CPU second (target for
   gb300-agents: >= 10,000x real time); with `--baseline DIR` (a checkout of an earlier commit, e.g.
   `git worktree add /tmp/base COMMIT`) the same measured on that code in the same run, and whether
   both wrote the same call and task records (the same JSON values line for line).

    .venv/bin/python benchmarks/twin_speed.py [--calls 1000000] [--profile NAME] [--skip-shape] [--shared-ids]
        [--scenario FILE [--baseline DIR] [--repeat N]]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import numpy as np

from simulator.sim.driver import SimDriver
from simulator.sim.profile import load_profile
from simulator.sim.shapes import fixed_shape_throughput
from simulator.hash_ids import HashIds
from simulator.workload import Call, Task


class CountingSink:
    """Keeps counts only, so the benchmark measures the simulation, not record storage."""

    def __init__(self) -> None:
        self.calls = 0
        self.tasks = 0
        self.output_tokens = 0
        self.cached_tokens = 0
        self.input_tokens = 0

    def call(self, record, gaps=()) -> None:
        self.calls += 1
        self.output_tokens += record.output_tokens
        self.input_tokens += record.input_tokens
        self.cached_tokens += record.cached_tokens or 0

    def task(self, record) -> None:
        self.tasks += 1


def agent_tasks(calls: int, seed: int, rate: float, trace_block: int, shared_ids: bool = False) -> Iterator[Task]:
    """Synthetic agent tasks in arrival order: a system prompt shared by all, a conversation growing
    turn by turn, tool gaps of seconds. Generated lazily (a million calls of long prompts would hold
    gigabytes of hash ids at once), a task's draws at once. With `shared_ids`, a task's calls hold
    their ids as the importers give them: `HashIds` views of one chain, not a tuple each."""
    rng = np.random.default_rng(seed)
    system = tuple(range(1, 1 + 8192 // trace_block))  # shared 8k-token system prompt and tools
    made = 0
    count = 0
    t = 0.0
    next_id = 10**6
    while made < calls:
        n = min(calls - made, int(rng.integers(5, 36)))
        t += float(rng.exponential(1.0 / rate))
        grow = rng.lognormal(6.5, 1.0, n).astype(np.int64)  # tool results and the previous answer
        prompts = np.minimum(len(system) * trace_block + np.cumsum(grow), 60_000).tolist()
        outs = np.maximum(1, rng.lognormal(5.0, 0.8, n).astype(np.int64)).tolist()
        gaps = rng.lognormal(0.5, 1.2, n).tolist()
        gaps[0] = 0.0
        fresh = prompts[-1] // trace_block - len(system)
        history = system + tuple(range(next_id, next_id + fresh))
        next_id += fresh
        ids = HashIds.of(history) if shared_ids else history
        chain = tuple(Call(p, o, gap=g, hash_ids=ids[:p // trace_block], block_size=trace_block)
                      for p, o, g in zip(prompts, outs, gaps))
        yield Task(f"task-{count}", chain, arrival=t)
        count += 1
        made += n


def scenario_speed(path: str, profile: str, code: Path, folder: Path) -> dict:
    """Simulate scenario `path` on `profile` with the library in `code` (a child process, so each side
    imports its own code): CPU seconds of the twin's run, simulated seconds, records folder."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    out = subprocess.run([sys.executable, str(Path(__file__).with_name("scenario_cpu.py")), path, profile, str(folder)],
                         env=env, cwd=code, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def same_records(a: Path, b: Path) -> bool:
    """Whether two record files hold the same JSON values, line for line (parsed and written out again
    by json: 1 and 1.0 differ, NaN equals NaN, the key order counts; the bytes may differ, as the
    separators of records written by orjson and by json.dumps do)."""
    with open(a, encoding="utf-8") as fa, open(b, encoding="utf-8") as fb:
        for x, y in itertools.zip_longest(fa, fb):
            if x is None or y is None or json.dumps(json.loads(x)) != json.dumps(json.loads(y)):
                return False
    return True


def print_scenario_speed(path: str, profile: str, baseline: Path | None, repeat: int) -> None:
    """Time the scenario on this code (and on `baseline`'s), the least CPU of `repeat` runs each."""
    here = Path(__file__).resolve().parent.parent
    sides = [("now", here)] + ([("baseline", baseline.resolve())] if baseline is not None else [])
    with tempfile.TemporaryDirectory() as tmp:
        best = {}
        for name, code in sides:
            runs = [scenario_speed(str(Path(path).resolve()), profile, code, Path(tmp) / f"{name}-{i}")
                    for i in range(repeat)]
            best[name] = min(runs, key=lambda r: r["replay_cpu_s"])
            r = best[name]
            print(f"{Path(path).name} on {profile} ({name}: {code}): {r['simulated_s']:,.0f} simulated s, "
                  f"twin run {r['replay_cpu_s']:.2f} s CPU = {r['simulated_s'] / r['replay_cpu_s']:,.0f}x real time; "
                  f"whole process {r['process_cpu_s']:.2f} s CPU (least of {repeat})")
        if baseline is not None:
            same = all(same_records(Path(tmp) / "now-0" / f, Path(tmp) / "baseline-0" / f)
                       for f in ("calls.jsonl", "tasks.jsonl"))
            speedup = best["baseline"]["replay_cpu_s"] / best["now"]["replay_cpu_s"]
            print(f"  {speedup:.2f}x less CPU than the baseline; call and task records "
                  f"{'identical' if same else 'DIFFER'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--profile", default="gb300-nemotron-super-default")
    parser.add_argument("--rate", type=float, default=0.3,
                        help="task arrivals per second (0.3: ~30 conversations decoding at once on the GB300 default)")
    parser.add_argument("--trace-block", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--skip-shape", action="store_true")
    parser.add_argument("--shared-ids", action="store_true",
                        help="give calls HashIds views of one chain per task, as the importers do (default: tuples)")
    parser.add_argument("--scenario", help="also time this scenario file, as `agentload simulate` runs it")
    parser.add_argument("--baseline", type=Path, help="a checkout of earlier code to time the scenario on as well")
    parser.add_argument("--repeat", type=int, default=3, help="runs of the scenario on each side (the least CPU counts)")
    parser.add_argument("--skip-agent", action="store_true", help="leave out the agent workload of --calls calls")
    args = parser.parse_args()
    profile = load_profile(args.profile)
    if args.scenario:
        print_scenario_speed(args.scenario, args.profile, args.baseline, args.repeat)
    if args.skip_agent:
        return

    if not args.skip_shape:
        start = time.perf_counter()
        shape = fixed_shape_throughput(profile, concurrency=256, input_tokens=512, output_tokens=512)
        wall = time.perf_counter() - start
        print(f"512/512 x 256 on {args.profile}: {shape.requests} requests, {shape.duration:.1f} simulated s "
              f"in {wall:.3f} wall s = {shape.duration / wall:,.0f}x real time "
              f"({shape.output_tokens_per_s:,.0f} output tok/s)")

    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in agent_tasks(args.calls, args.seed, args.rate, args.trace_block, args.shared_ids):
        pass
    generation, generation_cpu = time.perf_counter() - start, time.process_time() - cpu_start
    sink = CountingSink()
    start, cpu_start = time.perf_counter(), time.process_time()
    result = SimDriver(agent_tasks(args.calls, args.seed, args.rate, args.trace_block, args.shared_ids), profile,
                       sink).run()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    stats = result.twin
    sim, sim_cpu = wall - generation, cpu - generation_cpu
    # On a shared machine wall time includes waiting for a core; process CPU time is the one-core figure.
    print(f"agent workload: {sink.calls:,} calls in {sink.tasks:,} tasks, {result.end:,.0f} simulated s: "
          f"{wall:.1f} wall s ({cpu:.1f} s CPU) with the tasks generated as they arrive, of which generation "
          f"{generation:.1f} s ({generation_cpu:.1f} s CPU); simulation {sim_cpu / sink.calls * 1e6:.1f} us CPU a call "
          f"({sim / sink.calls * 1e6:.1f} us wall), {result.end / sim_cpu:,.0f}x real time")
    print(f"  steps {stats.steps:,} (fast chunks {stats.fast_chunks:,}), max running {stats.max_running}, "
          f"preemptions {stats.preemptions}, prefix hit rate {sink.cached_tokens / max(1, sink.input_tokens):.1%}, "
          f"busy {stats.busy_time / max(result.end, 1e-9):.0%}")


if __name__ == "__main__":
    main()
