"""The run-length estimate of `agentload run`'s banner (`simulator.live.run_length.run_length`): arrivals,
tool and think time and each call's time on the target as its timing model says when nothing else runs
(never a trace's recorded server time, which a scenario's transforms leave as it was), sub-agents
alongside their parent, `max_in_flight` holding arrivals back."""

from __future__ import annotations

import pytest

from simulator import scenario as sc
from simulator.emulator.call_time import BatchCallTime, FixedCallTime, TwinCallTime, unloaded_call_time
from simulator.emulator.settings import EmulatorSettings
from simulator.live.run_length import run_length
from simulator.scenario import RunSpec
from simulator.sim.driver import simulate
from simulator.sim.profile import load_profile
from simulator.transforms import token_scale
from simulator.workload import Call, SubTask, Task, Workload


def test_a_recorded_server_time_is_not_the_server_time_of_a_scaled_replay():
    # recorded: 100k-token prompts that took 40 s each; the scenario scales them to 4k tokens
    recorded = Workload((Task("t", (Call(100_000, 1000, server_time=40.0),
                                    Call(101_000, 1000, gap=5.0, server_time=40.0))),))
    scaled = token_scale(recorded, 0.04)
    assert scaled.tasks[0].calls[0].server_time == 40.0  # the transform leaves the recorded time
    # a real target: its speed is not known, so no server time at all
    assert run_length(scaled, RunSpec()).estimate == pytest.approx(5.0)
    # the emulator at 50 ms to the first token, then 10 ms a token: 40 tokens a call
    fixed = FixedCallTime(0.05, 0.01, 131072)
    length = run_length(scaled, RunSpec(), fixed)
    assert length.estimate == pytest.approx(5.0 + 2 * (0.05 + 0.01 * 39)) and length.server_time


def test_batched_timing_prefills_only_what_the_prefix_cache_lacks():
    # the second call repeats the first's 4 blocks of 16 tokens and adds 36 tokens
    calls = (Call(64, 10, hash_ids=(1, 2, 3, 4), block_size=16),
             Call(100, 5, gap=1.0, hash_ids=(1, 2, 3, 4, 5, 6), block_size=16))
    batched = BatchCallTime(prefill_per_token=0.001, decode_per_seq=0.0001, decode_base=0.008, max_model_len=4096)
    first, second = batched(calls[0]), batched(calls[1])
    assert first == pytest.approx(0.001 * 64 + 10 * 0.0081)
    assert second == pytest.approx(0.001 * 36 + 5 * 0.0081)
    # a call beyond the context is refused at once
    assert batched(Call(4000, 200)) == 0.0


def test_sub_agents_spawned_together_run_alongside_and_detached_ones_from_their_spawn_point():
    def sub(seconds: float, wait: bool, after: int) -> SubTask:
        return SubTask(after, Task("s", (Call(10, 1, gap=seconds),)), wait=wait)

    waited = Task("w", (Call(10, 1, gap=1.0), Call(10, 1, gap=1.0)),
                  subtasks=(sub(10.0, True, 0), sub(10.0, True, 0)))
    # two waited sub-agents of 10 s forked at once hold the next call back 10 s, not 20
    assert run_length(Workload((waited,)), RunSpec()).estimate == pytest.approx(12.0)
    detached = Task("d", (Call(10, 1, gap=5.0), Call(10, 1, gap=1.0)), subtasks=(sub(10.0, False, 0),))
    # a detached sub-agent starts after the call it follows (5 s) and outlives its parent (6 s)
    assert run_length(Workload((detached,)), RunSpec()).estimate == pytest.approx(15.0)


def test_max_in_flight_holds_later_arrivals_back():
    tasks = tuple(Task(f"t{i}", (Call(10, 1, gap=10.0),), arrival=float(i)) for i in range(3))
    assert run_length(Workload(tasks), RunSpec()).estimate == pytest.approx(12.0)
    assert run_length(Workload(tasks), RunSpec(max_in_flight=1)).estimate == pytest.approx(30.0)
    assert run_length(Workload(tasks), RunSpec(max_in_flight=1, drain=5.0)).estimate == pytest.approx(7.0)


def test_a_lone_task_on_a_profile_takes_what_the_twin_simulates():
    # nothing else runs: the estimate is the twin's own run of the task, idling through its gaps
    task = Task("t", (Call(1500, 40, hash_ids=tuple(range(11)), block_size=128),
                      Call(2100, 30, gap=0.4, hash_ids=tuple(range(16)), block_size=128),
                      Call(2600, 20, gap=2.0, hash_ids=tuple(range(20)), block_size=128)))
    profile = load_profile("tiny-vllm-cpu")
    sink, _ = simulate(Workload((task,)), profile)
    (simulated,) = sink.tasks
    estimate = run_length(Workload((task,)), RunSpec(), TwinCallTime(profile)).estimate
    assert estimate == pytest.approx(simulated.end, rel=1e-9)
    assert estimate > 2.4 + 0.1  # the server's time counts


def test_the_emulator_settings_choose_the_call_time():
    assert isinstance(unloaded_call_time(EmulatorSettings()), BatchCallTime)
    assert isinstance(unloaded_call_time(EmulatorSettings(ttft=0.0, itl=0.0)), FixedCallTime)
    assert isinstance(unloaded_call_time(EmulatorSettings(profile="tiny-vllm-cpu")), TwinCallTime)
    # the default emulator is no zero-latency server: a call of 2,000 prompt tokens and 100 output
    # tokens takes 0.1 s of prefill and 100 steps of 8.1 ms
    assert unloaded_call_time(EmulatorSettings())(Call(2000, 100)) == pytest.approx(0.1 + 0.81)
    assert unloaded_call_time(EmulatorSettings(ttft=0.0, itl=0.0))(Call(2000, 100)) == 0.0


def test_the_quickstart_estimate_counts_its_scaled_calls_not_their_recorded_times():
    scenario = sc.load("scenarios/quickstart.yaml")
    workload = sc.load_workload(scenario)
    recorded = sum(c.server_time or 0.0 for t in workload.tasks for s in t.walk() for c in s.calls)
    assert recorded > 60  # the trace's times for ~100k-token prompts, left as they were by token_scale
    without_server = run_length(workload, scenario.run).estimate
    length = run_length(workload, scenario.run, unloaded_call_time(EmulatorSettings(profile="tiny-vllm-cpu")))
    # ~75 s, as the run takes (benchmarks/run_length.py); the calls add a few seconds, not minutes
    assert without_server < length.estimate < without_server + 15
