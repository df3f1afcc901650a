"""The twin executor: a plan replayed on a twin of a server profile in simulated time (`TwinExecutor`;
`simulate_to_folder` runs a workload with it), into the result folder a live run writes: records
streamed, the twin's /metrics sampled into server_metrics.jsonl as a live run scrapes vLLM's, the
summary computed by the same code as a live run's, its ``server`` section and server_tasks.jsonl too
(`simulator.metrics.server.summarize`). The command line (`agentload simulate`) adds argument parsing.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

from ..behaviour import RetryPolicy
from ..metrics import server as server_metrics
from ..metrics.folder import planned_counts
from ..metrics.results import Window
from ..metrics.slo import Slo
from ..metrics.summary import SimulationBand, SimulationStats, Summary, from_tally
from ..sim.band import DEFAULT_DRAWS, simulate_band
from ..sim.coverage import CallShapes, calibrated_region, coverage
from ..sim.driver import SimDriver, SimResult
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
        samples: Optional[list[server_metrics.Sample]] = [] if interval is not None else None
        recorder.describe(simulated=True, profile=profile.name, profile_settings=profile.model_dump(mode="json"))
        region = calibrated_region(profile)
        with recorder.writer() as writer:
            log = server_metrics.SampleLog(plan.folder) if samples is not None else None
            shapes = CallShapes(writer, plan.window) if region is not None else None

            def scraped(t: float, values: dict[str, float]) -> None:
                log.add(t, values)
                samples.append(server_metrics.Sample(t, values))

            try:
                driver = SimDriver(plan.workload, profile, shapes or writer, keep_gaps=self.keep_gaps,
                                   fast_decode=self.fast_decode, scrape_interval=interval,
                                   on_scrape=scraped if log is not None else None, **plan.driver)
                result = driver.run()
            finally:
                if log is not None:
                    log.close()
            writer.close()
            itl = writer.itl if self.keep_gaps else None
        simulation = _simulation_stats(profile, driver, result, wall=time.perf_counter() - started)
        simulation.coverage = (None if region is None or shapes is None
                               else coverage(region, shapes.shapes(), profile.scheduler.max_num_seqs))
        if self.band_draws > 0:
            nominal, _ = from_tally(recorder.tally, planned=plan.planned)
            simulation.band = plan_band(plan, profile, nominal, self.band_draws, fast_decode=self.fast_decode)
        server = server_metrics.summarize(plan.folder, recorder.server, samples, interval_s=interval,
                                          note=None if samples is not None else "the twin was not sampled")
        return Outcome(result, itl, server, simulation=simulation)


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


def _simulation_stats(profile: ServerProfile, driver: SimDriver, outcome: SimResult, wall: float) -> SimulationStats:
    """The summary's ``simulation`` section: what the twin did, the wall time it took, and how far the
    profile behind it is known to be right (`simulator.sim.uncertainty`)."""
    stats = outcome.twin
    known = uncertainty(profile)
    return SimulationStats(
        profile=profile.name,
        calibrated=profile.calibrated,
        simulated_seconds=outcome.end,
        wall_seconds=wall,
        steps=stats.steps,
        preemptions=stats.preemptions,
        prefill_tokens=stats.prefill_tokens,
        cached_prompt_tokens=stats.cached_tokens,
        kv_evicted_blocks=driver.twin.kv.evictions,
        max_running=stats.max_running,
        busy_fraction=stats.busy_time / outcome.end if outcome.end > 0 else 0.0,
        calibration_rms_error=known.rms_error,
        calibration_points=known.points,
        calibration_drift=known.drift,
        uncalibrated=list(known.uncalibrated),
        uncertainty=known.statement(),
    )
