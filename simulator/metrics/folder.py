"""The head and the tail of a result folder, the same for a live run (`simulator.live.runner`) and a
simulated one (`simulator.sim.runner`): run.json's common part before anything is measured, and at the
end the summary from the streamed records, with histograms.json and summary.json beside them."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

from hdrh.histogram import HdrHistogram

from . import histograms, results
from .records import CallRecord, TaskRecord
from .results import Window
from .slo import Slo
from .summary import Summary, summarize

if TYPE_CHECKING:
    from ..workload import Workload

Sections = Callable[[list[CallRecord], list[TaskRecord]], Mapping[str, Any]]
"""The sections a runner adds to the summary, by `Summary` field name, from the run's records."""


def planned_counts(workload: Workload) -> dict[str, int]:
    """The workload's counts, as run.json and the summary's accounting hold them."""
    tasks, calls, subtasks = workload.counts()
    return {"tasks": tasks, "calls": calls, "subtasks": subtasks}


def run_info(what: Mapping[str, Any], window: Window, planned: Mapping[str, int]) -> dict[str, Any]:
    """run.json: what ran (`what`, in its order), then when it started, the measurement window and the
    planned counts (what a summary rebuilt from the records needs)."""
    return {
        **what,
        "started_at": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "window": {"start": window.start, "end": window.end},
        "planned": dict(planned),
    }


def write_summary(
    folder: Path,
    *,
    window: Window,
    slo: Slo,
    planned: Mapping[str, int],
    itl: Optional[HdrHistogram],
    partial: bool = False,
    stop_reason: str = "completed",
    sections: Optional[Sections] = None,
) -> Summary:
    """Summarize the records streamed into `folder` (its writer closed), add the runner's `sections` and
    the folder, write histograms.json and summary.json; returns the summary. `itl`: the live ITL
    histogram (None: approximated from each call's mean gap)."""
    folder = Path(folder)
    calls, tasks = results.read_calls(folder), results.read_tasks(folder)
    summary, hists = summarize(calls, tasks, itl=itl, window=window, slo=slo, planned=planned,
                               partial=partial, stop_reason=stop_reason)
    for name, value in (sections(calls, tasks) if sections is not None else {}).items():
        if name not in Summary.model_fields:
            raise ValueError(f"not a section of the summary: {name}")
        setattr(summary, name, value)
    summary.result_dir = str(folder)
    histograms.save(folder / results.HISTOGRAMS_FILE, hists)
    results.write_json(folder, results.SUMMARY_FILE, summary.to_dict())
    return summary
