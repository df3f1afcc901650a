"""One live run of a scenario, end to end: target (or the built-in emulator), client, driver, server
metrics probe, result folder, summary. The command line (`agentload run`) adds only argument parsing
and the display.

When the target answers ``GET /metrics`` (vLLM), the run scrapes it every `run.scrape_interval`
seconds (`MetricsProbe`), appends the scrapes to server_metrics.jsonl, joins them with the task
records into server_tasks.jsonl and adds the ``server`` section to the summary. A target without
/metrics (the built-in emulator, a hosted API) only gets a note there.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as _dt
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Optional

from ..errors import InputError
from ..metrics import results
from ..metrics import server as server_metrics
from ..metrics.folder import planned_counts, run_info, write_summary
from ..metrics.records import CallRecord, TaskRecord
from ..metrics.results import LiveCounters, ResultWriter, Window
from ..metrics.summary import Summary
from ..scenario import Scenario
from ..task_run import DriverResult, driver_settings
from ..workload import Workload
from .driver import Driver
from .probes import MetricsProbe
from .prompts import PromptBuilder

if TYPE_CHECKING:
    from .client import Target

TICK = 0.5


@dataclass(frozen=True)
class Progress:
    """A snapshot for the live display."""

    elapsed: float
    tasks_total: int
    tasks_started: int
    in_flight: int
    counters: LiveCounters


def measurement_window(scenario: Scenario, workload: Workload) -> Window:
    """[warmup, end of arrivals - cooldown]; open-ended without a cooldown."""
    run = scenario.run
    if run.cooldown <= 0:
        return Window(run.warmup, None)
    arrivals_end = run.duration if run.duration is not None else max(t.arrival for t in workload.tasks)
    end = arrivals_end - run.cooldown
    if end < run.warmup:
        raise InputError(
            f"warm-up ({run.warmup:g} s) and cool-down ({run.cooldown:g} s) leave no measurement window "
            f"in {arrivals_end:g} s of arrivals", file=scenario.source, path="run.cooldown")
    return Window(run.warmup, end)


def result_folder(scenario: Scenario, output: Optional[str]) -> Path:
    """-o DIR as given, else run.output/<name>-<timestamp>."""
    if output:
        folder = Path(output)
    else:
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        folder = Path(scenario.run.output) / f"{scenario.display_name()}-{stamp}"
    if (folder / results.RUN_FILE).exists():
        raise InputError("result folder already holds a run; choose another with -o", file=str(folder))
    return folder


@contextlib.asynccontextmanager
async def _target(scenario: Scenario) -> AsyncIterator[Any]:
    """The client's Target: the scenario's, or the built-in emulator started for this run."""
    from .client import Target

    spec = scenario.target
    if spec is None:
        from ..emulator.server import run_emulator

        try:
            emulator = run_emulator(**scenario.emulator)
        except TypeError as exc:
            raise InputError(f"bad emulator setting: {exc}", file=scenario.source, path="emulator") from None
        async with emulator as base_url:
            yield Target(base_url=base_url, vocab_size=int(scenario.emulator.get("vocab_size", 32000)))
        return
    api_key = None
    if spec.api_key_env:
        api_key = os.environ.get(spec.api_key_env)
        if api_key is None:
            raise InputError(f"environment variable {spec.api_key_env} is not set", file=scenario.source,
                             path="target.api_key_env", field="api_key_env")
    fields = spec.model_dump(exclude={"api_key_env", "metrics", "gpu_metrics"})
    yield Target(api_key=api_key, **fields)


async def run_scenario(
    scenario: Scenario,
    workload: Workload,
    folder: Path,
    *,
    on_progress: Optional[Callable[[Progress], None]] = None,
    handle_sigint: bool = True,
    on_driver: Optional[Callable[[Driver], None]] = None,
) -> tuple[Summary, DriverResult]:
    """Replay `workload` as `scenario` says, writing the result folder; returns (summary, how it ended)."""
    window = measurement_window(scenario, workload)
    planned = planned_counts(workload)
    with ResultWriter(folder, window) as writer:
        async with _target(scenario) as target:
            writer.write_run_info(run_info({
                "scenario": scenario.display_name(),
                "scenario_file": scenario.source,
                "settings": scenario.model_dump(mode="json", by_alias=True),
                "base_url": target.base_url,
                "emulator": scenario.target is None,
            }, window, planned))
            outcome, probe, note = await _replay(scenario, workload, target, writer, on_progress=on_progress,
                                                 handle_sigint=handle_sigint, on_driver=on_driver)
        writer.close()
        itl = writer.itl

    def sections(calls: list[CallRecord], tasks: list[TaskRecord]) -> dict[str, Any]:
        return {"scenario": scenario.display_name(),
                "server": _server_summary(folder, probe, note, calls, tasks, scenario.run.scrape_interval)}

    summary = write_summary(folder, window=window, slo=scenario.slo, planned=planned, itl=itl,
                            partial=outcome.partial, stop_reason=outcome.stop_reason, sections=sections)
    return summary, outcome


async def _replay(
    scenario: Scenario,
    workload: Workload,
    target: Target,
    writer: ResultWriter,
    *,
    on_progress: Optional[Callable[[Progress], None]],
    handle_sigint: bool,
    on_driver: Optional[Callable[[Driver], None]],
) -> tuple[DriverResult, Optional[MetricsProbe], Optional[str]]:
    """Drive the workload against `target`, scraping its /metrics meanwhile where it has them; returns
    how the run ended, the probe (None without one) and the note on server metrics."""
    from .client import Client

    run = scenario.run
    prompts = PromptBuilder(vocab_size=target.vocab_size, share_prefixes=target.share_prefixes, seed=run.seed)
    async with Client(target, time.perf_counter(), prompts) as client:
        probe, note = await _open_probe(scenario, target.root)
        # the schedule starts once the client is set up (model lookup, calibration), so that
        # setup is not charged to the first calls as lag
        t0 = client.t0 = time.perf_counter()
        driver = Driver(client, workload, writer, t0=t0, **driver_settings(run))
        if on_driver is not None:
            on_driver(driver)
        async with _scraping(probe, t0, writer.folder) as sync_samples:
            outcome = await _drive(driver, writer, len(workload.tasks), on_progress, handle_sigint,
                                   on_tick=sync_samples)
    return outcome, probe, note


@contextlib.asynccontextmanager
async def _scraping(probe: Optional[MetricsProbe], t0: float,
                    folder: Path) -> AsyncIterator[Optional[Callable[[], None]]]:
    """Scrape /metrics while the block runs, appending the samples to server_metrics.jsonl; yields the
    call that appends the new samples (None without a probe)."""
    if probe is None:
        yield None
        return
    # the probe keeps time on time.monotonic: give it the run's t0 on that clock
    probe.t0 = time.monotonic() - (time.perf_counter() - t0)
    # nothing was sent since the test scrape: it is the counters' baseline at t = 0
    probe.samples[:] = [dataclasses.replace(probe.samples[-1], t=0.0)]
    log = server_metrics.SampleLog(folder)
    await probe.start()
    try:
        yield lambda: log.sync(probe.samples)
    finally:
        await probe.stop()
        log.sync(probe.samples)
        log.close()


async def _open_probe(scenario: Scenario, root: str) -> tuple[Optional[MetricsProbe], Optional[str]]:
    """A /metrics probe for the target when it has /metrics (one test scrape), else (None, why not)."""
    spec = scenario.target
    if spec is not None and not spec.metrics:
        return None, "server metrics off (target.metrics: false)"
    probe = MetricsProbe(root, interval_s=scenario.run.scrape_interval, gpu=spec is not None and spec.gpu_metrics)
    if await probe.scrape_once() is None:
        where = "the built-in emulator has none" if spec is None else f"GET {probe.url} failed"
        return None, f"no server metrics: {where} ({(probe.last_error or '').removeprefix('ValueError: ')})"
    if not probe.samples[0].values:
        return None, f"no server metrics: {probe.url} has none of the vLLM metrics tracked"
    return probe, None


def _server_summary(folder: Path, probe: Optional[MetricsProbe], note: Optional[str], calls: list[CallRecord],
                    tasks: list[TaskRecord], interval: float) -> dict[str, Any]:
    """Join the scrapes with the task records, write server_tasks.jsonl, return the summary section."""
    timeline, loads = None, None
    if probe is not None:
        timeline = probe.summary()
        loads = {load.task_id: {"kv_cache_usage_mean": load.kv_cache_usage_mean, "waiting_mean": load.waiting_mean,
                                "running_mean": load.running_mean} for load in probe.join(tasks)}
        note = note or probe.gpu_note
    rows = server_metrics.task_rows(tasks, calls, loads)
    server_metrics.write_task_rows(folder, rows)
    return server_metrics.server_section(rows, calls, timeline, interval_s=interval if probe else None, note=note)


async def _drive(driver: Driver, writer: ResultWriter, total: int,
                 on_progress: Optional[Callable[[Progress], None]], handle_sigint: bool,
                 on_tick: Optional[Callable[[], None]] = None) -> DriverResult:
    loop = asyncio.get_running_loop()
    sigint = False

    def on_sigint() -> None:
        # the first Ctrl-C ends the run cleanly; a second one interrupts as usual
        loop.remove_signal_handler(signal.SIGINT)
        driver.stop()

    if handle_sigint:
        try:
            loop.add_signal_handler(signal.SIGINT, on_sigint)
            sigint = True
        except (NotImplementedError, RuntimeError):  # not the main thread, or no signal support
            pass

    async def tick() -> None:
        while True:
            writer.maybe_flush()
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
        if sigint:
            loop.remove_signal_handler(signal.SIGINT)
