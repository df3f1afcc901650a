"""The result folder's head and tail, the same for every executor: run.json before anything is
measured (`Recorder.describe`: one builder, the scenario's settings always masked), the record writer
feeding the run's tallies (`Recorder.writer`), and at the end the summary, histograms.json and
summary.json (`Recorder.finish`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from hdrh.histogram import HdrHistogram

from ..metrics import histograms, results
from ..metrics import server as server_metrics
from ..metrics.energy import EnergyMeter, energy_figures
from ..metrics.fleet import FleetFigures
from ..metrics.folder import run_info
from ..metrics.results import ResultWriter
from ..metrics.summary import SimulationStats, Summary, from_tally
from ..metrics.tally import RunTally
from ..redact import mask_settings
from ..task_run import DriverResult
from .plan import RunPlan


@dataclass(frozen=True)
class Outcome:
    """What an executor hands back when its replay is over: how it ended, the ITL histogram of every
    gap (None: approximated from each call's mean gap), the summary's sections only it knows, and the
    tally of the records when it kept its own (a sharded run merges its shards'; None: the recorder's,
    fed by its writer)."""

    result: DriverResult
    itl: Optional[HdrHistogram]
    server: Optional[dict[str, Any]] = None
    """The summary's ``server`` section (`simulator.metrics.server.summarize`)."""
    simulation: Optional[SimulationStats] = None
    shards: Optional[list[dict[str, Any]]] = None
    ray: Optional[dict[str, Any]] = None
    tally: Optional[RunTally] = None
    fleet: Optional[FleetFigures] = None
    """A fleet run's ``fleet`` section (`simulator.metrics.fleet.fleet_figures`)."""
    energy: Optional[EnergyMeter] = None
    """What the ``energy`` section is measured with (`simulator.metrics.energy`; None: no section)."""


class Recorder:
    """Owns a run's result folder for its executor: what run.json says, the writer and the tallies it
    feeds, the summary."""

    def __init__(self, plan: RunPlan) -> None:
        self.plan = plan
        self.tally = RunTally(plan.window, plan.slo)
        self.server = server_metrics.ServerTally()
        """Per-task server load, fed by the writer (a sharded run feeds it from the merged records)."""
        self.folder_made = False

    def describe(self, **executor_fields: Any) -> None:
        """Write run.json: the scenario (its name, file and masked settings, when the plan has one),
        then what the executor adds (in its order), then the common tail (`simulator.metrics.folder.run_info`)."""
        plan = self.plan
        what: dict[str, Any] = {}
        if plan.scenario is not None:
            what = {"scenario": plan.scenario.display_name(), "scenario_file": plan.scenario.source,
                    "settings": mask_settings(plan.scenario.model_dump(mode="json", by_alias=True))}
        plan.folder.mkdir(parents=True, exist_ok=True)
        self.folder_made = True
        results.write_json(plan.folder, results.RUN_FILE,
                           run_info({**what, **executor_fields}, plan.window, plan.planned, workload=plan.workload))

    def writer(self) -> ResultWriter:
        """The writer of the run's records, feeding the recorder's tallies."""
        self.folder_made = True
        return ResultWriter(self.plan.folder, self.plan.window, sinks=(self.tally, self.server))

    def finish(self, outcome: Outcome) -> Summary:
        """The summary of the records streamed into the folder (the writer closed), with the executor's
        sections; histograms.json and summary.json written beside them."""
        plan = self.plan
        tally = outcome.tally or self.tally
        summary, hists = from_tally(tally, itl=outcome.itl, planned=plan.planned, partial=outcome.result.partial,
                                    stop_reason=outcome.result.stop_reason)
        if plan.scenario is not None:
            summary.scenario = plan.scenario.display_name()
        if outcome.simulation is not None:
            summary.simulation = outcome.simulation
        summary.result_dir = str(plan.folder)
        if outcome.server is not None:
            summary.server = outcome.server
        if outcome.shards is not None:
            summary.shards = outcome.shards
        if outcome.ray is not None:
            summary.ray = outcome.ray
        if outcome.fleet is not None:
            summary.fleet = outcome.fleet
        energy = None if outcome.energy is None else energy_figures(
            outcome.energy, start=summary.window.start, duration=summary.duration,
            tasks_completed=summary.tasks.completed, output_tokens=summary.total_output_tokens)
        if energy is not None:  # set only when measured: a summary without it has no energy key
            summary.energy = energy
        histograms.save(plan.folder / results.HISTOGRAMS_FILE, hists)
        results.write_json(plan.folder, results.SUMMARY_FILE, summary.to_dict())
        return summary
