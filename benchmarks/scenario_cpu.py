"""Simulate one scenario on the twin as `agentload simulate` does (every inter-token gap kept, records and
histograms written) and print, as one JSON line, the process CPU seconds of the twin's run (`replay`:
workload loading and the summary left out), the whole process's CPU seconds and the simulated seconds.
Run by benchmarks/twin_speed.py with each side's code on PYTHONPATH.

    .venv/bin/python benchmarks/scenario_cpu.py SCENARIO PROFILE RESULT_DIR
"""

from __future__ import annotations

import json
import sys
import time

from simulator import scenario as scenario_mod
from simulator.pipeline.execute import Recorder
from simulator.pipeline.plan import plan_run
from simulator.pipeline.twin import TwinExecutor
from simulator.sim.profile import load_profile


def main() -> None:
    path, profile_name, folder = sys.argv[1:4]
    profile = load_profile(profile_name)
    scenario = scenario_mod.load(path, [])
    plan = plan_run(scenario, scenario_mod.load_workload(scenario), folder)
    recorder = Recorder(plan)
    start = time.process_time()
    outcome = TwinExecutor(profile, keep_gaps=True, band_draws=0).replay(plan, recorder)
    replay_cpu = time.process_time() - start
    recorder.finish(outcome)
    print(json.dumps({"replay_cpu_s": replay_cpu, "process_cpu_s": time.process_time(),
                      "simulated_s": outcome.simulation.simulated_seconds}))


if __name__ == "__main__":
    main()
