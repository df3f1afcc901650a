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
import heapq
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Optional
from urllib.parse import urlsplit

from ..errors import InputError
from ..gcpause import gc_frozen
from ..metrics import results
from ..metrics import server as server_metrics
from ..metrics.folder import planned_counts, run_info, write_summary
from ..metrics.results import LiveCounters, ResultWriter, Window
from ..metrics.summary import Summary
from ..metrics.tally import RunTally
from ..redact import Redactor, mask_settings, mask_url
from ..scenario import Scenario
from ..task_run import DriverResult, driver_settings
from ..workload import Workload
from .ahead import get_ready
from .driver import Driver
from .probes import MetricsProbe
from .prompts import PromptBuilder

if TYPE_CHECKING:
    from .client import Target

TICK = 0.5
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))
"""Signals that stop a run as Ctrl-C does: the partial summary is written."""


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


@dataclass(frozen=True)
class RunLength:
    """How long a run's arrivals last and about how long the run will take, for the banner."""

    first_arrival: float
    last_arrival: float
    """Of the tasks the run will start (`run.duration` cuts the later ones)."""
    tasks: int
    estimate: float
    """Seconds from the start to the end of the last task: the arrivals (later ones held back by
    `run.max_in_flight`), then each task's tool and think time and, with `server_time`, each call's
    time on an idle server; at most the last arrival plus `run.drain`. Queueing behind other calls
    comes on top, and without `server_time` the server's whole time does."""
    server_time: bool = False
    """Whether the estimate counts the server's time (a model of the target's timing was given)."""


def run_length(workload: Workload, run: Any, call_time: Optional[Callable[[Any], float]] = None) -> RunLength:
    """The arrival span and the estimated length of replaying `workload` with the `run` settings.

    `call_time` gives a call's seconds on the target when nothing else runs (the built-in emulator's
    timing model: `simulator.emulator.call_time`); it is asked once per call, in the order the run sends
    them, roughly. None (a real server, whose speed is not known here): no server time. A trace's
    recorded server times are never used: the scenario's transforms change the calls, not those times."""
    tasks = sorted((t for t in workload.tasks if run.duration is None or t.arrival < run.duration),
                   key=lambda t: t.arrival)
    if not tasks:
        return RunLength(0.0, 0.0, 0, 0.0, call_time is not None)
    timing = call_time or (lambda call: 0.0)
    last = tasks[-1].arrival
    gate = run.max_in_flight or None
    slots: list[float] = []  # when the top-level tasks holding the `max_in_flight` slots end (sub-tasks too)
    estimate = 0.0
    for task in tasks:
        start = task.arrival
        if gate is not None and len(slots) >= gate:
            start = max(start, heapq.heappop(slots))
        _, end = _task_floor(task, start, timing)
        if gate is not None:
            heapq.heappush(slots, end)
        estimate = max(estimate, end)
    if run.drain is not None:
        estimate = min(estimate, last + run.drain)
    return RunLength(tasks[0].arrival, last, len(tasks), max(estimate, last), call_time is not None)


def scenario_run_length(scenario: Scenario, workload: Workload) -> RunLength:
    """`run_length` of replaying `workload` as `scenario` says: with each call's time on the idle
    built-in emulator when the run starts it (`simulator.emulator.call_time`), without the server's
    time against a `target`."""
    if scenario.target is not None:
        return run_length(workload, scenario.run)
    from ..emulator.call_time import unloaded_call_time
    from ..emulator.settings import from_values

    return run_length(workload, scenario.run, unloaded_call_time(from_values(scenario.emulator)))


def _task_floor(task: Any, start: float, call_time: Callable[[Any], float]) -> tuple[float, float]:
    """When a task started at `start` finishes, and when it and every sub-task it spawned (the
    detached ones too) have: its calls one after the other, each after its gap and taking `call_time`;
    sub-agents spawned together run alongside, and those waited for hold the next call back."""
    spawns: dict[int, list[Any]] = {}
    for sub in task.subtasks:
        spawns.setdefault(sub.after_call, []).append(sub)
    now = end = start

    def fork(subs: list[Any], at: float) -> float:
        nonlocal end
        resume = at
        for sub in subs:
            finished, sub_end = _task_floor(sub.task, at, call_time)
            end = max(end, sub_end)
            if sub.wait:
                resume = max(resume, finished)
        return resume

    now = fork(spawns.get(-1, []), now)
    for index, call in enumerate(task.calls):
        now += call.gap + call_time(call)
        if index in spawns:
            now = fork(spawns[index], now)
    return now, max(end, now)


def emulator_note(scenario: Scenario) -> dict[str, Any]:
    """run.json's word on the built-in emulator: ``emulator`` (whether the run started it) and, when it
    did, ``emulator_timing``, what timing it ran (`simulator.emulator.settings.timing_record`)."""
    if scenario.target is not None:
        return {"emulator": False}
    from ..emulator.settings import from_values, timing_record

    return {"emulator": True, "emulator_timing": timing_record(from_values(scenario.emulator))}


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
async def open_target(scenario: Scenario) -> AsyncIterator[Any]:
    """The client's Target: the scenario's (checked: its API key set, no credentials given twice), or
    the built-in emulator started for this run."""
    from .client import Target

    spec = scenario.target
    if spec is None:
        from ..emulator.server import run_emulator

        try:
            emulator = run_emulator(**scenario.emulator)
        except TypeError as exc:
            raise InputError(f"bad emulator setting: {exc}", file=scenario.source, path="emulator") from None
        async with emulator as base_url:
            yield Target(base_url=base_url, vocab_size=int(scenario.emulator.get("vocab_size", 32000)),
                         api_key=scenario.emulator.get("api_key"))
        return
    api_key = None
    if spec.api_key_env:
        api_key = os.environ.get(spec.api_key_env)
        if api_key is None:
            raise InputError(f"environment variable {spec.api_key_env} is not set", file=scenario.source,
                             path="target.api_key_env", field="api_key_env")
    _check_credentials(scenario, api_key)
    fields = spec.model_dump(exclude={"api_key_env", "metrics", "gpu_metrics"})
    yield Target(api_key=api_key, **fields)


def _check_credentials(scenario: Scenario, api_key: Optional[str]) -> None:
    """Credentials given in two places (the URL's user:password, an API key, an Authorization header)
    would reach the server as two Authorization headers: a configuration error, said before the run."""
    spec = scenario.target
    assert spec is not None
    given = []
    if urlsplit(spec.base_url).username is not None or "@" in urlsplit(spec.base_url).netloc:
        given.append("credentials in target.base_url")
    if api_key is not None:
        given.append(f"an API key (target.api_key_env: {spec.api_key_env})")
    if any(name.lower() == "authorization" for name in spec.headers):
        given.append("an Authorization header in target.headers")
    if len(given) > 1:
        raise InputError(f"credentials given twice: {' and '.join(given)}; keep one", file=scenario.source,
                         path="target")


def make_client(target: Target, run: Any) -> Any:
    """The HTTP client of a run (a header the client cannot send is bad input, said before the run)."""
    from .client import Client

    prompts = PromptBuilder(vocab_size=target.vocab_size, share_prefixes=target.share_prefixes, seed=run.seed)
    try:
        return Client(target, time.perf_counter(), prompts)
    except ValueError as exc:
        raise InputError(str(exc), path="target.headers") from None


class RunAborted(Exception):
    """A stop signal came before the run's arrivals started: nothing was measured, no result folder."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name} before the run started")
        self.signum = signum


class Stopper:
    """SIGINT, SIGTERM and SIGHUP during a run: the first stops it as Ctrl-C does (arrivals stop, calls
    in flight are recorded as cancelled, the partial summary is written); a second one of the same
    signal acts as it would without agentload. One before the result folder is made cancels the setup
    (`RunAborted`); one after it, before the driver runs, stops the driver as it starts."""

    def __init__(self, on_signal: Optional[Callable[[int], None]]) -> None:
        self.driver: Optional[Driver] = None
        self.folder_made = False
        self.signum: Optional[int] = None
        self._on_signal = on_signal
        self._main = asyncio.current_task()
        self._loop = asyncio.get_running_loop()
        self._installed: list[int] = []

    def install(self) -> None:
        for signum in STOP_SIGNALS:
            try:
                self._loop.add_signal_handler(signum, self._received, signum)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, no such signal
                continue
            self._installed.append(signum)

    def remove(self) -> None:
        for signum in self._installed:
            self._loop.remove_signal_handler(signum)
        self._installed.clear()

    def _received(self, signum: int) -> None:
        self._loop.remove_signal_handler(signum)
        self._installed.remove(signum)
        if self.signum is None:
            self.signum = signum
            if self._on_signal is not None:
                self._on_signal(signum)
        if self.driver is not None:
            self.driver.stop()
        elif not self.folder_made and self._main is not None:
            self._main.cancel()


async def run_scenario(
    scenario: Scenario,
    workload: Workload,
    folder: Path,
    *,
    on_progress: Optional[Callable[[Progress], None]] = None,
    handle_sigint: bool = True,
    on_driver: Optional[Callable[[Driver], None]] = None,
    preflight: bool = True,
    on_preflight: Optional[Callable[[dict[str, Any]], None]] = None,
    on_signal: Optional[Callable[[int], None]] = None,
) -> tuple[Summary, DriverResult]:
    """Replay `workload` as `scenario` says, writing the result folder; returns (summary, how it ended).

    Nothing is written before the target passed its checks: its settings (`InputError`), and with
    `preflight` the model list and one tiny call (`client.PreflightError`; `on_preflight` gets what it
    found). With `handle_sigint`, SIGINT, SIGTERM and SIGHUP stop the run cleanly (`on_signal` is told
    which came); one before the arrivals start raises `RunAborted`, and no folder is made."""
    window = measurement_window(scenario, workload)
    planned = planned_counts(workload, window, scenario.run.duration)
    stopper = Stopper(on_signal)
    if handle_sigint:
        stopper.install()
    try:
        async with open_target(scenario) as target:
            async with make_client(target, scenario.run) as client:
                checked = await client.preflight() if preflight else None
                if checked is not None and on_preflight is not None:
                    on_preflight(checked)
                redact = Redactor(target.secrets())
                probe, note = await open_probe(scenario, target.root, redact)
                tally, server = RunTally(window, scenario.slo), server_metrics.ServerTally()
                with ResultWriter(folder, window, sinks=(tally, server)) as writer:
                    stopper.folder_made = True
                    writer.write_run_info(run_info({
                        "scenario": scenario.display_name(),
                        "scenario_file": scenario.source,
                        "settings": mask_settings(scenario.model_dump(mode="json", by_alias=True)),
                        "base_url": mask_url(target.base_url),
                        **emulator_note(scenario),
                        **({"preflight": checked} if checked is not None else {}),
                    }, window, planned, workload=workload))
                    outcome = await _replay(scenario, workload, client, writer, probe, stopper,
                                            on_progress=on_progress, on_driver=on_driver)
                    writer.close()
                    itl = writer.itl
    except asyncio.CancelledError:
        if stopper.signum is None or stopper.folder_made:
            raise
        raise RunAborted(stopper.signum) from None
    finally:
        stopper.remove()

    def sections() -> dict[str, Any]:
        return {"scenario": scenario.display_name(),
                "server": server_summary(folder, probe, note, server, scenario.run.scrape_interval, redact)}

    summary = write_summary(folder, window=window, slo=scenario.slo, planned=planned, itl=itl,
                            partial=outcome.partial, stop_reason=outcome.stop_reason, sections=sections, tally=tally)
    return summary, outcome


async def _replay(
    scenario: Scenario,
    workload: Workload,
    client: Any,
    writer: ResultWriter,
    probe: Optional[MetricsProbe],
    stopper: Stopper,
    *,
    on_progress: Optional[Callable[[Progress], None]],
    on_driver: Optional[Callable[[Driver], None]],
) -> DriverResult:
    """Drive the workload through `client`, scraping the target's /metrics meanwhile where it has them;
    returns how the run ended."""
    # the schedule starts once the client is set up (model lookup, calibration, preflight), so that
    # setup is not charged to the first calls as lag; so are the warm pool and the first bodies
    ahead = await get_ready(client, workload)
    # the collector's full pass over what is alive happens here too, before the start (the driver's
    # own `gc_frozen` then finds little to walk)
    with gc_frozen():
        t0 = client.t0 = time.perf_counter()
        driver = Driver(client, workload, writer, t0=t0, on_start=writer.started, **driver_settings(scenario.run))
        stopper.driver = driver
        if stopper.signum is not None:
            driver.stop()
        if on_driver is not None:
            on_driver(driver)
        async with scraping(probe, t0, writer.folder) as sync_samples, ahead.running(driver.now):
            return await _drive(driver, writer, len(workload.tasks), on_progress, on_tick=sync_samples)


@contextlib.asynccontextmanager
async def scraping(probe: Optional[MetricsProbe], t0: float,
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


async def open_probe(scenario: Scenario, root: str, redact: Redactor) -> tuple[Optional[MetricsProbe], Optional[str]]:
    """A /metrics probe for the target when it has /metrics (one test scrape), else (None, why not:
    the URL masked, the error's text `redact`ed)."""
    spec = scenario.target
    if spec is not None and not spec.metrics:
        return None, "server metrics off (target.metrics: false)"
    probe = MetricsProbe(root, interval_s=scenario.run.scrape_interval, gpu=spec is not None and spec.gpu_metrics)
    if await probe.scrape_once() is None:
        where = "the built-in emulator has none" if spec is None else f"GET {mask_url(probe.url)} failed"
        why = redact(probe.last_error or "").removeprefix("ValueError: ")  # type: ignore[union-attr]
        return None, f"no server metrics: {where} ({why})"
    if not probe.samples[0].values:
        return None, f"no server metrics: {mask_url(probe.url)} has none of the vLLM metrics tracked"
    return probe, None


def server_summary(folder: Path, probe: Optional[MetricsProbe], note: Optional[str],
                   tally: server_metrics.ServerTally, interval: float, redact: Redactor) -> dict[str, Any]:
    """Join the scrapes with the task records, write server_tasks.jsonl, return the summary section
    (`simulator.metrics.server.summarize`); a scrape error is redacted first."""
    if probe is None:
        return server_metrics.summarize(folder, tally, None, note=note)
    timeline = probe.summary()
    if timeline.get("last_error"):
        timeline["last_error"] = redact(timeline["last_error"])
    return server_metrics.summarize(folder, tally, probe.samples, timeline, interval_s=interval,
                                    note=note or probe.gpu_note)


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
