"""The live executor: a plan replayed against the scenario's target (or the built-in emulator) over
HTTP, in this process (`LiveExecutor`; `run_scenario` runs a scenario with it). The command line
(`agentload run`) adds only argument parsing and the display.

When the target answers ``GET /metrics`` (vLLM), the run scrapes it every `run.scrape_interval`
seconds (`simulator.live.scrape`), appends the scrapes to server_metrics.jsonl, joins them with the task
records into server_tasks.jsonl and adds the ``server`` section to the summary. A target without
/metrics (the built-in emulator, a hosted API) only gets a note there.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncContextManager, Callable, Iterator, Optional

from ..gcpause import gc_frozen
from ..live.ahead import get_ready
from ..live.driver import Driver
from ..live.probes import MetricsProbe
from ..live.scrape import open_probe, scraping, server_summary
from ..live.stopper import RunAborted, Stopper
from ..live.target import emulator_note, make_client, open_target
from ..metrics.energy import sampled_power
from ..metrics.results import LiveCounters, ResultWriter
from ..metrics.summary import Summary
from ..redact import Redactor, mask_url
from ..scenario import Scenario
from ..task_run import DriverResult
from ..workload import Workload
from .execute import execute_async
from .plan import RunPlan, plan_run
from .record import Outcome, Recorder

TICK = 0.5


@dataclass(frozen=True)
class Progress:
    """A snapshot for the live display."""

    elapsed: float
    tasks_total: int
    tasks_started: int
    in_flight: int
    counters: LiveCounters


@dataclass
class LiveOptions:
    """What a live run (in this process or over shards) is told and tells. With `preflight`, the target
    is checked before anything is written: its model list and one tiny call (`client.PreflightError`;
    `on_preflight` gets what it found). With `handle_sigint`, SIGINT, SIGTERM and SIGHUP stop the run
    cleanly (`on_signal` is told which came); one before the arrivals start raises `RunAborted`, and no
    folder is made. `on_progress` gets a `Progress` every half second."""

    on_progress: Optional[Callable[[Progress], None]] = None
    handle_sigint: bool = True
    preflight: bool = True
    on_preflight: Optional[Callable[[dict[str, Any]], None]] = None
    on_signal: Optional[Callable[[int], None]] = None

    @contextlib.contextmanager
    def stopping(self) -> Iterator[Stopper]:
        """The run's `Stopper` for the block: installed with `handle_sigint`, removed after; a signal
        that came before the result folder was made ends the block with `RunAborted`."""
        stopper = Stopper(self.on_signal)
        if self.handle_sigint:
            stopper.install()
        try:
            yield stopper
        except asyncio.CancelledError:
            if stopper.signum is None or stopper.folder_made:
                raise
            raise RunAborted(stopper.signum) from None
        finally:
            stopper.remove()

    async def check(self, client: Any) -> Optional[dict[str, Any]]:
        """The preflight check of the target through `client` when asked for (what it found), else None."""
        checked = await client.preflight() if self.preflight else None
        if checked is not None and self.on_preflight is not None:
            self.on_preflight(checked)
        return checked


def describe_live(recorder: Recorder, scenario: Scenario, target: Any, checked: Optional[dict[str, Any]],
                  **more: Any) -> None:
    """run.json of a live run: the target's URL (masked), the built-in emulator's timing when it ran,
    the preflight's findings, and `more` (a sharded run's Ray)."""
    recorder.describe(base_url=mask_url(target.base_url), **emulator_note(scenario),
                      **({"preflight": checked} if checked is not None else {}), **more)


@dataclass
class LiveExecutor(LiveOptions):
    """Replays a plan live from this process: the target opened (the built-in emulator started when
    the scenario has none) and checked, run.json written, the workload driven through one client while
    the target's /metrics are scraped. `on_driver` gets the driver as it starts."""

    on_driver: Optional[Callable[[Driver], None]] = None

    async def replay(self, plan: RunPlan, recorder: Recorder) -> Outcome:
        scenario = plan.scenario
        assert scenario is not None, "a live run replays a scenario"
        with self.stopping() as stopper:
            async with open_target(scenario) as target:
                async with make_client(target, scenario.run) as client:
                    checked = await self.check(client)
                    redact = Redactor(target.secrets())
                    probe, note = await open_probe(scenario, target.root, redact)
                    describe_live(recorder, scenario, target, checked)
                    stopper.folder_made = True
                    with recorder.writer() as writer:
                        result = await replay_workload(plan.workload, client, writer, probe, stopper, plan.driver,
                                                       on_progress=self.on_progress, on_driver=self.on_driver)
                        writer.close()
                        itl = writer.itl
        server = server_summary(plan.folder, probe, note, recorder.server, scenario.run.scrape_interval, redact)
        return Outcome(result, itl, server, energy=sampled_power(probe.samples) if probe is not None else None)


async def run_scenario(scenario: Scenario, workload: Workload, folder: Path, **options: Any) -> tuple[Summary, DriverResult]:
    """Replay `workload` as `scenario` says into `folder` (`LiveExecutor`, whose keyword options
    `options` are); returns (summary, how it ended)."""
    return await execute_async(plan_run(scenario, workload, folder), LiveExecutor(**options))


Scraping = Callable[[float], AsyncContextManager[Optional[Callable[[], None]]]]
"""What scrapes servers while a replay runs: given the run's t0 (`time.perf_counter`), a block that
yields the call appending the new samples (`simulator.live.scrape.scraping` is one)."""


async def replay_workload(
    workload: Workload,
    client: Any,
    writer: ResultWriter,
    probe: Optional[MetricsProbe],
    stopper: Stopper,
    settings: dict[str, Any],
    *,
    on_progress: Optional[Callable[[Progress], None]],
    on_driver: Optional[Callable[[Driver], None]],
    scrape: Optional[Scraping] = None,
) -> DriverResult:
    """Drive the workload through `client`, scraping the target's /metrics meanwhile where it has them
    (or, with `scrape`, whatever it scrapes: a fleet's replicas); returns how the run ended."""
    # the schedule starts once the client is set up (model lookup, calibration, preflight), so that
    # setup is not charged to the first calls as lag; so are the warm pool and the first bodies
    ahead = await get_ready(client, workload)
    # the collector's full pass over what is alive happens here too, before the start (the driver's
    # own `gc_frozen` then finds little to walk)
    with gc_frozen():
        t0 = client.t0 = time.perf_counter()
        driver = Driver(client, workload, writer, t0=t0, on_start=writer.started, **settings)
        stopper.driver = driver
        if stopper.signum is not None:
            driver.stop()
        if on_driver is not None:
            on_driver(driver)
        watching = scraping(probe, t0, writer.folder) if scrape is None else scrape(t0)
        async with watching as sync_samples, ahead.running(driver.now):
            return await _drive(driver, writer, len(workload.tasks), on_progress, on_tick=sync_samples)


async def _drive(driver: Driver, writer: ResultWriter, total: int,
                 on_progress: Optional[Callable[[Progress], None]],
                 on_tick: Optional[Callable[[], None]] = None) -> DriverResult:
    async def tick() -> None:
        while True:
            if on_tick is not None:
                on_tick()
            if on_progress is not None:
                on_progress(Progress(driver.now(), total, driver.started, driver.in_flight, writer.counters))
            await asyncio.sleep(TICK)

    ticker = asyncio.ensure_future(tick())
    try:
        return await driver.run()
    finally:
        ticker.cancel()
        if on_progress is not None:
            on_progress(Progress(driver.now(), total, driver.started, driver.in_flight, writer.counters))
