"""The twin executor: a plan replayed on a twin of a server profile in simulated time (`TwinExecutor`;
`simulate_to_folder` runs a workload with it), into the result folder a live run writes: records
streamed, the twin's /metrics sampled into server_metrics.jsonl as a live run scrapes vLLM's, the
summary computed by the same code as a live run's, its ``server`` section and server_tasks.jsonl too
(`simulator.metrics.server.summarize`). The command line (`agentload simulate`) adds argument parsing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import simpy
from hdrh.histogram import HdrHistogram

from ..behaviour import RetryPolicy
from ..metrics import server as server_metrics
from ..metrics.folder import planned_counts
from ..metrics.results import Window
from ..metrics.slo import Slo
from ..metrics.summary import SimulationBand, SimulationStats, Summary, from_tally
from ..sim.band import DEFAULT_DRAWS, simulate_band
from ..sim.coverage import CallShapes, calibrated_region, coverage
from ..sim.driver import RoutedServer, ScrapeSink, SimDriver, SimResult
from ..sim.power import EngineTimeline, TwinEnergy
from ..sim.profile import ServerProfile
from ..sim.uncertainty import uncertainty
from ..workload import Workload
from .execute import execute
from .plan import RunPlan
from .record import Outcome, Recorder


class TwinExecutor:
    """Replays a plan on the twin of `profile`. With `keep_gaps` every inter-token gap goes into the ITL
    histogram, else the summary approximates it from each call's ITL mean and count; `fast_decode`:
    see `simulator.sim.driver.SimDriver`. The twin's /metrics are sampled every `plan.scrape_interval`
    simulated seconds (None: no samples). With `band_draws` > 0 the summary's ``simulation`` section
    gets the band of `band_draws` more simulations (`simulator.sim.band`; 0: no band section)."""

    def __init__(self, profile: ServerProfile, *, keep_gaps: bool = True, fast_decode: bool = True,
                 band_draws: int = 0) -> None:
        self.profile = profile
        self.keep_gaps = keep_gaps
        self.fast_decode = fast_decode
        self.band_draws = band_draws

    def replay(self, plan: RunPlan, recorder: Recorder) -> Outcome:
        profile, interval = self.profile, plan.scrape_interval
        started = time.perf_counter()
        recorder.describe(simulated=True, profile=profile.name, profile_settings=profile.model_dump(mode="json"))
        run = simulate_plan(plan, recorder, profile, keep_gaps=self.keep_gaps, fast_decode=self.fast_decode)
        simulation = simulation_stats(profile, run, run.driver.twin.kv.evictions, wall=time.perf_counter() - started)
        energy = twin_energy(profile, run)
        if self.band_draws > 0:
            nominal, _ = from_tally(recorder.tally, planned=plan.planned)
            simulation.band = plan_band(plan, profile, nominal, self.band_draws, fast_decode=self.fast_decode)
        server = server_metrics.summarize(plan.folder, recorder.server, run.samples, interval_s=interval,
                                          note=None if run.samples is not None else "the twin was not sampled")
        return Outcome(run.result, run.itl, server, simulation=simulation, energy=energy)


@dataclass
class TwinRun:
    """A plan simulated into its folder's records (`simulate_plan`)."""

    driver: SimDriver
    result: SimResult
    itl: Optional[HdrHistogram]
    """Every gap's ITL histogram (None: approximated from each call's mean gap)."""
    region: Any
    """The profile's calibrated region of call shapes (None: uncalibrated)."""
    shapes: Optional[CallShapes]
    samples: Optional[list[server_metrics.Sample]]
    """The twin's /metrics samples, also in server_metrics.jsonl (None: not sampled, or a fleet's)."""
    timeline: EngineTimeline
    """The engine's counters at each sample and at the run's end (a fleet's summed over its replicas)."""


def simulate_plan(plan: RunPlan, recorder: Recorder, profile: ServerProfile, *, keep_gaps: bool, fast_decode: bool,
                  server: Optional[Callable[[simpy.Environment], RoutedServer]] = None,
                  on_scrape: Optional[ScrapeSink] = None) -> TwinRun:
    """Replay `plan` on the twin of `profile` (or on `server`, built on the driver's environment: a fleet),
    streaming the records through `recorder`'s writer. The twin's /metrics are sampled every
    `plan.scrape_interval` simulated seconds into server_metrics.jsonl; a `server`'s samples go to
    `on_scrape` instead."""
    interval = plan.scrape_interval
    samples: Optional[list[server_metrics.Sample]] = [] if interval is not None and server is None else None
    region = calibrated_region(profile)
    timeline = EngineTimeline()
    with recorder.writer() as writer:
        log = server_metrics.SampleLog(plan.folder) if samples is not None else None
        shapes = CallShapes(writer, plan.window) if region is not None else None

        def scraped(t: float, values: dict[str, float]) -> None:
            log.add(t, values)
            samples.append(server_metrics.Sample(t, values))

        sink = scraped if log is not None else on_scrape

        def sampled(t: float, values: dict[str, float]) -> None:
            timeline.add(t, driver.twin.stats_now(), values.get("generation_tokens"))
            sink(t, values)  # type: ignore[misc]

        try:
            driver = SimDriver(plan.workload, profile, shapes or writer, keep_gaps=keep_gaps, fast_decode=fast_decode,
                               scrape_interval=interval if sink is not None else None,
                               on_scrape=sampled if sink is not None else None, server=server, **plan.driver)
            result = driver.run()
            timeline.add(max(result.end, timeline.times[-1]), result.twin)
        finally:
            if log is not None:
                log.close()
        writer.close()
        itl = writer.itl if keep_gaps else None
    return TwinRun(driver, result, itl, region, shapes, samples, timeline)


def twin_energy(profile: ServerProfile, run: TwinRun, servers: int = 1) -> Optional[TwinEnergy]:
    """The energy meter of `run`, of `servers` servers of `profile` (None: the profile states no power)."""
    return None if profile.power is None else TwinEnergy(profile.power, run.timeline, servers)


def plan_band(plan: RunPlan, profile: ServerProfile, nominal: Summary, draws: int = DEFAULT_DRAWS, *,
              fast_decode: bool = True) -> SimulationBand:
    """The band of `nominal`, the summary of `plan` simulated on `profile`: `draws` more simulations of
    the plan on profiles drawn from the calibration's fit, seeded by the scenario's run seed (0 without
    a scenario), no folder written (`simulator.sim.band`)."""
    seed = plan.scenario.run.seed if plan.scenario is not None else 0
    return simulate_band(plan.workload, profile, nominal, window=plan.window, slo=plan.slo, planned=plan.planned,
                         driver=plan.driver, seed=seed, draws=draws, fast_decode=fast_decode)


def simulate_to_folder(
    workload: Workload,
    profile: ServerProfile,
    folder: Path,
    *,
    window: Window = Window(),
    slo: Slo = Slo(),
    retry: RetryPolicy = RetryPolicy(),
    duration: Optional[float] = None,
    max_in_flight: Optional[int] = None,
    drain: Optional[float] = None,
    keep_gaps: bool = True,
    fast_decode: bool = True,
    scrape_interval: Optional[float] = 1.0,
    band_draws: int = 0,
) -> tuple[Summary, SimResult]:
    """Simulate a workload without a scenario (tests, benchmarks) on `profile` into `folder`, judged in
    `window` against `slo`; `retry`, `duration`, `max_in_flight` and `drain` are the run settings
    (`simulator.task_run.driver_settings`), honoured as a live run honours them; `band_draws`: see
    `TwinExecutor`. A scenario runs with `TwinExecutor` and `simulator.pipeline.plan.plan_run`."""
    plan = RunPlan(workload=workload, folder=Path(folder), window=window,
                   planned=planned_counts(workload, window, duration), slo=slo,
                   driver={"retry": retry, "duration": duration, "max_in_flight": max_in_flight, "drain": drain},
                   scrape_interval=scrape_interval)
    return execute(plan, TwinExecutor(profile, keep_gaps=keep_gaps, fast_decode=fast_decode,  # type: ignore[return-value]
                                      band_draws=band_draws))


def simulation_stats(profile: ServerProfile, run: TwinRun, evicted_blocks: int, wall: float) -> SimulationStats:
    """The summary's ``simulation`` section: what the twin did (`evicted_blocks`: KV blocks evicted), the
    wall time it took, how far the profile behind it is known to be right (`simulator.sim.uncertainty`)
    and which share of the calls lie outside its calibrated shapes."""
    outcome = run.result
    stats = outcome.twin
    known = uncertainty(profile)
    simulation = SimulationStats(
        profile=profile.name,
        calibrated=profile.calibrated,
        simulated_seconds=outcome.end,
        wall_seconds=wall,
        steps=stats.steps,
        preemptions=stats.preemptions,
        prefill_tokens=stats.prefill_tokens,
        cached_prompt_tokens=stats.cached_tokens,
        kv_evicted_blocks=evicted_blocks,
        max_running=stats.max_running,
        busy_fraction=stats.busy_time / outcome.end if outcome.end > 0 else 0.0,
        calibration_rms_error=known.rms_error,
        calibration_points=known.points,
        calibration_drift=known.drift,
        uncalibrated=list(known.uncalibrated),
        uncertainty=known.statement(),
    )
    simulation.coverage = (None if run.region is None or run.shapes is None
                           else coverage(run.region, run.shapes.shapes(), profile.scheduler.max_num_seqs))
    return simulation
