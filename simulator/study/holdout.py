"""The held-out capacity check: a capacity found on some traffic, run on traffic its search never saw.

The capacity search finds, per config, the highest task rate at which the SLO held over the repeats'
seeds. A planner who buys hardware for that rate needs to know that it carries traffic the search did
not tune itself to. After the search the study runs **held-out traffic** at shares of the found
capacity (`capacity.holdout.at`, default 100% and 90%) and judges each point as the search judges its
probes (`PointResult.verdict`: every SLO target over every task meant to run, the failed or cancelled
share, the queue's growth with `max_growth`).

The held-out traffic is one of:

- **a seed** no repeat used (default: the first after the repeats', run.seed + N for N repeats): the
  workload drawn again, as a repeat's is (a generated workload's generator seed moves with it). Only
  where the seed draws new traffic: a workload generated from a model (new tasks), or a trace's seeded
  sample or arrivals (the recorded tasks drawn again);
- **a split** of the workload: its top-level tasks in arrival order, the first `split` share for every
  other point of the study (the sweep and the search), the rest for the check, its arrivals shifted to
  start when the first part's do (so that a warm-up covers the same stretch). For a trace, which
  replays the same tasks at every seed; the rest is that of repeat 0's workload, run with the first
  seed no repeat used.

Held-out points are ordinary study points (source ``holdout``) in folders of their own
(``points/CONFIG/holdout-seed-N/rate-R``), read back when a study starts again. A seed-held-out check
changes no other point, so it stays out of the study folder's key: a finished study started again with
the check switched on runs only the check's points.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from ..errors import InputError
from ..scenario import Scenario
from ..scenario import load_workload
from ..transforms import task_rate
from ..workload import Provenance, Workload
from .capacity import Capacity
from .points import PointResult
from .prepare import Workloads
from .ranking import plain
from .schema import HoldoutSpec, StudySpec

SOURCE = "holdout"
"""The `PointResult.source` of a held-out point."""


@dataclass(frozen=True)
class HeldOut:
    """The traffic a study checks its capacities on, and the shares of them it checks."""

    repeat: int
    """The key the study's workloads give it under (`Workloads.get`): for a seed, its offset from the run
    seed; for a split, one past the repeats."""
    seed: int
    """Its run seed."""
    split: Optional[float]
    """The share of the workload's tasks the rest of the study runs on (None: a held-out seed)."""
    at: tuple[float, ...]
    """Shares of the found capacity checked, highest first."""
    traffic: str
    """What it is, in words."""

    def folder(self, root: str, config: str, label: str) -> str:
        """A held-out point's folder, relative to the study folder."""
        key = f"split-{self.split:g}" if self.split is not None else f"seed-{self.seed}"
        return f"{root}/{config}/holdout-{key}/{label}"


def seed_draws(scenario: Scenario) -> Optional[str]:
    """What another seed draws of the scenario's workload, in words (None: the same tasks at every seed)."""
    workload = scenario.workload
    if workload.model is not None:
        return "new tasks from the workload model"
    spec = workload.transforms
    if spec is None:
        return None
    if spec.sample is not None:
        return "another sample of the trace's tasks"
    if spec.burstiness is not None or (spec.rate_mode == "overlay" and (spec.rate is not None or spec.rate_scale != 1.0)):
        return "the trace's tasks with their arrivals drawn again"
    return None


def held_out(spec: StudySpec, scenario: Scenario) -> tuple[Optional[HeldOut], Optional[str]]:
    """The held-out traffic of the study (None: no check), and a note for study.json when the default
    leaves the check off; `InputError` naming `capacity.holdout` when the traffic asked for is none the
    search never saw."""
    cap = spec.capacity
    if cap is None or cap.holdout is False:
        return None, None
    draws = seed_draws(scenario)
    setting = cap.holdout
    if setting is None:
        if scenario.workload.model is None:
            why = ("the workload replays the same tasks at every seed" if draws is None else
                   f"another seed draws only {draws}")
            return None, (f"no held-out capacity check: {why}; capacity.holdout: {{split: 0.5}} checks each "
                          "capacity on the workload's later half, the search running on its first half")
        setting = HoldoutSpec()
    elif setting is True:
        setting = HoldoutSpec()
    used = max(spec.repeats, cap.repeats or spec.repeats)
    run_seed = scenario.run.seed
    at = tuple(sorted(setting.at, reverse=True))
    if setting.split is not None:
        rest = 1 - setting.split
        return HeldOut(used, run_seed + used, setting.split, at,
                       f"the workload's last {rest:.0%} of tasks by arrival (split {setting.split:g}), "
                       f"seed {run_seed + used}"), None
    where = {"file": spec.source, "line": spec.line(["capacity", "holdout"]), "path": "capacity.holdout"}
    if draws is None:
        raise InputError("a held-out seed needs a workload that another seed draws anew (generated from a model, "
                         "or a trace's seeded sample or arrivals); this one replays the same tasks at every seed: "
                         "give capacity.holdout: {split: 0.5}", **where)
    seed = setting.seed if setting.seed is not None else run_seed + used
    offset = seed - run_seed
    if 0 <= offset < used:
        raise InputError(f"held-out seed {seed} is repeat {offset}'s: give a seed no repeat uses (they use "
                         f"{run_seed} to {run_seed + used - 1})", **where)
    generate = scenario.workload.generate
    if generate is not None and generate.seed is not None and generate.seed + offset < 0:
        raise InputError(f"held-out seed {seed} takes the generator's seed ({generate.seed} + {offset}) below 0",
                         **where)
    return HeldOut(offset, seed, None, at, f"seed {seed} ({draws})"), None


def definition(spec: StudySpec) -> dict[str, Any]:
    """The study's definition as its folder's key holds it: a held-out check that changes no other point
    (a seed, or none) is left out, so that switching it on, off or to another seed resumes the study; a
    split, which changes every point's workload, stays in."""
    data = spec.model_dump(mode="json")
    capacity = data.get("capacity")
    if isinstance(capacity, dict):
        holdout = capacity.get("holdout")
        if not (isinstance(holdout, dict) and holdout.get("split") is not None):
            capacity.pop("holdout", None)
    return data


# --- the split ---------------------------------------------------------------------------------------


def split_workload(workload: Workload, share: float, source: Optional[str] = None) -> tuple[Workload, Workload]:
    """(the first `share` of the top-level tasks by arrival, the rest with their arrivals shifted to start
    when the first part's do); `InputError` when either part has fewer than two tasks (no rate)."""
    ordered = sorted(workload.tasks, key=lambda t: t.arrival)  # stable: ties keep the workload's order
    n = len(ordered)
    k = round(share * n)
    if k < 2 or n - k < 2:
        raise InputError(f"split {share:g} of the workload's {n} tasks leaves {k} and {n - k}: each part needs two "
                         "tasks or more (a rate to rescale)", file=source, path="capacity.holdout.split")
    first, rest = ordered[:k], ordered[k:]
    shift = rest[0].arrival - first[0].arrival
    rest = [dataclasses.replace(t, arrival=t.arrival - shift) for t in rest]

    def part(tasks: list, name: str) -> Workload:
        note = Provenance(source="split", format="holdout", options={"split": share, "part": name})
        return Workload(tuple(tasks), workload.provenance + (note,))

    return part(first, "search"), part(rest, "held_out")


@dataclass
class SplitWorkloads(Workloads):
    """A study's workloads cut by `split_workload`: every repeat runs the first part of its workload; the
    held-out key (`HeldOut.repeat`) the rest of repeat 0's, with its own seed."""

    split: float = 0.5
    held_out: int = 1
    _full: dict[int, Workload] = dataclasses.field(default_factory=dict)

    def get(self, repeat: int) -> tuple[Scenario, Workload, Optional[float]]:
        """(the scenario with the repeat's seeds, its part of the workload, that part's own task rate)."""
        if repeat not in self._made:
            source = 0 if repeat == self.held_out else repeat
            if source not in self._full:
                self._full[source] = load_workload(self.seeded(source))
            first, rest = split_workload(self._full[source], self.split, self.scenario.source)
            part = rest if repeat == self.held_out else first
            self._made[repeat] = (self.seeded(repeat), part, task_rate(part))
        return self._made[repeat]


def workloads(scenario: Scenario, traffic: Optional[HeldOut]) -> Workloads:
    """The study's workloads: split when the held-out traffic is a split."""
    if traffic is not None and traffic.split is not None:
        return SplitWorkloads(scenario, split=traffic.split, held_out=traffic.repeat)
    return Workloads(scenario)


# --- the check ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rates:
    """What a config's check runs: the rate the shares are of, and the rates in the order they run."""

    capacity: Optional[float]
    """Tasks per second: the capacity, or its lower bound above the search's range (None: no capacity)."""
    bound: str
    """'exact' or 'at_least'."""
    checked: tuple[tuple[float, float], ...]
    """(share, rate) checked, highest share first."""
    baseline: Optional[float]
    """With `max_growth`: the search's lowest probed rate, run first on the held-out traffic so that the
    checked points' growth is judged against the same tasks at a light load, as the search's probes are."""

    def run_order(self) -> list[float]:
        """The baseline, then the checked rates from the lowest."""
        return ([self.baseline] if self.baseline is not None else []) + sorted(rate for _, rate in self.checked)


def rates(traffic: HeldOut, capacity: Capacity, growth: bool) -> Rates:
    """The rates a config's check runs (`growth`: the study judges the queue's growth)."""
    rate, bound = capacity.rate, "exact"
    if rate is None and capacity.status == "above_range" and capacity.at_least is not None:
        rate, bound = capacity.at_least, "at_least"
    if rate is None:
        return Rates(None, bound, (), None)
    checked = tuple((share, share * rate) for share in traffic.at)
    probed = [r for s in capacity.searches for r, _ in s.probes]
    lowest = min(probed) if probed else None
    baseline = lowest if growth and lowest is not None and lowest < min(r for _, r in checked) else None
    return Rates(rate, bound, checked, baseline)


VERDICTS = ("held", "held_below", "missed", "untestable", "failed", "not_run")
"""A check's verdict: held at every rate checked; missed at the capacity but held at a lower share;
missed (at no rate held, or at a rate below one that held); held, but as a burst at some rate (its
arrivals too short to test it); a point failed; not run (no capacity to check)."""


def verdict(checked: list[tuple[float, Optional[str]]]) -> str:
    """The check's verdict (`VERDICTS`) from each (share, point verdict), highest share first."""
    if not checked:
        return "not_run"
    verdicts = [v for _, v in checked]
    if any(v is None for v in verdicts):
        return "failed"
    if all(v == "held" for v in verdicts):
        return "held"
    if "missed" in verdicts:
        first_held = next((i for i, v in enumerate(verdicts) if v == "held"), None)
        if first_held is not None and "missed" not in verdicts[first_held:]:
            return "held_below"
        return "missed"
    return "untestable"


POINT_WORDS = {"held": "held", "missed": "MISSED", "untestable": "held as a burst", None: "FAILED"}
ENDINGS = {"held_below": ": plan below the capacity",
           "missed": ": the capacity does not carry over to traffic its search never saw",
           "untestable": ": the held-out arrivals were too short to test a rate",
           "failed": ": a point failed, see its folder"}


def answer(traffic: str, bound: str, checked: list[tuple[float, float, Optional[str]]], outcome: str) -> str:
    """The check in a sentence: on what traffic, at which rates (tasks/h), held or not."""
    if outcome == "not_run":
        return "not run: no capacity to check"
    parts = []
    for share, rate, point in checked:
        at = ("the capacity's lower bound" if bound == "at_least" else "the capacity") if share == 1 \
            else f"{share:.0%} of it"
        parts.append(f"{POINT_WORDS[point]} at {at} ({plain(rate * 3600)} tasks/h)")
    return f"on {traffic}: " + ", ".join(parts) + ENDINGS.get(outcome, "")


@dataclass(frozen=True)
class HoldoutRun:
    """A config's held-out check as the study's state holds it: its rates and their points."""

    traffic: HeldOut
    tasks: int
    """Top-level tasks of the held-out traffic."""
    rates: Rates
    points: tuple[PointResult, ...] = ()
    """The checked rates' points, in `rates.checked`'s order (the baseline's is among the config's points)."""

    def to_dict(self) -> dict[str, Any]:
        """The check as study.json holds it (`simulator.study.model.HoldoutResult`)."""
        checked = [(share, rate, point.verdict()) for (share, rate), point in zip(self.rates.checked, self.points)]
        outcome = verdict([(share, v) for share, _, v in checked])
        rows = [{"share": share, "rate_per_s": rate, "per_hour": rate * 3600, "verdict": point.verdict(),
                 "slo_met": point.figures.slo_met if point.figures else None, "status": point.status,
                 "tasks_judged": point.figures.tasks_judged if point.figures else None, "folder": point.folder}
                for (share, rate), point in zip(self.rates.checked, self.points)]
        t = self.traffic
        return {"traffic": t.traffic, "seed": t.seed, "split": t.split, "tasks": self.tasks,
                "capacity_per_s": self.rates.capacity,
                "capacity_per_hour": None if self.rates.capacity is None else self.rates.capacity * 3600,
                "bound": self.rates.bound, "baseline_per_s": self.rates.baseline, "rates": rows,
                "verdict": outcome, "answer": answer(t.traffic, self.rates.bound, checked, outcome)}
