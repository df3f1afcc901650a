"""One (config, load point, repeat) run into its own result folder, kept across restarts.

A finished point leaves study-point.json beside its records; a study started again reads it and its
summary instead of running the point again. A folder without it (a point cut off by a crash or a
Ctrl-C) or with a failed point is set aside as NAME.interrupted-N or NAME.failed-N (nothing measured is
deleted) and the point runs again. A point that fails (its server did not start or exited during it)
is recorded as failed with an error naming its config and point; the study goes on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Optional

from pydantic import BaseModel, Field, ValidationError

from ..errors import InputError
from ..metrics import results
from ..metrics.summary import Summary, load_summary
from .backends import PointError
from .figures import PointFigures, point_figures

POINT_FILE = "study-point.json"
MIN_SPAN_TASK_TIMES = 2.0
"""How many median task times a point's arrivals must last to test its offered rate (`tests_rate`)."""


@dataclass
class PointResult:
    """One point as study.json holds it (plus its figures for the study's own use)."""

    config: str
    source: str
    """'sweep', 'capacity' or 'reference'."""
    label: str
    """e.g. 'rate-0.125', 'reference'."""
    load: Optional[float]
    repeat: int
    seed: int
    folder: str
    """Relative to the study folder."""
    status: str = "ok"
    error: Optional[str] = None
    offered_rate: Optional[float] = None
    figures: Optional[PointFigures] = None
    gpu: Optional[dict[str, Any]] = None
    run_s: float = 0.0
    """Seconds the run itself took (the simulation, or the live replay)."""
    start_s: float = 0.0
    """Seconds spent starting (and warming up) the config's server before the point."""
    overhead_s: float = 0.0
    """Seconds the study spent on the point besides the run and any server start."""
    extra: dict[str, Any] = field(default_factory=dict)
    resumed: bool = False
    """Read back from a previous run of the study, not run now."""

    @property
    def ok(self) -> bool:
        """The point ran and its figures were read."""
        return self.status == "ok" and self.figures is not None

    def tests_rate(self) -> Optional[bool]:
        """Whether the point's arrivals lasted long enough to test its offered rate as a sustained one:
        at least `MIN_SPAN_TASK_TIMES` times its tasks' median completion time (the load on a server
        builds up over about one task time; a shorter stream of arrivals is a burst). None without an
        offered rate (a closed loop) or figures."""
        if self.offered_rate is None or self.figures is None:
            return None
        return self.figures.arrival_span_s >= MIN_SPAN_TASK_TIMES * self.figures.task_p50_s

    def verdict(self) -> Optional[str]:
        """'held' (every SLO target held, at a rate the point tested), 'missed', 'untestable' (held, but as
        a burst: `tests_rate`), or None (no SLO, or the point failed)."""
        if not self.ok or self.figures.slo_met is None:
            return None
        if not self.figures.slo_met:
            return "missed"
        return "untestable" if self.tests_rate() is False else "held"

    def sustained_tasks_per_hour(self) -> Optional[float]:
        """Completed tasks per hour the server sustains at this load: at a point that held the SLO at a
        rate it tested, the offered rate times the share of judged tasks completed (a finite run's own
        throughput also counts the tail after its last arrival, which long tasks make long); in a closed
        loop, the run's own throughput; otherwise (the SLO missed, or a burst) None: the point shows no
        sustainable rate."""
        f = self.figures
        assert f is not None
        if self.offered_rate is None:
            return f.throughput_tasks_per_hour
        if self.verdict() != "held":
            return None
        judged = f.tasks_completed + f.tasks_not_completed
        return self.offered_rate * 3600 * (f.tasks_completed / judged if judged else 0.0)

    def describe(self) -> str:
        """How errors name the point."""
        return f"config {self.config}, {self.source} point {self.label}, repeat {self.repeat}"

    def to_dict(self) -> dict[str, Any]:
        """The point in study.json."""
        out = {"load": self.load, "repeat": self.repeat, "seed": self.seed, "source": self.source,
               "folder": self.folder, "status": self.status, "error": self.error,
               "offered_rate_per_s": self.offered_rate}
        out.update(self.figures.to_dict() if self.figures else {})
        if self.figures is not None:
            out.update(verdict=self.verdict(), tests_rate=self.tests_rate(),
                       sustained_tasks_per_hour=self.sustained_tasks_per_hour())
        out.update(self.extra)
        out.update({"gpu": self.gpu, "run_s": self.run_s, "overhead_s": self.overhead_s})
        return out


class PointFile(BaseModel):
    """study-point.json: what a finished point leaves beside its records, for a study started again to
    read back (its figures come from the folder's summary). Keys it does not know are ignored."""

    status: Literal["ok", "failed"]
    error: Optional[str] = None
    config: str
    source: str
    label: str
    repeat: int
    seed: int
    offered_rate: Optional[float] = None
    """Top-level tasks per second the point's arrivals were sent at (None: a closed loop)."""
    run_s: float = 0.0
    gpu: Optional[dict[str, Any]] = None
    extra: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def of(cls, point: PointResult) -> PointFile:
        """What `point` leaves."""
        return cls(status=point.status, error=point.error, config=point.config, source=point.source,
                   label=point.label, repeat=point.repeat, seed=point.seed, offered_rate=point.offered_rate,
                   run_s=point.run_s, gpu=point.gpu, extra=point.extra)

    def write(self, folder: Path) -> None:
        """Write the file into the point's `folder`."""
        results.write_json(folder, POINT_FILE, self.model_dump())

    @classmethod
    def read(cls, folder: Path) -> Optional[PointFile]:
        """The file of the point's `folder`, or None when it has none; `InputError` naming the file and
        the field when it is not a study-point.json."""
        data = results.read_json(folder, POINT_FILE)
        if data is None:
            return None
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(part) for part in error["loc"]) or None
            raise InputError(f"not a study point's file: {error['msg']}", file=str(Path(folder) / POINT_FILE),
                             path=where, field=str(error["loc"][-1]) if error["loc"] else None) from None


RunFn = Callable[[Path], Summary]
"""Runs the point into the folder and returns its summary; sets the point's `run_s` and `start_s`."""


def run_point(point: PointResult, study_dir: Path, run: RunFn, figures_of: Callable[[Path, Summary], PointFigures]) -> PointResult:
    """Run `point` (or read it back when its folder holds it finished); fills status, figures, timings."""
    started = time.perf_counter()
    folder = study_dir / point.folder
    kept = PointFile.read(folder) if folder.is_dir() else None
    if kept is not None and kept.status == "ok":
        point.run_s, point.gpu, point.extra = kept.run_s, kept.gpu, kept.extra
        if "offered_rate" in kept.model_fields_set:
            point.offered_rate = kept.offered_rate
        point.figures = figures_of(folder, load_summary(folder))
        point.overhead_s, point.resumed = time.perf_counter() - started, True
        return point
    if folder.exists():
        _set_aside(folder, "failed" if kept is not None else "interrupted")
    try:
        point.figures = figures_of(folder, run(folder))
    except PointError as exc:
        point.status, point.error = "failed", f"{point.describe()}: {exc}"
        if (folder / results.SUMMARY_FILE).exists():  # what it measured before it failed, kept
            point.figures = figures_of(folder, load_summary(folder))
    point.overhead_s = max(0.0, time.perf_counter() - started - point.run_s - point.start_s)
    folder.mkdir(parents=True, exist_ok=True)
    PointFile.of(point).write(folder)
    return point


def _set_aside(folder: Path, why: str) -> None:
    """Rename an unfinished point's folder to NAME.WHY-N (the first N free)."""
    n = 1
    while (aside := folder.with_name(f"{folder.name}.{why}-{n}")).exists():
        n += 1
    try:
        folder.rename(aside)
    except OSError as exc:
        raise InputError(f"cannot set aside an unfinished point: {exc.strerror}", file=str(folder)) from None


def standard_figures(slo: Any, max_failed_share: float) -> Callable[[Path, Summary], PointFigures]:
    """The figures function of a study: its SLO and the failed share it allows."""
    return lambda folder, summary: point_figures(folder, summary, slo, max_failed_share)
