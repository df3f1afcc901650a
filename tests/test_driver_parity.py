"""Live and simulated runs of one scenario are the same experiment on two clocks: with `max_in_flight`
the tasks take their turns in the same order and queue for the same time, live against the emulator
running the twin and in `simulate`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from simulator import scenario as sc
from simulator.pipeline.live import run_scenario
from simulator.metrics import results
from simulator.sim.profile import load_profile
from simulator.pipeline.twin import simulate_to_folder
from simulator.task_run import driver_settings
from simulator.workload import Call, Task, Workload

BLOCK = 16
# Engine steps of >= 20 ms, so the event loop's jitter on a busy machine is small beside them.
PROFILE = {
    "name": "parity-twin",
    "scheduler": {"max_num_seqs": 8, "max_num_batched_tokens": 512, "max_model_len": 2048},
    "kv_cache": {"block_size": BLOCK, "num_blocks": 4000},
    "step_time": {"fixed": 0.02, "per_token": 0.0001, "per_decode_seq": 0.001},
}
TASKS = 5


def workload() -> Workload:
    """Five three-turn tasks arriving 50 ms apart, each prompt extending the last."""
    tasks = []
    for i in range(TASKS):
        own = tuple(1000 * (i + 1) + b for b in range(12))
        calls = tuple(Call(input_tokens=4 * (turn + 1) * BLOCK + 3, output_tokens=8, gap=0.05 if turn else 0.0,
                           hash_ids=own[: 4 * (turn + 1)], block_size=BLOCK) for turn in range(3))
        tasks.append(Task(f"t{i}", calls, arrival=0.05 * i))
    return Workload(tuple(tasks))


def first_calls(folder: Path) -> dict:
    calls = [c for c in results.read_calls(folder) if c.call_index == 0]
    assert len(calls) == TASKS and all(c.ok for c in calls)
    return {c.task_id: c for c in calls}


def most_at_once(folder: Path) -> int:
    first = first_calls(folder)
    tasks = results.read_tasks(folder)
    edges = sorted([(first[t.task_id].actual_send, 1) for t in tasks] + [(t.end, -1) for t in tasks])
    level = peak = 0
    for _, step in edges:
        level += step
        peak = max(peak, level)
    return peak


def test_max_in_flight_queues_the_same_live_and_simulated(tmp_path):
    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump(PROFILE))
    scenario = sc.parse(f"workload: {{trace: unused.jsonl}}\nemulator: {{profile: {profile.name}}}\n"
                        "run: {max_in_flight: 2}\n", str(tmp_path / "scenario.yaml"))
    assert scenario.run.max_in_flight == 2
    live_summary, live_end = asyncio.run(run_scenario(scenario, workload(), tmp_path / "live", handle_sigint=False))
    sim_summary, sim_end = simulate_to_folder(workload(), load_profile(profile), tmp_path / "sim",
                                              **driver_settings(scenario.run))
    assert live_end.stop_reason == sim_end.stop_reason == "completed"
    live, sim = first_calls(tmp_path / "live"), first_calls(tmp_path / "sim")
    # the same order of turns: tasks start in arrival order, two at a time
    order = sorted(sim, key=lambda t: sim[t].actual_send)
    assert order == sorted(live, key=lambda t: live[t].actual_send) == [f"t{i}" for i in range(TASKS)]
    assert most_at_once(tmp_path / "live") == most_at_once(tmp_path / "sim") == 2
    # the same queueing: the wait for a place shows as the first call's client lag, on both clocks
    for task_id, s in sim.items():
        if task_id in ("t0", "t1"):
            assert s.client_lag == 0.0 and live[task_id].client_lag < 0.25  # no wait for a place (< half of one)
        else:
            assert s.client_lag > 0.2
            assert live[task_id].client_lag == pytest.approx(s.client_lag, abs=0.12, rel=0.1), task_id
    assert live_summary.client_lag_ms.max == pytest.approx(sim_summary.client_lag_ms.max, rel=0.15)
