"""A live fleet of two real vLLM CPU replicas (the tiny model) behind a launched sglang-router: one short
Claude Code replay (scenarios/vllm/claude-code.yaml, cut), and each replica's own counters reconciled
with the client's records of the calls it answered (the replica named in every response by the
middleware agentload gives a vLLM replica)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from simulator import scenario as sc
from simulator.fleet.launch import INSTALL_HINT, router_installed
from simulator.metrics import results
from simulator.pipeline.execute import execute_async
from simulator.pipeline.fleet_live import FleetLiveExecutor
from simulator.pipeline.plan import plan_run

pytestmark = pytest.mark.vllm

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios" / "vllm"


def test_two_vllm_replicas_behind_sglang_router_reconcile_with_the_client(vllm_venv, tiny_model, tmp_path):
    if not router_installed():  # the `fleet` extra, which CI installs
        (pytest.fail if os.environ.get("CI") else pytest.skip)(f"sglang-router is not installed: {INSTALL_HINT}")
    model_dir, _ = tiny_model
    scenario = sc.load(SCENARIOS / "claude-code.yaml", [
        "target.base_url=null", "target.api=chat",  # the router: no base URL of its own, no token-id prompts
        "run.max_tasks=3", "run.seed=7", "run.scrape_interval=0.5", "workload.stagger=0.25",
        "workload.transforms.token_scale=0.02",
        f"fleet={{replicas: 2, vllm: {{model: {model_dir}, python: {vllm_venv / 'bin' / 'python'}}}, "
        "router: {policy: round_robin}}",
    ])
    workload = sc.load_workload(scenario)
    folder = tmp_path / "fleet"
    with asyncio.Runner() as runner:
        summary, result = runner.run(execute_async(plan_run(scenario, workload, folder),
                                                   FleetLiveExecutor(handle_sigint=False)))
    assert result.stop_reason == "completed"
    calls = results.read_calls(folder)
    _, planned, _ = workload.counts()
    assert len(calls) == planned == summary.calls.ok and all(c.ok for c in calls)
    fleet = summary.fleet
    assert fleet is not None and fleet.died == [] and fleet.accounted is True
    assert fleet.served == fleet.client_calls == len(calls)
    assert sum(r.prompt_tokens or 0 for r in fleet.replicas) == sum(c.input_tokens for c in calls)
    for replica in fleet.replicas:
        mine = [c for c in calls if c.replica == replica.name]
        assert mine, f"round robin sent {replica.name} nothing"
        assert replica.served == replica.client_calls == len(mine)
        assert replica.prompt_tokens == sum(c.input_tokens for c in mine)
        assert replica.generation_tokens == sum(c.output_tokens for c in mine)
    assert {c.replica for c in calls} == {"r0", "r1"}
    print(f"vLLM fleet: {[(r.name, r.served, r.prompt_tokens) for r in fleet.replicas]}, "
          f"prefix-hit share {fleet.prefix_hit_share:.3f}")
