"""Sharded runs on a real local Ray cluster (two CPUs, started once for the module), against the
built-in emulator: the same seeded workload on two shards and in one process gives the same accounting
and the same records, with percentiles within noise; a shard killed mid-run is reported and its tasks
are accounted for; parts are copied over Ray when a shard does not see the result folder; SIGTERM to
`agentload run --ray` stops every shard and still writes the partial summary; independent points run
as Ray tasks."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from simulator import scenario as scenario_mod  # noqa: E402
from simulator.pipeline.live import run_scenario  # noqa: E402
from simulator.metrics import results  # noqa: E402
from simulator.scale import parts, plan  # noqa: E402
from simulator.scale.points import map_points  # noqa: E402
from simulator.pipeline.sharded import run_sharded  # noqa: E402
from simulator.workload import Call, SubTask, Task, Workload  # noqa: E402
from reliability_helpers import lines, wait_for  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = """
name: sharded
workload:
  synthetic: {input_tokens: 10, output_tokens: 2, concurrency: 1}
emulator: {ttft: 0.01, itl: 0.002}
run: {seed: 3}
"""


@pytest.fixture(scope="module")
def cluster():
    """One local Ray cluster for the module (two CPUs: one per shard)."""
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def seeded_workload(seed: int, tasks: int = 48, calls: tuple[int, int] = (1, 4), tokens: int = 8) -> Workload:
    """Tasks with a burst, random sizes and gaps, waited-for and detached sub-agents."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(tasks):
        arrival = 0.1 if i < 12 else float(rng.uniform(0, 0.6))
        own = tuple(Call(int(rng.integers(20, 300)), int(rng.integers(2, tokens)), gap=float(rng.uniform(0, 0.02)))
                    for _ in range(int(rng.integers(*calls))))
        subs = ()
        if i % 6 == 0:
            subs = (SubTask(0, Task(f"t{i}.a", (Call(40, 3), Call(60, 3))), wait=True),
                    SubTask(-1, Task(f"t{i}.b", (Call(30, 2),)), wait=False))
        out.append(Task(f"t{i}", own, arrival=arrival, task_class=("plan", "code")[i % 2], subtasks=subs))
    return Workload(tuple(out))


def scenario(text: str = SCENARIO):
    return scenario_mod.parse(text, "sharded.yaml")


def accounting(summary) -> dict:
    s = summary.to_dict()
    return {"calls": {k: s["calls"][k] for k in ("planned", "ok", "failed_attempts", "not_done")},
            "tasks": {k: s["tasks"][k] for k in ("planned", "completed", "failed", "not_started", "sub_tasks_finished")},
            "tokens": (s["total_input_tokens"], s["total_output_tokens"]), "completed": s["completed"]}


def call_keys(folder: Path) -> Counter:
    return Counter((c.task_id, c.call_index, c.attempt, c.ok, c.input_tokens, c.output_tokens)
                   for c in results.read_calls(folder))


async def test_two_shards_and_one_process_give_the_same_accounting(cluster, tmp_path):
    wl = seeded_workload(11)
    one, _ = await run_scenario(scenario(), wl, tmp_path / "one", handle_sigint=False)
    two, outcome = await run_sharded(scenario(), wl, tmp_path / "two", workers=2, handle_sigint=False)
    assert outcome.stop_reason == "completed" and outcome.tasks_started == len(wl.tasks)
    assert accounting(two) == accounting(one)
    assert accounting(two)["tasks"]["completed"] == 48 and accounting(two)["tasks"]["sub_tasks_finished"] == 16
    assert call_keys(tmp_path / "two") == call_keys(tmp_path / "one")  # every call once, none lost or doubled
    shards = two.to_dict()["shards"]
    assert [s["tasks"] for s in shards] == [24, 24] and not any(s["lost"] for s in shards)
    assert sum(s["calls_ok"] for s in shards) == two.to_dict()["calls"]["ok"]
    assert all(s["cpu_s"] > 0 and s["connections_warm"] > 0 for s in shards)
    for metric in ("ttft", "e2el"):  # the emulator's fixed timing, measured by both within noise
        a, b = one.to_dict()[f"p50_{metric}_ms"], two.to_dict()[f"p50_{metric}_ms"]
        assert abs(a - b) <= max(5.0, 0.5 * a), (metric, a, b)
    assert two.to_dict()["p50_ttft_ms"] >= 10.0
    # the folder is a single-process run's: its own record files, the parts merged away
    assert not (parts.part_folder(tmp_path / "two", 0) / results.CALLS_FILE).exists()
    assert json.loads((tmp_path / "two" / "progress.json").read_text()) == {"tasks_started": 48}
    assert set(one.to_dict()) <= set(two.to_dict())


HELD_GAP = 3600.0
"""A tool call longer than the test: the task waiting on it is running in its shard until the kill."""


def holding_one_task(workload: Workload, shard: int, shards: int) -> tuple[Workload, str]:
    """`workload` with the first task dealt to `shard` waiting `HELD_GAP` seconds after its first call;
    returns it and that task's id. Once that call is recorded, the task is running in that shard, however
    slow the machine."""
    held = plan.split(workload, shards)[shard].tasks[0]
    calls = (held.calls[0], dataclasses.replace(held.calls[1], gap=HELD_GAP), *held.calls[2:])
    tasks = tuple(dataclasses.replace(t, calls=calls) if t.id == held.id else t for t in workload.tasks)
    return Workload(tasks, workload.provenance), held.id


def running_in(part: Path, task_id: str) -> bool:
    """Whether a shard's part shows `task_id`'s first call answered and the shard's started tasks saved."""
    progress = results.read_json(part, results.PROGRESS_FILE) or {}
    records = parts.read_new(part / results.CALLS_FILE, 0).splitlines()
    answered = any(c["task_id"] == task_id and c["ok"] for c in map(json.loads, records))
    return answered and progress.get("tasks_started", 0) > 0


async def kill_once_running(fleet, index: int, task_id: str, timeout: float = 120.0) -> None:
    """Kill shard `index`'s actor as soon as its part shows `task_id` running (polling the files the
    shard streams to); stop the run when that never comes, so that a failure does not wait out HELD_GAP."""
    member = fleet.members[index]
    deadline = time.monotonic() + timeout
    try:
        while not running_in(Path(member.spec.part), task_id):
            assert member.running, f"shard {index} ended before {task_id} ran: {member.error}"
            assert time.monotonic() < deadline, f"shard {index} did not start {task_id}"
            await asyncio.sleep(0.02)
        ray.kill(member.actor)
    except BaseException:
        fleet.stop()
        raise


async def test_a_shard_killed_mid_run_is_reported_and_its_tasks_accounted_for(cluster, tmp_path):
    wl, held = holding_one_task(seeded_workload(12, tasks=40, calls=(8, 12), tokens=12), shard=1, shards=2)
    killer: list[asyncio.Task] = []

    def kill_when_running(fleet) -> None:
        killer.append(asyncio.ensure_future(kill_once_running(fleet, 1, held)))

    summary, outcome = await run_sharded(scenario(), wl, tmp_path / "run", workers=2, handle_sigint=False,
                                         on_fleet=kill_when_running)
    await killer[0]  # its failure, if any, is the test's
    s = summary.to_dict()
    assert outcome.stop_reason == s["stop_reason"] == "shard_lost" and s["partial"]
    assert s["ray"]["lost"] == [1]
    lost, kept = s["shards"][1], s["shards"][0]
    assert lost["lost"] and "Actor" in lost["error"] and not kept["lost"]
    assert kept["tasks_started"] == kept["tasks"] == 20
    tasks = results.read_tasks(tmp_path / "run")
    top = [t for t in tasks if t.parent_id is None]
    assert len({t.task_id for t in top}) == len(top)  # no task recorded twice
    dead = {t.id for t in plan.split(wl, 2)[1].tasks}
    lost_ids = {t.task_id for t in top if t.error_class == parts.LOST}
    assert held in lost_ids and lost_ids <= dead  # tasks that were running in the dead shard, and only those
    # what the dead shard measured before it died is kept
    assert any(c.task_id in dead and c.ok for c in results.read_calls(tmp_path / "run"))
    # each of its tasks is accounted for: the started ones have a record (done, failed or lost), the others
    # are counted as not started
    assert 0 < lost["tasks_started"] <= 20
    assert sum(1 for t in top if t.task_id in dead) == lost["tasks_started"]
    t = s["tasks"]
    assert t["not_started"] == 20 - lost["tasks_started"]
    assert t["failed"] >= len(lost_ids) and t["completed"] + t["failed"] + t["cancelled"] == t["finished_all"]


async def test_parts_are_copied_over_ray_when_a_shard_does_not_see_the_folder(cluster, tmp_path, monkeypatch):
    real_mark = parts.mark
    monkeypatch.setattr(parts, "mark", lambda folder: real_mark(folder) + "-not-here")  # shards see no folder
    wl = seeded_workload(13, tasks=12)
    summary, _ = await run_sharded(scenario(), wl, tmp_path / "run", workers=2, handle_sigint=False)
    shards = summary.to_dict()["shards"]
    assert all(s["part"] and "agentload-shards" in s["part"] for s in shards)  # written elsewhere...
    assert summary.to_dict()["tasks"]["completed"] == 12  # ...and copied here
    assert len(results.read_tasks(tmp_path / "run")) == 12 + 4


def test_sigterm_stops_every_shard_and_writes_the_partial_summary(cluster, tmp_path):
    path = tmp_path / "long.yaml"
    path.write_text("""
name: long
workload:
  synthetic: {input_tokens: 20, output_tokens: 100, concurrency: 16, calls: 160}
emulator: {ttft: 0.01, itl: 0.01}
run: {workers: 2}
""")
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "simulator", "run", str(path), "--ray", cluster, "-o", str(out),
                             "--no-progress"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        # records streaming in both parts: both shards run
        wait_for(lambda: all(lines(parts.part_folder(out, i) / results.CALLS_FILE) for i in range(2)), proc=proc)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, stderr.decode()
    s = json.loads((out / results.SUMMARY_FILE).read_text())
    assert s["partial"] and s["stop_reason"] == "interrupted"
    assert [sh["stop_reason"] for sh in s["shards"]] == ["interrupted", "interrupted"]
    assert s["calls"]["cancelled"] >= 1 and s["calls"]["ok"] < 160
    assert s["tasks"]["cancelled"] + s["tasks"]["completed"] == 16
    assert b"shards: 2" in stdout


def test_independent_points_run_as_ray_tasks(cluster):
    def square_or_fail(x: int) -> int:  # a local function: Ray's workers get it by value
        if x == 3:
            raise ValueError("three is refused")
        return x * x

    seen = []
    outcomes = map_points(square_or_fail, range(6), cpus_per_point=0.5, on_done=seen.append)
    assert [o.value for o in outcomes if o.ok] == [0, 1, 4, 16, 25]
    assert [o.index for o in outcomes] == list(range(6))
    assert "three is refused" in outcomes[3].error and not outcomes[3].ok
    assert sorted(o.index for o in seen) == list(range(6))
