"""One simulated run of a scenario, end to end: the workload on a twin of a server profile, records
streamed into a result folder, the twin's /metrics sampled into server_metrics.jsonl as a live run
scrapes vLLM's, the summary computed by the same code as a live run's (`simulator.metrics.summary`),
its ``server`` section and server_tasks.jsonl too (`simulator.metrics.server.summarize`).
The command line (`agentload simulate`) adds argument parsing.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

from ..behaviour import RetryPolicy
from ..metrics import server as server_metrics
from ..metrics.folder import planned_counts, run_info, write_summary
from ..metrics.results import ResultWriter, Window
from ..metrics.slo import Slo
from ..metrics.summary import SimulationStats, Summary
from ..metrics.tally import RunTally
from ..workload import Workload
from .driver import SimDriver, SimResult
from .profile import ServerProfile
from .uncertainty import uncertainty


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
    info: Optional[dict[str, Any]] = None,
) -> tuple[Summary, SimResult]:
    """Simulate `workload` on `profile`, writing the result folder a live run writes (run.json,
    calls/tasks JSONL, histograms, summary.json, and the twin's /metrics every `scrape_interval`
    simulated seconds in server_metrics.jsonl; None: no samples); returns (summary, how the simulation
    ended). With `keep_gaps` every inter-token gap goes into the ITL histogram, else the summary
    approximates it from each call's ITL mean and count. `retry`, `duration`, `max_in_flight` and
    `drain` are the run settings (`task_run.driver_settings`), honoured as a live run honours them."""
    planned = planned_counts(workload, window, duration)
    started = time.perf_counter()
    tally, server = RunTally(window, slo), server_metrics.ServerTally()
    samples: Optional[list[server_metrics.Sample]] = [] if scrape_interval is not None else None
    with ResultWriter(folder, window, sinks=(tally, server)) as writer:
        writer.write_run_info(run_info({
            **(info or {}),
            "simulated": True,
            "profile": profile.name,
            "profile_settings": profile.model_dump(mode="json"),
        }, window, planned, workload=workload))
        log = server_metrics.SampleLog(folder) if samples is not None else None

        def scraped(t: float, values: dict[str, float]) -> None:
            log.add(t, values)
            samples.append(server_metrics.Sample(t, values))

        try:
            driver = SimDriver(workload, profile, writer, retry=retry, keep_gaps=keep_gaps, fast_decode=fast_decode,
                               duration=duration, max_in_flight=max_in_flight, drain=drain,
                               scrape_interval=scrape_interval, on_scrape=scraped if log is not None else None)
            outcome = driver.run()
        finally:
            if log is not None:
                log.close()
        writer.close()
        itl = writer.itl if keep_gaps else None
    simulation = _simulation_stats(profile, driver, outcome, wall=time.perf_counter() - started)
    sections: dict[str, Any] = {"simulation": simulation}
    if info and "scenario" in info:
        sections["scenario"] = info["scenario"]
    sections["server"] = server_metrics.summarize(folder, server, samples, interval_s=scrape_interval,
                                                  note=None if samples is not None else "the twin was not sampled")
    summary = write_summary(folder, window=window, slo=slo, planned=planned, itl=itl,
                            partial=outcome.partial, stop_reason=outcome.stop_reason, sections=lambda: sections,
                            tally=tally)
    return summary, outcome


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
