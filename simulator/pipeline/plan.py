"""What a run is to do before it does it: the scenario and workload, the result folder, the measurement
window and the planned counts (`RunPlan`), built the same way for every executor (`plan_run`)."""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from ..errors import InputError
from ..metrics import results
from ..metrics.folder import planned_counts
from ..metrics.results import Window
from ..metrics.slo import Slo
from ..task_run import driver_settings

if TYPE_CHECKING:
    from ..scenario import Scenario
    from ..workload import Workload


@dataclass(frozen=True)
class RunPlan:
    """One run to execute: its workload, result folder, window, planned counts, SLO and the run settings
    the drivers honour; the scenario it came from (None for a workload simulated on its own, whose
    run.json then says only what the executor adds)."""

    workload: Workload
    folder: Path
    window: Window = Window()
    planned: dict[str, Any] = field(default_factory=dict)
    slo: Slo = field(default_factory=Slo)
    driver: dict[str, Any] = field(default_factory=dict)
    """The replay's settings both drivers take (`simulator.task_run.driver_settings`)."""
    scrape_interval: Optional[float] = 1.0
    """Seconds between samples of the server's /metrics (None: not sampled)."""
    scenario: Optional[Scenario] = None


def plan_run(scenario: Scenario, workload: Workload, folder: Path) -> RunPlan:
    """The plan of replaying `workload` as `scenario` says into `folder`."""
    window = measurement_window(scenario, workload)
    return RunPlan(workload=workload, folder=Path(folder), window=window,
                   planned=planned_counts(workload, window, scenario.run.duration), slo=scenario.slo,
                   driver=driver_settings(scenario.run), scrape_interval=scenario.run.scrape_interval,
                   scenario=scenario)


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


def result_folder(scenario: Scenario, output: Optional[str], kind: str = "") -> Path:
    """-o DIR as given, else run.output/<name>[-kind]-<timestamp>; InputError when it already holds a run."""
    if output:
        folder = Path(output)
    else:
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        folder = Path(scenario.run.output) / f"{scenario.display_name()}{f'-{kind}' if kind else ''}-{stamp}"
    if (folder / results.RUN_FILE).exists():
        raise InputError("result folder already holds a run; choose another with -o", file=str(folder))
    return folder
