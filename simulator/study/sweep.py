"""A sweep from light load to saturation without a study file (`agentload sweep`), as GuideLLM sweeps a
server by default, but per agent task.

Two anchor runs find the load range: the workload's tasks one at a time (`max_in_flight` 1: the
server unloaded, a task's own time) and all at once (every task in flight: the server saturated). Their
completed tasks per hour bound the range; `points` arrival rates spread evenly between them are then
run as a study's load sweep of one config (the scenario's target, the built-in emulator, or a twin
profile), each point an ordinary result folder judged against the scenario's SLO. Both are ordinary
studies: `anchors/` and `rates/` under the sweep's folder, each with its study.json, resumable as a
study is (the same command on the same folder runs only what is missing).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from ..errors import InputError
from ..scenario import Scenario
from ..transforms import task_rate
from ..workload import Workload
from . import schema
from .model import Study, save_study
from .result import build
from .runner import StudyRunner

ANCHORS, RATES = "anchors", "rates"
"""The two studies' folders under the sweep's."""
SCENARIO_FILE = "scenario.yaml"


@dataclass(frozen=True)
class Sweep:
    """What a sweep found: the two anchors (tasks per hour) and the study of the rates between."""

    one_at_a_time_per_hour: float
    all_at_once_per_hour: float
    rates_per_s: list[float]
    study: Study


def config_of(scenario: Scenario, profile: Optional[str]) -> dict[str, Any]:
    """The study config the sweep runs: a twin profile, the scenario's target, or the built-in emulator
    with the scenario's emulator settings."""
    if profile is not None:
        return {"name": "twin", "profile": profile}
    if scenario.target is not None:
        return {"name": "target", "url": scenario.target.base_url}
    return {"name": "emulator", "emulator": scenario.emulator.model_dump()}


def rates_between(low_per_hour: float, high_per_hour: float, points: int) -> list[float]:
    """`points` arrival rates (tasks/s) evenly spaced from one anchor to the other, both included."""
    if points < 2:
        raise InputError("a sweep needs at least 2 points", field="--points")
    if not (high_per_hour > low_per_hour > 0):
        raise InputError(f"the anchors give no load range: one task at a time completed {low_per_hour:,.1f} "
                         f"tasks/h, all at once {high_per_hour:,.1f}: the server does not go faster with more "
                         "tasks in flight", field="anchors")
    step = (high_per_hour - low_per_hour) / (points - 1)
    return [(low_per_hour + i * step) / 3600 for i in range(points)]


def _study(name: str, scenario_file: Path, config: dict[str, Any], settings: list[str], load: dict[str, Any],
           repeats: int, folder: Path) -> schema.StudySpec:
    """A study of one config over `load`, from the scenario file with `settings` over it."""
    text = json.dumps({"name": name, "scenario": str(scenario_file), "set": settings,
                       "configs": {"base": config}, "load": load, "repeats": repeats})
    return schema.parse(text, str(folder / "study.yaml"))


def run_sweep(scenario: Scenario, workload: Workload, scenario_file: Path, folder: Path, *, points: int,
              profile: Optional[str] = None, repeats: int = 1,
              say: Callable[[str], None] = print) -> Sweep:
    """Run the anchors, then the rates between them (see the module doc); `scenario_file` holds
    `scenario` as YAML (the studies read it)."""
    tasks = len(workload.tasks)
    if tasks < 2:
        raise InputError("a sweep needs a workload of 2 tasks or more", file=scenario.source, path="workload")
    name, config = scenario.display_name(), config_of(scenario, profile)
    anchors = _study(f"{name}-anchors", scenario_file, config, ["workload.stagger=0"],
                     {"axis": "max_in_flight", "points": [1, tasks]}, 1, folder / ANCHORS)
    say(f"agentload sweep: anchors (one task at a time, then all {tasks:,} at once): {folder / ANCHORS}")
    first = _run(anchors, folder / ANCHORS)
    rows = {row.load: row.throughput_tasks_per_hour for row in first.configs[0].sweep}
    low, high = rows.get(1.0), rows.get(float(tasks))
    if low is None or high is None:
        raise InputError("an anchor run failed: see its folder", file=str(folder / ANCHORS))
    rates = rates_between(low, high, points)
    # a workload whose tasks all arrive at once has no rate to rescale: space them first (Poisson)
    spread = [] if task_rate(workload) is not None else [f"workload.transforms.rate={rates[0]:.9g}"]
    main = _study(name, scenario_file, config, spread, {"axis": "rate", "points": [round(r, 9) for r in rates]},
                  repeats, folder / RATES)
    say(f"agentload sweep: {points} rates from {low:,.1f} to {high:,.1f} tasks/h: {folder / RATES}")
    return Sweep(low, high, rates, _run(main, folder / RATES))


def _run(spec: schema.StudySpec, folder: Path) -> Study:
    """Run the study into `folder`, its study.json written as it goes; the finished study (without the
    twin's band: a sweep ranks no configs)."""
    final = StudyRunner(spec, folder, band_draws=0).run(lambda state: save_study(folder, build(state)))
    return build(final)
