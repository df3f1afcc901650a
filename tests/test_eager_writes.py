"""The 3.11 shim that writes aiohttp's request bodies in the sending task (simulator/live/eager_writes.py)."""

from __future__ import annotations

import asyncio
import time

import pytest

from simulator.emulator.server import run_emulator
from simulator.live import eager_writes
from simulator.live.client import Client, Target
from simulator.behaviour import CallRequest
from simulator.workload import Call


class ClientRequest:
    """Stands in for aiohttp's class: the factory picks its writer by qualified name."""

    def __init__(self, log: list[str], wait: "asyncio.Future[str] | None" = None) -> None:
        self.log = log
        self.wait = wait

    async def write_bytes(self) -> str:
        self.log.append("written")
        if self.wait is not None:
            self.log.append(await self.wait)
        return "done"


async def _other(log: list[str]) -> None:
    log.append("other ran")


def _uvloop():
    uvloop = pytest.importorskip("uvloop")
    return uvloop.new_event_loop()


@pytest.fixture(params=["asyncio", "uvloop"])
def shimmed(request):
    loop = _uvloop() if request.param == "uvloop" else asyncio.new_event_loop()
    loop.set_task_factory(eager_writes._factory(None))
    yield loop
    loop.close()


def test_writer_runs_before_create_task_returns(shimmed):
    log: list[str] = []

    async def main():
        task = asyncio.create_task(ClientRequest(log).write_bytes())
        assert log == ["written"]  # no await happened between: the body went out in this step
        assert task.done() and task.result() == "done"

    shimmed.run_until_complete(main())


def test_writer_that_waits_finishes_under_a_task(shimmed):
    log: list[str] = []

    async def main():
        gate = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(ClientRequest(log, gate).write_bytes())
        assert log == ["written"] and not task.done()
        gate.set_result("drained")
        assert await task == "done"
        assert log == ["written", "drained"]

    shimmed.run_until_complete(main())


def test_cancelling_a_waiting_writer_reaches_the_coroutine(shimmed):
    log: list[str] = []

    async def main():
        gate = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(ClientRequest(log, gate).write_bytes())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert gate.cancelled()  # the cancellation went into the awaited future, as under a plain Task

    shimmed.run_until_complete(main())


def test_other_coroutines_are_not_started_early(shimmed):
    log: list[str] = []

    async def main():
        task = asyncio.create_task(_other(log))
        assert log == []
        await task
        assert log == ["other ran"]

    shimmed.run_until_complete(main())


async def test_client_installs_the_shim_only_while_open_and_sends_at_once():
    loop = asyncio.get_running_loop()
    before = loop.get_task_factory()
    async with run_emulator(ttft=0.0, itl=0.0) as url:
        async with Client(Target(url), loop.time()) as client:
            installed = loop.get_task_factory()
            assert (installed is not None) == eager_writes.NEEDED
            record, _ = await client.send(CallRequest("t", "c", 0, Call(input_tokens=32, output_tokens=4)), 0.0)
            assert record.ok and record.output_tokens == 4
        assert loop.get_task_factory() is before


async def test_the_body_goes_out_before_callbacks_already_queued():
    # A loop turn kept busy by a callback queued before the send: the request must not wait behind it.
    async with run_emulator(ttft=0.0, itl=0.0) as url:
        async with Client(Target(url), time.perf_counter()) as client:
            await client.send(CallRequest("warm", "c", 0, Call(input_tokens=32, output_tokens=1)), 0.0)
            queued_ran: list[float] = []  # when the callback queued before the send ran (since t0)
            asyncio.get_running_loop().call_soon(lambda: queued_ran.append(time.perf_counter() - client.t0))
            record, _ = await client.send(CallRequest("t", "c", 0, Call(input_tokens=32, output_tokens=2)), 0.0)
    assert record.ok and queued_ran
    assert record.actual_send < queued_ran[0]  # stamped just before the body's write: it went out first
