"""What a study has done so far, as one immutable value: `StudyState`.

The runner (`simulator.study.runner`) holds the latest state and hands each new one to whoever writes
study.json; `simulator.study.result.build` turns a state into study.json and reads nothing else. Every
change makes a new state (`with_run`, `with_point`, ...); a state once made never changes, so a writer
may keep one while the study goes on.

The parts a state holds are made before it takes them and never changed after: a `PointResult` is
filled in while it runs and judged (its queue growth) before it is added; a run's `quality` and
`server` dicts are the runner's, put in whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, Mapping, Optional

from ..metrics.slo import Slo
from .capacity import Capacity
from .configs import Config
from .figures import TaskTokens
from .holdout import HoldoutRun
from .model import TwinBand
from .points import PointResult
from .schema import StudySpec
from .space import Candidate

Group = Literal["runs", "twin_runs", "space"]
"""Where a config's run sits: the study's own configs, their twin prediction, the config space."""


def _frozen(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class ConfigRun:
    """What one config did in the study."""

    config: Config
    points: tuple[PointResult, ...] = ()
    """In the order they finished (planned order for points run at once on Ray)."""
    capacity: Optional[Capacity] = None
    holdout: Optional[HoldoutRun] = None
    """The capacity run on traffic its search never saw (`simulator.study.holdout`)."""
    quality: Optional[dict[str, Any]] = None
    """The quality probes' comparison with the base (`quality.compare`)."""
    server: Optional[dict[str, Any]] = None
    """What the backend says of its server once stopped (`server_info`)."""
    gpu_note: Optional[str] = None
    error: Optional[str] = None
    band: Optional[TwinBand] = None
    """On the twin: the band at its ranking points (`simulator.study.twin_band`)."""


@dataclass(frozen=True)
class SpaceRun:
    """The config space searched on the twin."""

    profile: str
    candidates: tuple[Candidate, ...]
    """Every candidate (a search's in the order first proposed)."""
    runs: Mapping[str, ConfigRun] = field(default_factory=lambda: _frozen({}))
    top: tuple[str, ...] = ()
    """The best `top_k` candidates by the objective (set once every candidate ran)."""
    method: str = "grid"
    infeasible: Mapping[str, str] = field(default_factory=lambda: _frozen({}))
    """Candidates the server would not start (never simulated), and why (`simulator.study.feasible`)."""
    trials: tuple[str, ...] = ()
    """A search's trials in order, each its candidate's name (a candidate proposed again, again)."""
    front: tuple[str, ...] = ()
    """With several objectives: the candidates on the Pareto front, best first by the first objective."""
    live: Mapping[str, str] = field(default_factory=lambda: _frozen({}))
    """Each of `top` run live, and the study's config that ran it: its own, or the base when its flags are
    none (the base's server as it is)."""

    def with_candidate(self, candidate: Candidate, infeasible: Optional[str] = None) -> SpaceRun:
        """This space with `candidate` among its candidates (once), and why it cannot run, if it cannot."""
        out = self
        if all(c.name != candidate.name for c in self.candidates):
            out = replace(out, candidates=self.candidates + (candidate,))
        if infeasible is not None:
            out = replace(out, infeasible=_frozen({**self.infeasible, candidate.name: infeasible}))
        return out


@dataclass(frozen=True)
class WorkloadFacts:
    """What study.json says of the workload: repeat 0's counts and rate, and each repeat's tokens
    through an API (the cost per task through one)."""

    source: str
    tasks: int
    calls: int
    subtasks: int
    base_rate_per_s: Optional[float]
    """The workload's own top-level task rate (None: every task arrives at once)."""
    api_tokens: Mapping[int, Mapping[str, TaskTokens]] = field(default_factory=lambda: _frozen({}))
    """Per repeat that has points, per task, its tokens through an API (`cost.api_tokens`)."""


@dataclass(frozen=True)
class StudyState:
    """A study at one moment: its definition, what each config ran, and whether it is done."""

    spec: StudySpec
    folder: Path
    slo: Slo
    """The scenario's SLO every point is judged by."""
    workload: WorkloadFacts
    configs: tuple[Config, ...]
    """Every config the study runs (the space's chosen live configs added once it ran)."""
    notes: tuple[str, ...]
    """What a reader of the results must know (settings that took effect)."""
    started_at: float
    """Unix time the study started."""
    runs: Mapping[str, ConfigRun] = field(default_factory=lambda: _frozen({}))
    twin_runs: Mapping[str, ConfigRun] = field(default_factory=lambda: _frozen({}))
    """The live configs' twin prediction."""
    space: Optional[SpaceRun] = None
    twin_profile: Optional[str] = None
    """The profile live configs are on the twin: the calibrated one, else twin.profile."""
    calibrated: bool = False
    """Whether `twin_profile` was calibrated on the base config's server."""
    finished_at: Optional[float] = None
    """Unix time the study finished (None until `complete`)."""
    complete: bool = False

    def group(self, group: Group) -> Mapping[str, ConfigRun]:
        """The runs of `group`."""
        if group == "space":
            assert self.space is not None, "the config space has not started"
            return self.space.runs
        return self.runs if group == "runs" else self.twin_runs

    def with_run(self, group: Group, run: ConfigRun) -> StudyState:
        """This state with `run` put in `group` (replacing that config's run there, in its place)."""
        runs = _frozen({**self.group(group), run.config.name: run})
        if group == "space":
            assert self.space is not None
            return replace(self, space=replace(self.space, runs=runs))
        return replace(self, **{group: runs})

    def with_point(self, group: Group, name: str, point: PointResult,
                   api_tokens: Optional[Mapping[str, TaskTokens]] = None) -> StudyState:
        """This state with `point` added to config `name`'s points in `group`; `api_tokens`: the point's
        repeat's tokens through an API, when the state has none for it yet."""
        run = self.group(group)[name]
        state = self.with_run(group, replace(run, points=run.points + (point,)))
        if api_tokens is not None and point.repeat not in self.workload.api_tokens:
            tokens = _frozen({**self.workload.api_tokens, point.repeat: api_tokens})
            state = replace(state, workload=replace(self.workload, api_tokens=tokens))
        return state

    def with_config_run(self, group: Group, name: str, **changes: Any) -> StudyState:
        """This state with fields of config `name`'s run in `group` changed."""
        return self.with_run(group, replace(self.group(group)[name], **changes))

    def base(self) -> Config:
        """The base config."""
        return next(c for c in self.configs if c.is_base)

    def all_points(self) -> list[PointResult]:
        """Every point of the study's configs, then of their twin prediction (not the space's)."""
        return [p for r in self.runs.values() for p in r.points] + [p for r in self.twin_runs.values() for p in r.points]
