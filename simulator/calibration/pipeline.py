"""One calibration from end to end, as `agentload calibrate` and a study's twin calibration run it: the
sweep measured (on a live server, or on the twin), the points the fit can use, the fit, the server's
drift over the sweep's rounds, and the calibrated profile with its report."""

from __future__ import annotations

import asyncio
import statistics
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from ..live.client import Target
from ..sim.profile import ServerProfile
from .drift import round_speeds, rounds_text, speed_trend
from .fit import FitResult, fit
from .on_server import measure_sweep
from .on_twin import measure_on_twin
from .region import region_of
from .report import fit_report
from .sweep import SweepPoint
from .usable import UsableSweep, usable_sweep


@dataclass(frozen=True)
class Measurements:
    """What measuring a sweep gave: each point's value in every round (None where it was missed), and
    why each miss (by point index)."""

    samples: list[list[Optional[float]]]
    missed: dict[int, list[str]]


SweepMeasure = Callable[[list[SweepPoint]], Measurements]
"""Measures the sweep's points: a live server (`on_server`) or the twin (`on_twin`)."""


def on_twin(profile: ServerProfile) -> SweepMeasure:
    """The sweep measured on the twin of `profile`: one round, exact, nothing missed."""
    return lambda points: Measurements([[measure_on_twin(point, profile)] for point in points], {})


def on_server(target: Target, base: ServerProfile, *, repeat: int,
              on_round: Optional[Callable[[int], None]] = None,
              on_missed: Optional[Callable[[int, int, str], None]] = None) -> SweepMeasure:
    """The sweep measured on `target` (a server set up as `base` says) in `repeat` shuffled rounds
    (`measure_sweep`, whose `on_round` and `on_missed` these are)."""
    def measure(points: list[SweepPoint]) -> Measurements:
        missed: dict[int, list[str]] = {}

        def missed_one(index: int, round_number: int, why: str) -> None:
            missed.setdefault(index, []).append(why)
            if on_missed is not None:
                on_missed(index, round_number, why)

        samples = asyncio.run(measure_sweep(target, points, block_size=base.kv_cache.block_size,
                                            scheduler=base.scheduler, repeat=repeat, on_round=on_round,
                                            on_missed=missed_one))
        return Measurements(samples, missed)

    return measure


@dataclass(frozen=True)
class MeasuredSweep:
    """A sweep measured and sorted out for the fit, with how steady the server was over its rounds."""

    samples: list[list[Optional[float]]]
    usable: UsableSweep
    speeds: list[Optional[float]]
    """Each round's time over the points' medians (`round_speeds`)."""
    trend: Optional[float]
    """Their trend from the first round to the last (`speed_trend`; None under 3 rounds)."""

    def rounds_text(self) -> str:
        """The rounds' relative times and their trend in one line."""
        return rounds_text(self.speeds, self.trend)


@dataclass(frozen=True)
class Calibration:
    """A calibration's outcome: what was measured, the fit, and the calibrated profile."""

    measured: MeasuredSweep
    result: FitResult

    @property
    def profile(self) -> ServerProfile:
        """The base profile with the fitted coefficients, its fit's record, the sweep's drift and the
        region of call shapes its measured points cover."""
        profile = self.result.profile
        region = region_of(self.measured.usable.points, profile.kv_cache.block_size)
        return profile.model_copy(update={"calibration": profile.calibration.model_copy(
            update={"drift": self.measured.trend, "region": region})})

    def report_text(self) -> str:
        """The fit's report, then the points the sweep skipped (if any)."""
        skipped = self.measured.usable.skipped_text()
        return fit_report(self.result) + (f"\n{skipped}" if skipped else "")


def calibrate(base: ServerProfile, points: Sequence[SweepPoint], measure: SweepMeasure, *,
              reduce: Callable[[list[float]], float] = statistics.median, server: Optional[str] = None,
              on_measured: Optional[Callable[[MeasuredSweep], None]] = None) -> Calibration:
    """Measure `points` with `measure`, keep those measured (each one's rounds reduced by `reduce`;
    InputError naming `server` when too little is left), tell `on_measured` what was measured (the fit
    takes a while), and fit `base`'s coefficients to it."""
    points = list(points)
    measurements = measure(points)
    usable = usable_sweep(points, measurements.samples, measurements.missed, reduce, server=server)
    speeds = round_speeds(measurements.samples)
    measured = MeasuredSweep(measurements.samples, usable, speeds, speed_trend(speeds))
    if on_measured is not None:
        on_measured(measured)
    return Calibration(measured, fit(usable.points, usable.values, base))
