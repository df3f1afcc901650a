"""The twin's server against the real one call by call: each real run re-simulated at its recorded send times.

`twin_accuracy.py` simulates a scenario closed loop, as the real run played it: a task's next call goes
when the twin ends the last one. A twin a little fast on one call then sends the task's later calls
early, they meet other traffic than on the server, and a figure's error mixes what the server model
gets wrong with where the closed loop drifted to. This script takes that out: every call of a real run
(`<scenario>-real-<n>` in a twin_accuracy results folder) is sent to the twin at the instant the client
sent it to the server, with the same prompt blocks, and each call's TTFT and latency are set beside the
server's. Printed per run: twin / real of the TTFT and latency p50 and p95, then by how many other calls
were in flight on the server when the call was sent, the medians of both: where the server model's
error grows with load, this shows it.

    .venv/bin/python benchmarks/twin_open_loop.py results/twin-accuracy/DATE --profile CAL.yaml
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np
import simpy

from simulator.metrics.records import CallRecord
from simulator.metrics.results import read_calls, read_json
from simulator.scenario import load, load_workload
from simulator.sim.make_twin import make_twin
from simulator.sim.profile import load_profile
from simulator.sim.twin import Completion
from simulator.workload import Call

IN_FLIGHT_BINS = ((0, 1), (1, 3), (3, 6), (6, 10), (10, 10**9))
"""Bins of calls in flight on the server when a call was sent (others than itself)."""


def workload_calls(folder: Path) -> dict[tuple[str, int], Call]:
    """Every call of the workload a result folder's run played (its scenario file at its seed), sub-agents'
    too, by (task id, call index)."""
    run = read_json(folder, "run.json")
    if run is None or not run.get("scenario_file"):
        raise SystemExit(f"{folder}: no run.json naming the scenario file")
    seed = run["settings"]["run"]["seed"]
    calls = {}
    for task in load_workload(load(run["scenario_file"], [f"run.seed={seed}"])).tasks:
        for sub in task.walk():
            for index, call in enumerate(sub.calls):
                calls[(sub.id, index)] = call
    return calls


def replay(records: list[CallRecord], calls: dict[tuple[str, int], Call], profile) -> list[Completion]:
    """The twin's completion of each record's call, sent at the record's actual send time."""
    env = simpy.Environment()
    twin = make_twin(env, profile)
    done: list = [None] * len(records)

    def send(i: int, record: CallRecord):
        yield env.timeout(record.actual_send)
        done[i] = yield twin.submit_call(calls[(record.task_id, record.call_index)])

    for i, record in enumerate(records):
        env.process(send(i, record))
    env.run()
    return done


def in_flight(records: list[CallRecord]) -> np.ndarray:
    """For each record, the other calls in flight on the server when it was sent."""
    sends = np.array([r.actual_send for r in records])
    ends = np.array([r.end for r in records])
    return np.array([int(np.sum((sends < s) & (ends > s))) for s in sends])


def compare(folder: Path, profile) -> None:
    records = [r for r in read_calls(folder) if r.ok and r.ttft is not None]
    twin = replay(records, workload_calls(folder), profile)
    real_ttft = np.array([r.ttft for r in records])
    twin_ttft = np.array([c.ttft for c in twin])
    real_latency = np.array([r.end - r.actual_send for r in records])
    twin_latency = np.array([c.end - c.submitted for c in twin])
    ratios = [np.percentile(t, q) / np.percentile(r, q)
              for t, r in ((twin_ttft, real_ttft), (twin_latency, real_latency)) for q in (50, 95)]
    print(f"{folder.name:26s} {len(records):5d} calls   twin / real: TTFT p50 {ratios[0]:.2f}  p95 {ratios[1]:.2f}"
          f"   latency p50 {ratios[2]:.2f}  p95 {ratios[3]:.2f}")
    load_now = in_flight(records)
    for low, high in IN_FLIGHT_BINS:
        chosen = (load_now >= low) & (load_now < high)
        if chosen.sum() < 5:
            continue
        label = f"{low}+" if high > 10**6 else f"{low}-{high - 1}"
        print(f"    {label:>5s} in flight: {chosen.sum():4d} calls   median TTFT real {np.median(real_ttft[chosen]) * 1e3:6.1f} ms"
              f" twin {np.median(twin_ttft[chosen]) * 1e3:6.1f}   latency real {np.median(real_latency[chosen]) * 1e3:7.1f}"
              f" twin {np.median(twin_latency[chosen]) * 1e3:7.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, help="a twin_accuracy results folder")
    parser.add_argument("--profile", required=True, help="the profile to simulate on (the run's calibrated one)")
    args = parser.parse_args()
    profile = load_profile(args.profile)
    runs = sorted(p for p in args.results.iterdir() if p.is_dir() and re.fullmatch(r".+-real-\d+", p.name))
    if not runs:
        raise SystemExit(f"{args.results}: no <scenario>-real-<n> folders")
    for folder in runs:
        compare(folder, profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
