"""What a measured sweep gives the fit: the points measured in at least one round, each one's rounds
reduced to a value, and the points no round measured, left out with why; or a clean error when too
little is left to fit."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from ..errors import InputError
from .fit import FIT_TERMS
from .sweep import SweepPoint


@dataclass(frozen=True)
class UsableSweep:
    """What a live sweep gives the fit: the points measured in at least one round, each one's value (its
    measured rounds reduced), and the points no round measured, left out, with why."""

    points: list[SweepPoint]
    values: list[float]
    skipped: list[tuple[SweepPoint, str]]
    """(point, why its measurements were missed: each distinct reason once)."""
    designed: int
    """Points of the sweep as designed."""

    def skipped_text(self) -> str:
        """The skipped points, one line each, under a line that counts them ('' when none was skipped)."""
        if not self.skipped:
            return ""
        lines = [f"skipped {len(self.skipped)} of {self.designed} points, measured in no round (left out of the fit):"]
        lines += [f"  {point.label()}: {why}" for point, why in self.skipped]
        return "\n".join(lines)


def usable_sweep(points: Sequence[SweepPoint], samples: Sequence[Sequence[Optional[float]]],
                 missed: Optional[dict[int, list[str]]] = None,
                 reduce: Callable[[list[float]], float] = statistics.median,
                 server: Optional[str] = None) -> UsableSweep:
    """The sweep's points with a measurement, each one's measured rounds reduced by `reduce`, and the
    points without any, with the reasons `missed` holds for them (by point index). InputError (naming
    the `server` measured) when too little is left to fit: fewer points than the fit has terms (or
    than the sweep had, if fewer), or no point but loaded ones (`simulator.calibration.fit.fit` needs
    others)."""
    missed = missed or {}
    kept: list[SweepPoint] = []
    values: list[float] = []
    skipped: list[tuple[SweepPoint, str]] = []
    for index, (point, measured) in enumerate(zip(points, samples)):
        taken = [v for v in measured if v is not None]
        if taken:
            kept.append(point)
            values.append(float(reduce(taken)))
        else:
            reasons = list(dict.fromkeys(missed.get(index, []))) or ["no measurement"]
            skipped.append((point, "; ".join(reasons)))
    usable = UsableSweep(kept, values, skipped, len(points))
    needed = min(len(FIT_TERMS), len(points))
    if len(kept) < needed or all(p.kind == "loaded" for p in kept):
        why = ("only loaded points were measured, and the fit needs others" if kept and len(kept) >= needed
               else f"{len(kept)} of {len(points)} points were measured and the fit needs at least {needed}")
        listed = usable.skipped_text()
        raise InputError(f"the calibration has too little left to fit: {why}" + (f"\n{listed}" if listed else ""),
                         file=server)
    return usable
