"""A study's independent points as Ray tasks (`agentload study --ray`).

A point is independent when nothing it runs against is shared with the config's other points: a twin
config's points (each a simulation of its own), and the built-in emulator's (each point starts an
emulator of its own). A launched server's or an existing URL's points share that one server, and a
point measured while another loads the same server would measure both: they run one after another
here. Capacity probes stay here too: each probe's rate follows from the ones before it.

Each point runs in its worker as it would here (`run_job`: read back when finished before, set aside
when unfinished, recorded as failed on a `PointError`), writing into the study folder, which every Ray
node must therefore see at the same path (a local cluster, or a shared file system).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from ..scale import connect as ray_connect
from ..scale import ray_module
from .configs import Config
from .gpu import GpuSampler
from .points import PointResult, run_point


@dataclass
class PointJob:
    """One point and everything it needs to run (it must pickle to go to a Ray worker)."""

    result: PointResult
    """Filled in by `run_job`."""
    study_dir: Path
    backend: Any
    """The config's TwinBackend or LiveBackend."""
    scenario: Any
    workload: Any
    figures_of: Callable
    sampler: Optional[GpuSampler] = None


def independent(config: Config, sampler: Optional[GpuSampler]) -> bool:
    """Whether `config`'s points can run at once: a twin, or the built-in emulator (one per point),
    and no GPU sampled (one sampler cannot time overlapping points)."""
    return sampler is None and (not config.live or config.kind == "emulator")


def run_job(job: PointJob) -> PointResult:
    """Run the job's point (or read it back); its result, with timings, status and figures."""
    result, backend, sampler = job.result, job.backend, job.sampler

    def execute(folder: Path):
        began = time.perf_counter()
        try:
            backend.ensure()
        finally:
            result.start_s = time.perf_counter() - began
        if sampler is not None:
            sampler.start()
        began = time.perf_counter()
        try:
            return backend.run_point(job.scenario, job.workload, folder)
        finally:
            result.run_s = time.perf_counter() - began
            if sampler is not None:
                result.gpu = sampler.stop().to_dict()

    return run_point(result, job.study_dir, execute, job.figures_of)


def run_jobs(jobs: list[PointJob]) -> list[PointResult]:
    """Run the jobs as Ray tasks at once; their results in the jobs' order. A task that raised or whose
    worker died gives its point as failed, with the error (as a `PointError` here does)."""
    from ..scale.points import map_points  # noqa: PLC0415 - imports Ray's helpers only when used

    outcomes = map_points(run_job, jobs)
    out = []
    for job, outcome in zip(jobs, outcomes):
        if outcome.ok:
            out.append(outcome.value)
        else:
            point = job.result
            point.status, point.error = "failed", f"{point.describe()}: on Ray: {outcome.error.splitlines()[0]}"
            out.append(point)
    return out


def prefetch(make_runner: Callable[[], Any], configs: list[Config]) -> list[str]:
    """A config space's batch at once: one Ray task per twin config, which runs the config's points one
    after another in its worker (a capacity search's probes follow from each other) into the study
    folder, where the study's runner then reads them back as it reads back any finished point (so the
    study is the same as without Ray). `make_runner()` makes a runner of the study in the worker. The
    errors of the tasks that raised, whose configs' points then run here."""
    from ..scale.points import map_points  # noqa: PLC0415 - imports Ray's helpers only when used

    outcomes = map_points(_simulate, [(make_runner, config) for config in configs])
    return [f"{config.name}: {outcome.error.splitlines()[0]}" for config, outcome in zip(configs, outcomes)
            if not outcome.ok]


def _simulate(job: tuple[Callable[[], Any], Config]) -> None:
    make_runner, config = job
    make_runner().simulate_candidate(config)


def connect(address: str) -> Callable[[], None]:
    """Connect to the Ray cluster at `address` ('': RAY_ADDRESS, a local `ray start`, else a new local
    one) for the whole study; returns what disconnects (nothing when already connected)."""
    ray = ray_module("--ray")
    connected = ray_connect(ray, address or None)
    return ray.shutdown if connected else (lambda: None)
