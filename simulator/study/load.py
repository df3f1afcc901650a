"""Load points: a value on one axis, applied to the study's workload and run settings.

- ``rate``: top-level tasks per second. The workload's arrivals are rescaled (`transforms.rate_scale`,
  compress mode: the same tasks in the same order, burst shapes kept) so that its mean rate is the
  value; the warm-up, cool-down and duration are rescaled with them, so every rate counts the same tasks.
- ``rate_scale``: the same, as a factor of the workload's own rate.
- ``max_in_flight``: the most top-level tasks running at once (closed-loop concurrency); arrivals as
  the workload has them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..errors import InputError
from ..scenario import RunSpec
from ..transforms import rate_scale
from ..workload import Workload

AXIS_UNITS = {"rate": "tasks/s", "rate_scale": "x", "max_in_flight": "tasks in flight"}


@dataclass(frozen=True)
class LoadPoint:
    """A value on an axis."""

    axis: str
    value: float

    def label(self) -> str:
        """The point's folder name, e.g. ``rate-0.125`` (six significant digits)."""
        return f"{self.axis}-{self.value:.6g}"


@dataclass(frozen=True)
class Loaded:
    """A workload and run settings with a load point applied."""

    workload: Workload
    run: RunSpec
    offered_rate: Optional[float]
    """Top-level tasks per second arriving (None: set by the closed loop)."""


def apply(workload: Workload, run: RunSpec, point: LoadPoint, rate0: Optional[float]) -> Loaded:
    """The workload and run settings at `point`; `rate0` is the workload's own rate (`transforms.task_rate`)."""
    if point.axis == "max_in_flight":
        return Loaded(workload, run.model_copy(update={"max_in_flight": int(point.value)}), rate0)
    if rate0 is None:
        raise InputError(f"load axis {point.axis} needs arrivals spread over time, but every task of the workload "
                         "arrives at once (a closed-loop workload: use axis max_in_flight)", path="load.axis")
    factor = point.value / rate0 if point.axis == "rate" else point.value
    if factor == 1.0:
        return Loaded(workload, run, rate0)
    t0 = min(t.arrival for t in workload.tasks)

    def rescaled(t: Optional[float]) -> Optional[float]:
        return None if t is None else (t0 + (t - t0) / factor if t > t0 else t)

    update = {"warmup": rescaled(run.warmup), "cooldown": run.cooldown / factor, "duration": rescaled(run.duration)}
    return Loaded(rate_scale(workload, factor, "compress"), run.model_copy(update=update), rate0 * factor)
