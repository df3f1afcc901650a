"""The fleet on the twin (`simulator.fleet.twin`, `simulator.fleet.replica`,
`simulator.pipeline.fleet_twin`): replicas behind a router policy in one simulated run."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from simulator.cli import main
from simulator.errors import InputError
from simulator.scenario.fleet import FleetSpec
from simulator.fleet.twin import FleetTwin
from simulator.metrics.folder import planned_counts
from simulator.metrics.results import Window
from simulator.pipeline.execute import execute
from simulator.pipeline.fleet_twin import FleetTwinExecutor
from simulator.pipeline.plan import RunPlan
from simulator.sim.driver import ListSink, SimDriver
from simulator.sim.profile import load_profile
from simulator.workload import Call, SubTask, Task, Workload

REPO = Path(__file__).resolve().parents[1]
TB = 64


def sessions(count: int, *, rate: float, seed: int = 0, system: int = 512, cap: int = 3500,
             sub_agents: bool = False, output: tuple[int, int] = (4, 40)) -> Workload:
    """Multi-turn agent sessions: a system prompt all share, then each its own growing history (hash
    ids), `output` tokens a call (low, high), tool gaps of a fraction of a second; some with a
    sub-agent over its parent's prefix."""
    rng = np.random.default_rng(seed)
    shared = tuple(range(1, 1 + system // TB))
    tasks = []
    t = 0.0
    next_id = 10**6
    for i in range(count):
        t += float(rng.exponential(1 / rate))
        turns = int(rng.integers(3, 9))
        prompts = np.minimum(system + np.cumsum(rng.integers(64, 400, turns)), cap).tolist()
        own = tuple(range(next_id, next_id + prompts[-1] // TB))
        next_id += len(own)
        ids = shared + own
        calls = tuple(Call(p, int(rng.integers(*output)), gap=0.0 if k == 0 else float(rng.exponential(0.3)),
                           hash_ids=ids[:p // TB], block_size=TB) for k, p in enumerate(prompts))
        subtasks = ()
        if sub_agents and i % 3 == 0:
            child = Task(f"s{i}-sub", tuple(Call(prompts[0] + 100 * k, 8, gap=0.05, hash_ids=ids[:prompts[0] // TB],
                                                 block_size=TB) for k in range(2)), arrival=0.0)
            subtasks = (SubTask(after_call=0, task=child, wait=True),)
        tasks.append(Task(f"s{i}", calls, arrival=t, subtasks=subtasks))
    return Workload(tasks)


def simulate(workload: Workload, profile, fleet=None, *, fast_decode: bool = True, seed: int = 0):
    """(the records, how the run ended, the KV blocks evicted)."""
    sink = ListSink()
    server = None if fleet is None else (
        lambda env: FleetTwin(env, fleet, profile, keep_gaps=True, fast_decode=fast_decode, seed=seed))
    driver = SimDriver(workload, profile, sink, keep_gaps=True, fast_decode=fast_decode, server=server)
    result = driver.run()
    result.evicted = driver.twin.kv_evictions if fleet is not None else driver.twin.kv.evictions
    return sink, result


def hit_share(sink: ListSink) -> float:
    return sum(c.cached_tokens or 0 for c in sink.calls) / sum(c.input_tokens for c in sink.calls)


@pytest.mark.parametrize("preset", ["tiny-vllm-cpu", "gb300-nemotron-super-default"])
def test_a_fleet_of_one_replica_gives_the_single_twins_records(preset):
    profile = load_profile(preset)
    workload = sessions(25, rate=2.0, sub_agents=True)
    alone, _ = simulate(workload, profile)
    fleet, result = simulate(workload, profile, FleetSpec(replicas=1, router={"policy": "cache_aware"}))
    assert {c.replica for c in fleet.calls} == {"r0"}
    assert [dataclasses.replace(c, replica=None) for c in fleet.calls] == alone.calls
    assert fleet.gaps == alone.gaps and fleet.tasks == alone.tasks
    assert result.twin.fast_chunks > 0


@pytest.mark.parametrize("preset,overrides,output", [
    ("tiny-vllm-cpu", {}, (4, 40)),  # API-server terms: intake, per-token delivery, contention
    ("tiny-vllm-cpu", {"kv_cache": {"num_blocks": 64}}, (50, 300)),  # evictions and preemptions
    ("gb300-nemotron-super-mtp3", {}, (4, 40)),  # a hybrid model with speculative decoding
    ("tiny-vllm-cpu", {"step_time": {"request_overhead": 0.05, "frontend_per_request": 0.0, "frontend_contention": 0.0,
                                     "frontend_per_prompt_token": 0.0, "frontend_per_output_token": 0.0}},
     (50, 300)),  # requests reaching the waiting queue well after they were sent
])
def test_replicas_planning_decode_runs_ahead_keep_the_records_of_stepping_one_by_one(preset, overrides, output):
    profile = load_profile(preset, overrides)
    workload = sessions(40, rate=4.0, seed=2, sub_agents=True, output=output)
    for policy in ("round_robin", "prefix_score"):  # prefix_score reads the caches during runs planned ahead
        fleet = FleetSpec(replicas=3, router={"policy": policy})
        ahead, fast = simulate(workload, profile, fleet)
        stepped, slow = simulate(workload, profile, fleet, fast_decode=False)
        assert fast.twin.fast_chunks > 0 and slow.twin.fast_chunks == 0
        assert ahead.calls == stepped.calls and ahead.gaps == stepped.gaps and ahead.tasks == stepped.tasks
        assert fast.twin.steps == slow.twin.steps and fast.evicted == slow.evicted
        if "kv_cache" in overrides:
            assert fast.evicted > 0 and fast.twin.preemptions > 0


def test_session_affinity_hits_the_prefix_cache_more_than_round_robin():
    profile = load_profile("tiny-vllm-cpu")
    workload = sessions(40, rate=3.0, seed=4)
    sticky, _ = simulate(workload, profile, FleetSpec(replicas=4, router={"policy": "manual"}))
    spread, _ = simulate(workload, profile, FleetSpec(replicas=4, router={"policy": "round_robin"}))
    for sink in (sticky, spread):
        assert {c.replica for c in sink.calls} == {"r0", "r1", "r2", "r3"}
    by_task: dict[str, set] = {}
    for c in sticky.calls:
        by_task.setdefault(c.task_id, set()).add(c.replica)
    assert all(len(replicas) == 1 for replicas in by_task.values())
    assert hit_share(sticky) > hit_share(spread) + 0.15  # 0.78 against 0.58


def test_disaggregated_ttft_is_prefill_then_kv_transfer_then_the_first_decode_step():
    profile = load_profile("tiny-vllm-cpu")
    # calls far apart: each alone in the fleet
    calls = (Call(2000, 16, hash_ids=tuple(range(1, 32)), block_size=TB),
             Call(3000, 16, gap=5.0, hash_ids=tuple(range(1, 47)), block_size=TB))
    workload = Workload([Task("t", calls, arrival=0.0)])
    bytes_per_token = 1e6

    def run(gbps: float) -> ListSink:
        pd = {"prefill": 1, "decode": 2, "kv_bytes_per_token": bytes_per_token, "link_gbps": gbps}
        return simulate(workload, profile, FleetSpec(disaggregation=pd, router={"policy": "round_robin"}))[0]

    slow, fast = run(10.0), run(1000.0)
    for a, b in zip(slow.calls, fast.calls):
        transfer = lambda gbps: bytes_per_token * a.input_tokens * 8 / (gbps * 1e9)  # noqa: E731
        assert a.ttft - b.ttft == pytest.approx(transfer(10.0) - transfer(1000.0), rel=1e-9)
        assert a.ttft > transfer(10.0)
        assert a.replica in ("r1", "r2") and a.output_tokens == 16
    # the second call's prefix was computed on the prefill replica by the first: the record says so
    assert slow.calls[0].cached_tokens == 0 and slow.calls[1].cached_tokens > 0
    alone, _ = simulate(workload, profile)
    assert all(a.ttft > b.ttft for a, b in zip(slow.calls, alone.calls))
    pd = FleetSpec(disaggregation={"prefill": 1, "decode": 1, "kv_bytes_per_token": 1, "link_gbps": 1})
    with pytest.raises(InputError, match="hybrid"):  # not modelled: a clear error naming the section
        simulate(workload, load_profile("gb300-nemotron-super-default"), pd)


def test_a_fleets_summary_accounts_for_every_call_per_replica(tmp_path):
    profile = load_profile("tiny-vllm-cpu")
    workload = sessions(30, rate=3.0, seed=6, sub_agents=True)
    fleet = FleetSpec(replicas=3, router={"policy": "cache_aware"})
    plan = RunPlan(workload=workload, folder=tmp_path / "run", planned=planned_counts(workload, Window(), None),
                   scrape_interval=0.5)
    summary, _ = execute(plan, FleetTwinExecutor(fleet, profile))
    section = summary.fleet
    assert section is not None and section.policy == "cache_aware"
    records = [json.loads(line) for line in (tmp_path / "run" / "calls.jsonl").read_text().splitlines()]
    assert section.client_calls == len(records) == sum(r.client_calls for r in section.replicas)
    assert section.accounted is True and section.served == len(records)
    assert [r.served for r in section.replicas] == [r.client_calls for r in section.replicas]
    assert section.prefix_hit_share is not None and 0 < section.prefix_hit_share < 1
    for name in ("r0", "r1", "r2"):
        assert (tmp_path / "run" / "fleet" / f"{name}_metrics.jsonl").stat().st_size > 0
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["fleet"]["router"]["policy"] == "cache_aware" and len(run["fleet"]["replicas"]) == 3


def test_a_disaggregated_fleets_summary_counts_the_decode_pool_as_serving(tmp_path):
    profile = load_profile("tiny-vllm-cpu")
    workload = sessions(12, rate=2.0, seed=8)
    fleet = FleetSpec(disaggregation={"prefill": 2, "decode": 1, "kv_bytes_per_token": 5e4, "link_gbps": 50},
                      router={"policy": "round_robin"})
    plan = RunPlan(workload=workload, folder=tmp_path / "pd", planned=planned_counts(workload, Window(), None),
                   scrape_interval=0.5)
    summary, _ = execute(plan, FleetTwinExecutor(fleet, profile))
    section = summary.fleet
    assert section is not None and [r.name for r in section.replicas] == ["r0", "r1", "r2"]
    assert section.accounted is True
    assert section.served == section.client_calls == sum(len(t.calls) for t in workload.tasks)
    assert section.replicas[0].note and section.replicas[2].note is None
    assert section.replicas[0].served + section.replicas[1].served == section.served  # one prefill a call
    assert {r.client_calls for r in section.replicas[:2]} == {0}


def test_simulate_runs_a_fleet_scenario_on_its_replicas_profile(tmp_path, capsys):
    out = tmp_path / "fleet"
    code = main(["simulate", str(REPO / "scenarios" / "fleet" / "claude-code.yaml"), "-o", str(out),
                 "--set", "fleet.router.policy=manual", "--set", "run.max_tasks=6"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["fleet"]["policy"] == "manual" and summary["fleet"]["accounted"] is True
    assert summary["simulation"]["profile"] == "fleet-replica"
    assert "3 replicas of profile fleet-replica behind the manual router model" in " ".join(capsys.readouterr().err.split())
    code = main(["simulate", str(REPO / "scenarios" / "quickstart.yaml"), "-o", str(tmp_path / "no-profile")])
    assert code == 2
    assert "give -p PROFILE" in " ".join(capsys.readouterr().err.split())
