"""What sampling the twin's /metrics costs a simulation (not run as a test; prints its figures).

Simulates a scenario on a profile as `agentload simulate` does, with the twin sampled every
`run.scrape_interval` seconds into server_metrics.jsonl and without (scrape_interval None), alternating
the two `--repeats` times on the same generated workload, and prints each one's wall and CPU time (the
CPU time is what a busy shared machine does not inflate), their medians and the samples written. The
records of the two are checked to be the same.

    .venv/bin/python benchmarks/sim_scrape_cost.py [--scenario scenarios/gb300-agents.yaml]
        [--profile gb300-nemotron-super-default] [--repeats 3] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import filecmp
import statistics
import tempfile
import time
from pathlib import Path

from simulator import scenario as scenario_mod
from simulator.pipeline.plan import measurement_window
from simulator.metrics import server
from simulator.sim.profile import load_profile
from simulator.pipeline.twin import simulate_to_folder
from simulator.task_run import driver_settings

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default=str(ROOT / "scenarios" / "gb300-agents.yaml"))
    parser.add_argument("--profile", default="gb300-nemotron-super-default")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()

    scenario = scenario_mod.load(args.scenario, args.overrides)
    workload = scenario_mod.load_workload(scenario)
    profile = load_profile(args.profile)
    window = measurement_window(scenario, workload)
    interval = scenario.run.scrape_interval
    walls: dict[str, list[float]] = {"off": [], "on": []}
    cpus: dict[str, list[float]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for mode in ("off", "on"):
                folder = Path(tmp) / f"{mode}-{repeat}"
                start, cpu = time.perf_counter(), time.process_time()
                summary, _ = simulate_to_folder(
                    workload, profile, folder, window=window, slo=scenario.slo,
                    scrape_interval=interval if mode == "on" else None, **driver_settings(scenario.run))
                walls[mode].append(time.perf_counter() - start)
                cpus[mode].append(time.process_time() - cpu)
                print(f"  samples {mode:3s} #{repeat + 1}: {walls[mode][-1]:.2f} s wall, {cpus[mode][-1]:.2f} s CPU",
                      flush=True)
        same = filecmp.cmp(Path(tmp) / "off-0" / "calls.jsonl", Path(tmp) / "on-0" / "calls.jsonl", shallow=False)
        samples = len(server.read_samples(Path(tmp) / "on-0"))
    simulated = summary.simulation.simulated_seconds if summary.simulation else float("nan")
    print(f"{scenario.display_name()} on {profile.name}: {simulated:,.0f} simulated s, {samples:,} samples "
          f"every {interval:g} s; records {'identical' if same else 'DIFFER'} with and without")
    for name, times in (("wall", walls), ("CPU", cpus)):
        off, on = statistics.median(times["off"]), statistics.median(times["on"])
        print(f"median {name}: {off:.2f} s without samples, {on:.2f} s with ({(on - off) / off:+.1%})")


if __name__ == "__main__":
    main()
