"""A study from start to end: each config in turn (the base first) with its server started once, its
quality probes, its reference run, its sweep and its capacity search; then the twin's prediction of the
live configs and the config space.

What the study has done is a `StudyState` (`simulator.study.state`), never changed once made: the runner
keeps the latest and makes a new one at each step (a config started, a point finished, a capacity
found). It hands the state to the caller's `emit` after every config and at the end (also when
stopped); the caller writes study.json from it (`simulator.study.result.build`).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Optional, Union

from .. import scenario as scenario_mod
from ..calibration.drift import drift_warning
from ..errors import InputError
from ..metrics import results
from ..metrics.slo import Slo
from ..redact import mask_url
from ..pipeline.plan import RunPlan, plan_run
from ..sim.band import DEFAULT_DRAWS
from ..sim.profile import ServerProfile, load_profile
from ..workload import Workload
from . import calibration, fan_out, feasible, holdout, quality
from . import search as space_search
from .backends import LiveBackend, PointError, TwinBackend
from .fleet_backend import FleetLiveBackend
from .capacity import Capacity, combine, search
from .configs import Config, resolve, resolve_profile
from .gpu import GpuSampler, open_sampler
from .load import LoadPoint, apply
from .points import PointResult, standard_figures
from .prepare import Workloads, check, reference_scenario, study_scenario, target_fields
from .model import TwinBand
from .ranking import order_of, plain
from .result import objective_values
from .schema import StudySpec
from .space import Candidate, candidates, live_config, server_args, twin_config
from .twin_band import config_band
from .state import ConfigRun, Group, SpaceRun, StudyState, WorkloadFacts

Backend = Union[TwinBackend, LiveBackend, FleetLiveBackend]
KEY_FILE = "study-key.json"
Emit = Callable[[StudyState], None]
"""What receives the study's state after every config and at the end (the study.json writer)."""


class StudyRunner:
    """Runs a study into `folder`; `say` gets one line per event (a point done, a server started)."""

    def __init__(self, spec: StudySpec, folder: Path, *, twin_only: bool = False, ray: Optional[str] = None,
                 say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
                 band_draws: int = DEFAULT_DRAWS) -> None:
        self.spec = spec
        self.band_draws = band_draws
        """Draws of the twin's band at each twin config's ranking points (0: no band; `twin_band`)."""
        self.ray = ray
        """Ray cluster address for independent points ('': the default one); None: every point here."""
        self.folder = Path(folder)
        self.say = say
        self.scenario = study_scenario(spec)
        self.held_out, self._holdout_note = holdout.held_out(spec, self.scenario)
        self.workloads: Workloads = holdout.workloads(self.scenario, self.held_out)
        configs = resolve(spec)
        self.configs: tuple[Config, ...] = tuple(self._as_twin(configs) if twin_only else configs)
        """The configs to run, in order (the space's chosen live configs added once it ran)."""
        self.target = target_fields(spec, self.scenario)
        max_failed = spec.capacity.max_failed_share if spec.capacity else 0.01
        self.max_growth = spec.capacity.max_growth if spec.capacity else None
        self.figures = standard_figures(self.scenario.slo, max_failed)
        self.reference_figures = standard_figures(Slo(), max_failed)  # a fixed-shape run is held to no SLO
        self.calibrated: Optional[ServerProfile] = None
        self._reference: Optional[Workload] = None
        self.started_at = time.time()
        self._state: Optional[StudyState] = None

    @property
    def state(self) -> StudyState:
        """What the study has done so far (made when `run` starts)."""
        assert self._state is not None, "the study has not started"
        return self._state

    # --- the whole study ---------------------------------------------------------------------------

    def run(self, emit: Emit) -> StudyState:
        """Run every config, then the twin's prediction; `emit(state)` after each config and at the end
        (also when stopped). Returns the last state."""
        _, workload, rate0 = self.workloads.get(0)
        check(self.spec, self.scenario, rate0)
        space_search.check(self.spec)
        self._claim_folder()
        tasks, calls, subtasks = workload.counts()
        self._state = StudyState(
            spec=self.spec, folder=self.folder, slo=self.scenario.slo,
            workload=WorkloadFacts(self.scenario.source or "", tasks, calls, subtasks, rate0),
            configs=self.configs, notes=tuple(self.spec.notes) + ((self._holdout_note,) if self._holdout_note else ()),
            started_at=self.started_at,
            twin_profile=self.twin_profile_source())
        disconnect = fan_out.connect(self.ray) if self.ray is not None else None
        try:
            queue = list(self.configs)
            while queue:
                config = queue.pop(0)
                self.run_config(config, "points", "runs")
                if config.is_base and self.spec.space is not None:
                    extra = self.run_space(config)
                    self.configs += tuple(extra)
                    self._state = replace(self.state, configs=self.configs)
                    queue += extra
                emit(self.state)
            if self.spec.twin is not None and any(c.live for c in self.configs):
                self.predict()
            self._state = replace(self.state, complete=True, finished_at=time.time())
        finally:
            if disconnect is not None:
                disconnect()
            emit(self.state)
        return self.state

    def _claim_folder(self) -> None:
        """Make the study folder, or check that the one there holds this same study (a resumed run)."""
        definition = json.dumps({"study": holdout.definition(self.spec),
                                 "scenario": self.scenario.model_dump(mode="json")}, sort_keys=True)
        key = {"fingerprint": hashlib.sha256(definition.encode()).hexdigest(), "study_file": self.spec.source}
        kept = results.read_json(self.folder, KEY_FILE) if self.folder.is_dir() else None
        if kept is not None and kept.get("fingerprint") != key["fingerprint"]:
            raise InputError("the study folder holds a study of another definition (the study file or its scenario "
                             "changed): give another folder with -o", file=str(self.folder))
        if kept is None and self.folder.is_dir() and any(self.folder.iterdir()):
            raise InputError("the folder is not empty and holds no study: give another with -o", file=str(self.folder))
        self.folder.mkdir(parents=True, exist_ok=True)
        results.write_json(self.folder, KEY_FILE, key)

    def _as_twin(self, configs: list[Config]) -> list[Config]:
        """The configs on the twin (`--twin`): each as the twin profile plus its overlay; live configs
        with no twin equivalent are left out."""
        default = resolve_profile(self.spec.twin.profile, self.spec.base_dir()) if self.spec.twin else None
        out = []
        for c in configs:
            if not c.live:
                out.append(c)
            elif c.has_twin_change:
                out.append(c.on_twin(default))
            else:
                self.say(f"{c.name}: left out on the twin: it changes only {c.differs_by}, which no profile setting says")
        if not default and any(not c.live and c.profile is None for c in out):
            raise InputError("--twin needs twin.profile (the profile live configs are on the twin)",
                             file=self.spec.source, path="twin.profile")
        return out

    # --- one config --------------------------------------------------------------------------------

    def backend(self, config: Config) -> Backend:
        """The backend that runs `config`'s points."""
        if not config.live:
            return TwinBackend(config.twin_profile(None, self.spec.source), config.fleet)
        if config.fleet is not None:
            defaults = self.spec.target.model_dump(exclude_none=True) if self.spec.target else None
            return FleetLiveBackend(config, defaults, self.folder)
        warmup = quality.probe_requests(self.workloads.get(0)[1], self.spec.warmup_calls) if self.spec.warmup_calls else ()
        return LiveBackend(config, self.target, self.folder, warmup)

    def run_config(self, config: Config, root: str, group: Group, *, quality_check: bool = True,
                   reference: bool = True) -> ConfigRun:
        """Every point of `config` (its server started once, stopped at the end), put in the state's
        `group` from the start so that a study stopped midway still reports the points it has."""
        name = config.name
        self._state = self.state.with_run(group, ConfigRun(config))
        backend = self.backend(config)
        sampler, gpu_note = open_sampler(self.spec.gpu) if backend.live else (None, "twin: no GPU")
        self._change(group, name, gpu_note=gpu_note)
        spec = self.spec
        try:
            if backend.live and spec.quality is not None and quality_check:
                self._change(group, name, quality=self.quality_check(config, backend))
            if config.is_base and backend.live and spec.twin is not None and spec.twin.calibrate:
                self.calibrate(backend)
            planned = [("reference", None, 0)] if spec.reference is not None and reference else []
            if spec.load is not None:
                planned += [("sweep", LoadPoint(spec.load.axis, value), repeat)
                            for value in spec.load.values() for repeat in range(spec.repeats)]
            if self.ray is not None and fan_out.independent(config, sampler):
                self.fan_out(group, config, backend, root, planned)
            else:
                for source, load, repeat in planned:
                    self.point(group, config, backend, root, source, load, repeat, sampler)
            if spec.capacity is not None:
                self._change(group, name, capacity=self.capacity(group, config, backend, root, sampler))
                if self.held_out is not None and group == "runs":
                    self._change(group, name, holdout=self.holdout_check(group, config, backend, root, sampler))
            if isinstance(backend, TwinBackend) and group != "space" and self.band_draws > 0:
                self._change(group, name, band=self.twin_band(group, config, backend, root))
        finally:
            backend.close()
            if sampler is not None:
                sampler.close()
            self._change(group, name, server=backend.server_info())
        points = self.state.group(group)[name].points
        failed = [p for p in points if p.status != "ok"]
        if failed:
            self._change(group, name, error=f"{len(failed)} of {len(points)} points failed; first: {failed[0].error}")
        return self.state.group(group)[name]

    def twin_band(self, group: Group, config: Config, backend: TwinBackend, root: str) -> TwinBand:
        """The band of a twin config at its ranking points, each point's plan simulated again on profiles
        drawn from the calibration's fit (`simulator.study.twin_band`); a fleet has none (the band draws
        one server's simulations)."""
        if backend.fleet is not None:
            return TwinBand(note="no band: the twin's band simulates one server, not a fleet")

        def plan_of(point: PointResult) -> RunPlan:
            axis = "rate" if point.source == "capacity" or self.spec.load is None else self.spec.load.axis
            job = self.point_job(config, backend, root, point.source, LoadPoint(axis, point.load), point.repeat, None)
            return plan_run(job.scenario, job.workload, self.folder / point.folder)

        band = config_band(self.spec, self.scenario.slo, self.state.group(group)[config.name], backend.profile,
                           plan_of, self.folder, self.band_draws)
        if band.banded:
            self.say(f"{'twin ' if root.startswith('twin') else ''}{config.name}: twin's band of {band.label} "
                     f"{band.where}: {plain(band.low)}–{plain(band.high)} ({band.points} point(s), "
                     f"1 + {band.draws} simulations each)")
        return band

    def _change(self, group: Group, name: str, **changes: Any) -> None:
        """The state with fields of config `name`'s run in `group` changed."""
        self._state = self.state.with_config_run(group, name, **changes)

    def capacity(self, group: Group, config: Config, backend: Backend, root: str,
                 sampler: Optional[GpuSampler]) -> Capacity:
        """The capacity search, one per repeat."""
        cap = self.spec.capacity
        assert cap is not None
        searches = []
        for repeat in range(cap.repeats or self.spec.repeats):
            def probe(rate: float, repeat: int = repeat) -> Optional[str]:
                point = self.point(group, config, backend, root, "capacity", LoadPoint("rate", rate), repeat, sampler)
                return point.verdict()
            searches.append(search(probe, cap.low, cap.high or cap.low * 4, cap.precision, cap.max_probes, repeat,
                                   min_rate=cap.min_rate if cap.min_rate is not None else cap.low / 16))
        return combine(searches, self.spec.confidence)

    def holdout_check(self, group: Group, config: Config, backend: Backend, root: str,
                      sampler: Optional[GpuSampler]) -> holdout.HoldoutRun:
        """The config's capacity run on the held-out traffic, at each share of it (`simulator.study.holdout`);
        the points judged as the search's probes are, in the order they run (growth against the lower rates)."""
        traffic = self.held_out
        assert traffic is not None
        capacity = self.state.group(group)[config.name].capacity
        assert capacity is not None
        rates = holdout.rates(traffic, capacity, self.max_growth is not None and bool(self.scenario.slo.task_s))
        jobs = [self.point_job(config, backend, root, holdout.SOURCE, LoadPoint("rate", rate), traffic.repeat, sampler,
                               folder=traffic.folder(root, config.name, LoadPoint("rate", rate).label()))
                for rate in rates.run_order()]
        at_once = fan_out.run_jobs(jobs) if jobs and self.ray is not None and fan_out.independent(config, sampler) else None
        by_rate = {}
        for k, job in enumerate(jobs):
            result = at_once[k] if at_once is not None else fan_out.run_job(job)
            self.finish_point(group, config.name, result, LoadPoint("rate", result.load))
            self.say(_progress(result))
            by_rate[result.load] = result
        check = holdout.HoldoutRun(traffic, len(self.workloads.get(traffic.repeat)[1].tasks), rates,
                                   tuple(by_rate[rate] for _, rate in rates.checked))
        self.say(f"{config.name}: held-out check {check.to_dict()['answer']}")
        return check

    def point(self, group: Group, config: Config, backend: Backend, root: str, source: str,
              load: Optional[LoadPoint], repeat: int, sampler: Optional[GpuSampler]) -> PointResult:
        """Run one point (or read it back), add it to the config's run and say how it went."""
        job = self.point_job(config, backend, root, source, load, repeat, sampler)
        fan_out.run_job(job)
        self.finish_point(group, config.name, job.result, load)
        self.say(("twin " if root.startswith("twin") else "") + _progress(job.result))
        return job.result

    def fan_out(self, group: Group, config: Config, backend: Backend, root: str,
                planned: list[tuple[str, Optional[LoadPoint], int]]) -> None:
        """Run the planned points as Ray tasks at once; added to the config's run in the planned order
        (and judged in it) as when they run here, so study.json is the same."""
        jobs = [self.point_job(config, backend, root, source, load, repeat, None) for source, load, repeat in planned]
        results = fan_out.run_jobs(jobs)
        for (_, load, _), result in zip(planned, results):
            self.finish_point(group, config.name, result, load)  # the growth verdict needs the points before it
            self.say(("twin " if root.startswith("twin") else "") + _progress(result))

    def point_job(self, config: Config, backend: Backend, root: str, source: str, load: Optional[LoadPoint],
                  repeat: int, sampler: Optional[GpuSampler], folder: Optional[str] = None) -> fan_out.PointJob:
        """Everything one point needs to run, here or in a Ray worker (in `folder`, default
        ROOT/CONFIG/LABEL/rREPEAT)."""
        scenario, workload, rate0 = self.workloads.get(repeat)
        offered: Optional[float] = None
        if load is None:
            scenario = reference_scenario(scenario, self.spec)
            workload = self.reference_workload(scenario)
            label = "reference"
        else:
            loaded = apply(workload, scenario.run, load, rate0)
            scenario = scenario.model_copy(update={"run": loaded.run})
            workload, offered, label = loaded.workload, loaded.offered_rate, load.label()
        name = config.name
        result = PointResult(name, source, label, load.value if load else None, repeat, self.workloads.seed(repeat),
                             folder or f"{root}/{name}/{label}/r{repeat}", offered_rate=offered)
        return fan_out.PointJob(result, self.folder, backend, scenario, workload,
                                self.figures if load is not None else self.reference_figures, sampler)

    def finish_point(self, group: Group, name: str, result: PointResult, load: Optional[LoadPoint]) -> None:
        """Judge a finished point's growth against the config's points before it, then add it to them."""
        if load is not None and result.figures is not None and self.max_growth is not None and self.scenario.slo.task_s:
            self._judge_growth(self.state.group(group)[name].points, result, load.axis)
        self._state = self.state.with_point(group, name, result, self.workloads.api_tokens(result.repeat))

    def _judge_growth(self, before: tuple[PointResult, ...], point: PointResult, axis: str) -> None:
        """The growth check of `point` against the config's lowest-load point of the same repeat and axis
        run before it (none: the SLO's targets alone decide)."""
        lower = [p for p in before if p.ok and p.repeat == point.repeat and p.load is not None
                 and p.label.startswith(f"{axis}-") and p.load < point.load]
        if not lower:
            return
        baseline = min(lower, key=lambda p: p.load)
        slo = self.scenario.slo
        point.figures.judge_growth(baseline.figures, baseline.load, slo.task_s.item_bound() if slo.task_s else None,
                                   self.max_growth)

    def reference_workload(self, scenario: scenario_mod.Scenario) -> Workload:
        """The reference run's fixed-shape workload (made once)."""
        if self._reference is None:
            self._reference = scenario_mod.load_workload(scenario)
        return self._reference

    # --- quality, calibration, twin, space ------------------------------------------------------------

    def quality_check(self, config: Config, backend: LiveBackend) -> dict[str, Any]:
        """The probes on `config`'s server (kept in quality/NAME.json), compared with the base's."""
        spec = self.spec.quality
        assert spec is not None
        if config.kind == "emulator":
            return quality.unmeasured("n/a", "the built-in emulator generates no model output")
        if config.fleet is not None:
            return quality.unmeasured("n/a", "a fleet's outputs are its replicas': check them on one replica's config")
        path = self.folder / "quality" / f"{config.name}.json"
        outputs = quality.read(path)
        if outputs is None:
            try:
                backend.ensure()
                target = backend.client_target()
                assert target is not None
                requests = quality.probe_requests(self.workloads.get(0)[1], spec.probes)
                outputs = asyncio.run(quality.run_probes(target, requests, spec, self.workloads.seed(0)))
            except (PointError, quality.ProbeError) as exc:
                return quality.unmeasured("failed", f"config {config.name}, quality probes: {exc}")
            quality.save(path, outputs)
        if config.is_base:
            return {"status": "base", "reason": None, "probes": len(outputs), "identical_share": 1.0,
                    "mean_common_prefix_tokens": float(self.spec.quality.max_tokens), "mean_abs_logprob_delta": 0.0,
                    "note": None}
        base = next(c for c in self.configs if c.is_base)
        base_outputs = quality.read(self.folder / "quality" / f"{base.name}.json")
        if base_outputs is None:
            return quality.unmeasured("n/a", "the base config's probes did not run", len(outputs))
        return quality.compare(base_outputs, outputs, spec)

    def calibrate(self, backend: LiveBackend) -> None:
        """Calibrate the twin profile on the base's server (once; kept in calibration/)."""
        twin = self.spec.twin
        assert twin is not None
        folder = self.folder / "calibration"
        self.calibrated = calibration.saved(folder)
        if self.calibrated is not None:
            self._calibrated()
            return
        try:
            backend.ensure()
        except PointError as exc:
            self.say(f"twin calibration skipped: {exc}")
            return
        target = backend.client_target()
        assert target is not None
        base = load_profile(resolve_profile(twin.profile, self.spec.base_dir()))
        began = time.perf_counter()
        self.calibrated = calibration.calibrate(target, base, folder, repeat=twin.calibrate_repeat,
                                                max_prompt=twin.calibrate_max_prompt)
        self._calibrated()
        self.say(f"twin calibrated on {mask_url(target.base_url)} in {time.perf_counter() - began:.1f} s: {folder}")
        drift = self.calibrated.calibration.drift if self.calibrated.calibration else None
        warning = drift_warning(drift)
        if warning:
            self.say(f"warning: {warning}; raise twin.calibrate_repeat, or calibrate on a quieter machine")

    def _calibrated(self) -> None:
        """The state with the calibrated profile as the twin's."""
        self._state = replace(self.state, twin_profile=self.twin_profile_source(), calibrated=True)

    def twin_profile_source(self) -> Optional[str]:
        """The profile live configs are on the twin: the calibrated one, else twin.profile."""
        if self.calibrated is not None:
            return str(self.folder / "calibration" / calibration.PROFILE_FILE)
        return resolve_profile(self.spec.twin.profile, self.spec.base_dir()) if self.spec.twin else None

    def predict(self) -> None:
        """Each live config with a twin equivalent run on the twin (twin/NAME/...)."""
        source = self.twin_profile_source()
        for config in self.configs:
            if not config.live or not config.has_twin_change or config.name not in self.state.runs:
                continue
            twin = config.on_twin(source)
            self.run_config(twin, "twin", "twin_runs", quality_check=False, reference=False)

    def run_space(self, base: Config) -> list[Config]:
        """Search the config space on the twin (every combination of a grid, or a Bayesian search:
        `simulator.study.search`); the live configs of its best `top_k` (none on a twin base)."""
        space = self.spec.space
        assert space is not None
        profile = resolve_profile(space.profile, self.spec.base_dir()) if space.profile else None
        profile = profile or self.twin_profile_source() or base.profile
        if profile is None:
            raise InputError("a config space needs a twin profile: space.profile or twin.profile",
                             file=self.spec.source, path="space.profile")
        if space.method == "grid":
            self._state = replace(self.state, space=SpaceRun(profile, tuple(candidates(space))))
            self.evaluate_space(base, profile, list(self.state.space.candidates))
        else:
            self._state = replace(self.state, space=SpaceRun(profile, (), method=space.method))
            if self.ray is not None and space.batch == 1:
                self.say("note: space.batch is 1: with --ray the search still runs one candidate at a time "
                         "(give space.batch the candidates to run at once)")
            space_search.run(space, space_search.objectives_of(self.spec),
                             lambda batch: self.evaluate_space(base, profile, batch), self.folder, asked=self._asked)
        searched = self.state.space
        top, front = self._chosen(searched)
        self._state = replace(self.state, space=replace(searched, top=top, front=front))
        if not base.live:
            return []
        chosen = [c for c in searched.candidates if c.name in top]
        # a candidate that adds no flag is the base's server as it is: the base's run measures it
        as_base = {c.name: base.name for c in chosen if not server_args(c, space, self.spec.source)}
        extra = [live_config(c, base, space, self.spec.source) for c in chosen if c.name not in as_base]
        live = {**as_base, **{c.name: c.name for c in extra}}
        self._state = replace(self.state, space=replace(self.state.space, live=live))
        return extra

    def evaluate_space(self, base: Config, profile: str, batch: list[Candidate]) -> list[space_search.Outcome]:
        """Each candidate of `batch` on the twin: one the server would not start recorded as infeasible,
        never simulated (`simulator.study.feasible`); the others' points run (with --ray, the batch's
        candidates at once). Their outcomes, as the search reads them."""
        configs, refused = [], {}
        for candidate in batch:
            config = twin_config(candidate, base, profile)
            _, infeasible = feasible.profile_of(profile, config.overlay)
            self._state = replace(self.state, space=self.state.space.with_candidate(
                candidate, infeasible.reason if infeasible is not None else None))
            if infeasible is not None:
                refused[candidate.name] = infeasible
                self.say(f"twin {candidate.name}: infeasible, not simulated: {infeasible.reason}")
            else:
                configs.append(config)
        if self.ray is not None and len(configs) > 1:
            for error in fan_out.prefetch(functools.partial(StudyRunner, self.spec, self.folder, say=_quiet), configs):
                self.say(f"on Ray: {error}: the point(s) run here")
        for config in configs:
            self.run_config(config, "twin/space", "space", quality_check=False, reference=False)
        objectives = space_search.objectives_of(self.spec)
        runs = self.state.space.runs
        out = []
        for candidate in batch:
            if candidate.name in refused:
                out.append(space_search.Outcome(infeasible=refused[candidate.name]))
                continue
            values = tuple(objective_values(self.spec, {candidate.name: runs[candidate.name]}, o)[candidate.name].value
                           for o in objectives)
            out.append(space_search.Outcome(values=None if any(v is None for v in values) else values))
        return out

    def simulate_candidate(self, config: Config) -> None:
        """Run a space candidate's points into the study folder and nothing else: a Ray worker's share of a
        batch, whose points the study's own runner then reads back (`fan_out.prefetch`)."""
        self._state = StudyState(spec=self.spec, folder=self.folder, slo=self.scenario.slo,
                                 workload=WorkloadFacts("", 0, 0, 0, None), configs=(), notes=(),
                                 started_at=self.started_at, space=SpaceRun("", ()))
        self.run_config(config, "twin/space", "space", quality_check=False, reference=False)

    def _asked(self, candidate: Candidate) -> None:
        """A search's trial: its candidate's name added to the space's trials."""
        self._state = replace(self.state, space=replace(self.state.space, trials=self.state.space.trials + (candidate.name,)))

    def _chosen(self, searched: SpaceRun) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(the candidates that run live, the Pareto front): the best `top_k` by the objective as for the
        study's own configs; with several objectives, the front's `top_k` best by the first."""
        space = self.spec.space
        assert space is not None
        objectives = space_search.objectives_of(self.spec)
        values = {o: objective_values(self.spec, searched.runs, o) for o in objectives}
        first = objectives[0]
        if len(objectives) == 1:
            return tuple(order_of({n: v.value for n, v in values[first].items()}, first)[:space.top_k]), ()
        front = space_search.pareto_front({n: [values[o][n].value for o in objectives] for n in searched.runs}, objectives)
        front = order_of({n: values[first][n].value for n in front}, first)
        return tuple(front[:space.top_k]), tuple(front)


def _quiet(line: str) -> None:
    """A Ray worker's runner says nothing (the study's own runner says what it reads back)."""


def _progress(point: PointResult) -> str:
    """One line about a finished point."""
    head = f"{point.config}: {point.source} {point.label} r{point.repeat}"
    if not point.ok:
        return f"{head}: FAILED: {point.error}"
    f = point.figures
    verdict = point.verdict()
    slo = {None: "", "held": "  SLO held", "missed": "  SLO missed",
           "untestable": "  SLO held, but as a burst: arrivals too short to test the rate"}[verdict]
    return (f"{head}: {f.tasks_completed} tasks, {f.throughput_tasks_per_hour:,.1f} tasks/h, "
            f"task p95 {f.task_p95_s:,.2f} s, TTFT p95 {f.ttft_p95_ms:,.1f} ms, "
            f"{f.output_tokens_per_s:,.1f} tok/s{slo}  ({point.run_s:.1f} s)")
