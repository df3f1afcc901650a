"""The fault matrix against the emulator: HTTP 5xx, 429 with Retry-After, a reset mid-stream, a stall,
a malformed stream, and the server killed and started again mid-run. For each, the counts reconcile:
the planned tasks are done, failed, cancelled or not started; the attempts recorded are the requests
the server saw (less the preflight's); each fault the server served is one failed attempt."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from reliability_helpers import EmulatorChild, free_port, workload
from simulator import scenario as sc
from simulator.behaviour import RetryPolicy, Send, Wait
from simulator.emulator.server import Emulator
from simulator.emulator.settings import EmulatorSettings
from simulator.live.client import retry_after_seconds
from simulator.pipeline.live import run_scenario
from simulator.metrics import results
from simulator.metrics.records import CallRecord
from simulator.task_run import TaskRun
from simulator.traces.native import write
from simulator.workload import Call, Task

FAULT_CLASSES = {"http_500": "http_5xx", "http_503": "http_5xx", "http_429": "http_4xx", "reset": "reset",
                 "stall": "stall", "malformed": "malformed"}


def scenario_for(tmp_path: Path, url: str, run: str, load=None) -> sc.Scenario:
    write(load or workload(tasks=10, calls=4, out=8), tmp_path / "load.jsonl")
    return sc.parse(f"workload: {{trace: load.jsonl}}\ntarget: {{base_url: '{url}', stall_timeout: 0.5}}\n"
                    f"run: {run}\n", str(tmp_path / "scenario.yaml"))


def reconcile(folder: Path, summary, requests_seen: int) -> None:
    """The counts of a run agree with each other and with the server's."""
    info = json.loads((folder / results.RUN_FILE).read_text())
    tasks, calls = summary.tasks, summary.calls
    assert tasks.planned == tasks.completed + tasks.failed + tasks.cancelled + tasks.not_started
    assert calls.planned == calls.ok + calls.not_done
    assert calls.attempts == len(results.read_calls(folder))
    assert calls.attempts == requests_seen - info["preflight"]["tries"]


@pytest.mark.parametrize("fault", ["http_500", "http_503", "http_429", "reset", "stall", "malformed"])
async def test_each_fault_is_counted_once_and_the_counts_reconcile(tmp_path, fault):
    emulator = Emulator(EmulatorSettings(ttft=0.002, itl=0.001, faults=((fault, 0.2),), seed=11, stall_seconds=5.0,
                                         retry_after=0.05))
    async with emulator:
        scenario = scenario_for(tmp_path, emulator.url, "{retries: 2, backoff: 0.01}")
        summary, outcome = await run_scenario(scenario, sc.load_workload(scenario), tmp_path / "r", handle_sigint=False)
    assert outcome.stop_reason == "completed"
    reconcile(tmp_path / "r", summary, emulator.requests)
    info = json.loads((tmp_path / "r" / results.RUN_FILE).read_text())
    served = emulator.faults_served[fault] - (info["preflight"]["tries"] - 1)  # the preflight's were retried
    assert summary.errors == {FAULT_CLASSES[fault]: served} and served >= 3
    assert summary.calls.failed_attempts == served
    failed = [c for c in results.read_calls(tmp_path / "r") if not c.ok]
    assert all(c.error_class == FAULT_CLASSES[fault] for c in failed)
    if fault in ("http_429", "http_503"):
        assert all(c.retry_after == 0.05 for c in failed)


async def test_a_retry_waits_at_least_what_retry_after_asks(tmp_path):
    emulator = Emulator(EmulatorSettings(ttft=0.001, itl=0.001, retry_after=0.4))
    async with emulator:
        # every request rate limited: the preflight could not pass, so it is skipped
        write(workload(tasks=3, calls=2, subtasks=False), tmp_path / "load.jsonl")
        scenario = sc.parse(f"workload: {{trace: load.jsonl}}\ntarget: {{base_url: '{emulator.url}', "
                            "headers: {X-Agentload-Fault: http_429}}\nrun: {retries: 2, backoff: 0.01}\n",
                            str(tmp_path / "s.yaml"))
        summary, _ = await run_scenario(scenario, sc.load_workload(scenario), tmp_path / "r", handle_sigint=False,
                                        preflight=False)
    calls = sorted(results.read_calls(tmp_path / "r"), key=lambda c: (c.task_id, c.attempt))
    assert len(calls) == 9 == emulator.requests and summary.tasks.failed == 3
    for before, after in zip(calls, calls[1:]):
        if before.task_id != after.task_id:
            continue
        assert before.retry_after == 0.4
        # the retry is scheduled Retry-After after the failure, not the 0.01 s backoff ...
        assert after.intended_send - before.end == pytest.approx(0.4)
        # ... and the driver never sends it early
        assert after.actual_send >= after.intended_send


def test_the_shared_task_run_honours_retry_after_for_both_drivers():
    """Both drivers step the behaviour through `TaskRun`: a failed call's `retry_after` sets the wait."""
    task = Task("t", (Call(10, 2),))
    run = TaskRun(task, 0.0, RetryPolicy(retries=2, backoff=0.1))
    send = run.next_effect()
    assert isinstance(send, Send)

    def failed(attempt: int, end: float, retry_after):
        return CallRecord("t", "default", 0, attempt, 0.0, 0.0, end, False, error_class="http_4xx",
                          retry_after=retry_after)

    wait = run.next_effect(run.called(failed(0, 1.0, 3.0)))
    assert isinstance(wait, Wait) and wait.seconds == 3.0  # Retry-After above the backoff
    run.wait(wait.seconds)
    run.next_effect()
    wait = run.next_effect(run.called(failed(1, 5.0, 0.05)))
    assert wait.seconds == pytest.approx(0.2)  # the backoff (0.1 * 2) when it asks for less
    assert RetryPolicy(backoff=1.0).wait(0) == 1.0


@pytest.mark.parametrize("header,seconds", [("3", 3.0), ("0.25", 0.25), ("-5", 0.0), ("", None), ("soon", None),
                                            ("Wed, 21 Oct 2015 07:28:00 GMT", 30.0), ("nan", None)])
def test_retry_after_is_read_as_seconds_or_an_http_date(header, seconds):
    now = 1445412450.0  # 30 s before the date above
    assert retry_after_seconds(header, now=now) == seconds


async def test_a_server_killed_and_restarted_mid_run(tmp_path):
    """The emulator process is killed (SIGKILL) while every task streams, and started again on its
    port: the streams cut are resets, calls meanwhile fail to connect, retries finish the run; every
    attempt is one the server saw or one refused at connect."""
    port = free_port()
    args = ("--ttft", "0.005", "--itl", "0.01")
    first = EmulatorChild(port, *args).start()
    second = EmulatorChild(port, *args)
    load = workload(tasks=4, calls=3, out=60, gap=0.0, every=0.0, subtasks=False)
    scenario = scenario_for(tmp_path, first.url, "{retries: 8, backoff: 0.05}", load)
    seen_before_kill = {}

    async def kill_while_all_stream(driver_ready: asyncio.Event) -> None:
        await driver_ready.wait()
        while True:  # poll the server's own counter: an observable state
            stats = await asyncio.to_thread(first.stats)
            if stats["active_streams"] == 4:
                break
            await asyncio.sleep(0.01)
        # all four tasks are mid-stream and no other call is due: nothing is in transit but them
        seen_before_kill.update(stats)
        await asyncio.to_thread(first.kill)
        await asyncio.to_thread(second.start)

    ready = asyncio.Event()
    try:
        killer = asyncio.ensure_future(kill_while_all_stream(ready))
        summary, outcome = await run_scenario(scenario, sc.load_workload(scenario), tmp_path / "r", handle_sigint=False,
                                              on_driver=lambda driver: ready.set())
        await killer
        seen_after = await asyncio.to_thread(second.stats)
    finally:
        first.stop()
        second.stop()
    calls = results.read_calls(tmp_path / "r")
    resets = [c for c in calls if c.error_class == "reset"]
    refused = [c for c in calls if c.error_class == "connect"]
    assert len(resets) == 4 and all(c.status == 200 for c in resets)  # cut mid-stream
    assert outcome.stop_reason == "completed" and summary.tasks.completed == 4
    assert summary.calls.ok == summary.calls.planned == 12
    assert summary.errors == {"reset": 4, **({"connect": len(refused)} if refused else {})}
    info = json.loads((tmp_path / "r" / results.RUN_FILE).read_text())
    requests_seen = seen_before_kill["requests"] + seen_after["requests"]
    assert summary.calls.attempts == requests_seen - info["preflight"]["tries"] + len(refused)
