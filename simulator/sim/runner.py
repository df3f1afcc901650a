"""One simulated run of a scenario, end to end: the workload on a twin of a server profile, records
streamed into a result folder, the summary computed by the same code as a live run's
(`simulator.metrics.summary`). The command line (`agentload simulate`) adds argument parsing.
"""

from __future__ import annotations

import datetime as _dt
import time
from pathlib import Path
from typing import Any, Optional

from ..behaviour import RetryPolicy
from ..metrics import histograms, results
from ..metrics.results import ResultWriter, Window
from ..metrics.slo import Slo
from ..metrics.summary import summarize
from ..workload import Workload
from .driver import SimDriver, SimResult
from .profile import ServerProfile


def simulate_to_folder(
    workload: Workload,
    profile: ServerProfile,
    folder: Path,
    *,
    window: Window = Window(),
    slo: Slo = Slo(),
    retry: RetryPolicy = RetryPolicy(),
    duration: Optional[float] = None,
    keep_gaps: bool = True,
    fast_decode: bool = True,
    info: Optional[dict[str, Any]] = None,
) -> tuple[dict[str, Any], SimResult]:
    """Simulate `workload` on `profile`, writing the result folder a live run writes (run.json,
    calls/tasks JSONL, histograms, summary.json); returns (summary, how the simulation ended).
    With `keep_gaps` every inter-token gap goes into the ITL histogram, else the summary
    approximates it from each call's ITL mean and count."""
    tasks, calls, subtasks = workload.counts()
    planned = {"tasks": tasks, "calls": calls, "subtasks": subtasks}
    started = time.perf_counter()
    with ResultWriter(folder, window) as writer:
        writer.write_run_info({
            **(info or {}),
            "simulated": True,
            "profile": profile.name,
            "profile_settings": profile.model_dump(mode="json"),
            "started_at": _dt.datetime.now(_dt.timezone.utc).isoformat(),
            "window": {"start": window.start, "end": window.end},
            "planned": planned,
        })
        driver = SimDriver(workload, profile, writer, retry=retry, keep_gaps=keep_gaps,
                           fast_decode=fast_decode, duration=duration)
        outcome = driver.run()
        writer.close()
        itl = writer.itl if keep_gaps else None
    wall = time.perf_counter() - started
    summary, hists = summarize(
        results.read_calls(folder), results.read_tasks(folder), itl=itl, window=window, slo=slo,
        planned=planned, partial=False, stop_reason="completed",
    )
    stats = outcome.twin
    summary["simulation"] = {
        "profile": profile.name,
        "calibrated": profile.calibrated,
        "simulated_seconds": outcome.end,
        "wall_seconds": wall,
        "steps": stats.steps,
        "preemptions": stats.preemptions,
        "prefill_tokens": stats.prefill_tokens,
        "cached_prompt_tokens": stats.cached_tokens,
        "kv_evicted_blocks": driver.twin.kv.evictions,
        "max_running": stats.max_running,
        "busy_fraction": stats.busy_time / outcome.end if outcome.end > 0 else 0.0,
    }
    summary["result_dir"] = str(folder)
    histograms.save(folder / results.HISTOGRAMS_FILE, hists)
    results.write_json(folder, results.SUMMARY_FILE, summary)
    return summary, outcome
