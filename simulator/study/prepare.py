"""What a study runs against: its scenario (the scenario file with the study's keys over it), the seeded
workload of each repeat, and the checks that need both the study and its scenario."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from .. import scenario as scenario_mod
from ..errors import InputError
from ..metrics.slo import Slo
from ..scenario import RunSpec, Scenario
from ..transforms import task_rate
from ..workload import Workload
from .cost import api_tokens
from .figures import TaskTokens
from .schema import StudySpec


def study_scenario(spec: StudySpec) -> Scenario:
    """The scenario every point starts from: the scenario file (with `set`) or the inline workload, with
    the study's `workload`, `run` keys, `slo`, `warmup` and `drain` over it."""
    if spec.scenario is not None:
        path = Path(spec.scenario).expanduser()
        path = (path if path.is_absolute() else spec.base_dir() / path).resolve()
        base = scenario_mod.load(path, spec.set)
    else:
        base = Scenario(workload=spec.workload).with_source(spec.source)
        if spec.set:
            raise InputError("`set` overrides a scenario file; without `scenario` give the keys inline",
                             file=spec.source, path="set")
    update: dict[str, Any] = {}
    if spec.workload is not None:
        update["workload"] = spec.workload
    run = base.run
    if spec.run is not None:
        run = run.model_copy(update={k: getattr(spec.run, k) for k in spec.run.model_fields_set})
    run_update = {k: v for k, v in (("warmup", spec.warmup), ("drain", spec.drain)) if v is not None}
    update["run"] = run.model_copy(update=run_update)
    if spec.slo is not None:
        update["slo"] = spec.slo
    return base.model_copy(update=update)  # a copy keeps the source


def target_fields(spec: StudySpec, scenario: Scenario) -> dict[str, Any]:
    """TargetSpec fields of live configs besides the URL: the scenario's target, the study's over it."""
    fields = scenario.target.model_dump(exclude={"base_url"}) if scenario.target is not None else {}
    if spec.target is not None:
        fields.update(spec.target.model_dump(exclude_none=True))
    return fields


@dataclass
class Workloads:
    """The seeded workload of each repeat, made once: repeat k uses seed + k for the workload (a
    generated one's generator, a sample's draw) and for the prompts."""

    scenario: Scenario
    _made: dict[int, tuple[Scenario, Workload, Optional[float]]] = field(default_factory=dict)
    _api: dict[int, dict[str, TaskTokens]] = field(default_factory=dict)

    def api_tokens(self, repeat: int) -> dict[str, TaskTokens]:
        """Per task of repeat `repeat`'s workload, its tokens through an API (`cost.api_tokens`)."""
        if repeat not in self._api:
            self._api[repeat] = api_tokens(self.get(repeat)[1])
        return self._api[repeat]

    def seed(self, repeat: int) -> int:
        """The run seed of repeat `repeat`."""
        return self.scenario.run.seed + repeat

    def get(self, repeat: int) -> tuple[Scenario, Workload, Optional[float]]:
        """(the scenario with the repeat's seeds, its workload, the workload's own task rate)."""
        if repeat not in self._made:
            scenario = self.seeded(repeat)
            workload = scenario_mod.load_workload(scenario)
            self._made[repeat] = (scenario, workload, task_rate(workload))
        return self._made[repeat]

    def seeded(self, repeat: int) -> Scenario:
        """The scenario with repeat `repeat`'s seeds."""
        base = self.scenario
        update: dict[str, Any] = {"run": base.run.model_copy(update={"seed": self.seed(repeat)})}
        generate = base.workload.generate
        if generate is not None and repeat:
            seed = (generate.seed if generate.seed is not None else base.run.seed) + repeat
            update["workload"] = base.workload.model_copy(update={"generate": generate.model_copy(update={"seed": seed})})
        return base.model_copy(update=update)


def reference_scenario(scenario: Scenario, spec: StudySpec) -> Scenario:
    """The fixed-shape reference run: the study's scenario with the synthetic workload and plain run
    settings (no warm-up, no limits)."""
    assert spec.reference is not None
    workload = scenario_mod.WorkloadSpec(synthetic=spec.reference.synthetic)
    run = RunSpec(seed=scenario.run.seed, output=scenario.run.output, scrape_interval=scenario.run.scrape_interval)
    return scenario.model_copy(update={"workload": workload, "run": run, "slo": Slo()})


def check(spec: StudySpec, scenario: Scenario, rate0: Optional[float]) -> None:
    """What the study asks of its scenario: an SLO for a capacity search, arrivals for a rate axis,
    a GPU price for the cost objective."""
    slo = scenario.slo
    if spec.capacity is not None and not (slo.task_s or slo.ttft_ms or slo.tpot_ms):
        raise InputError("a capacity search needs an SLO (slo.task_s and/or slo.ttft_ms, slo.tpot_ms)",
                         file=spec.source, path="capacity")
    needs_rate = spec.capacity is not None or (spec.load is not None and spec.load.axis != "max_in_flight")
    if needs_rate and rate0 is None:
        raise InputError("the workload's tasks all arrive at once (closed loop): a rate axis or a capacity "
                         "search needs arrivals over time; use load.axis max_in_flight", file=spec.source,
                         path="capacity" if spec.capacity is not None else "load.axis")
    if spec.objective == "cost" and (spec.cost is None or spec.cost.gpu_hour is None):
        raise InputError("objective cost needs cost.gpu_hour", file=spec.source, path="objective")
    if spec.objective == "p95_task" and spec.load is None:
        raise InputError("objective p95_task is taken at a sweep point: give `load`", file=spec.source,
                         path="objective")
    if spec.rank_at is not None and (spec.load is None or not any(
            abs(v - spec.rank_at) <= 1e-9 * max(1.0, v) for v in spec.load.values())):
        raise InputError("rank_at must be one of the sweep's values", file=spec.source, path="rank_at")
