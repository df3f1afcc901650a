"""How steady the server was over a live sweep: each round's time relative to the points' medians, their
trend from the first round to the last, and what is said about them."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ..sim.uncertainty import DRIFT_WARNING


def round_speeds(samples: Sequence[Sequence[Optional[float]]]) -> list[Optional[float]]:
    """Each round's time relative to the points' medians (the median over points of a round's
    measurement over its point's median, missed measurements left out): 1.0 everywhere when the server
    kept its speed, a trend when it drifted over the sweep (other work on its CPUs, a shared host's
    neighbours); None for a round that measured nothing."""
    rounds = max((len(s) for s in samples), default=0)
    ratios = np.full((len(samples), rounds), np.nan)
    for row, measured in zip(ratios, samples):
        values = np.array([np.nan if v is None else v for v in measured], dtype=float)
        if np.isfinite(values).any():
            row[:len(values)] = values / np.nanmedian(values)
    speeds = []
    for column in ratios.T:
        taken = column[np.isfinite(column)]
        speeds.append(float(np.median(taken)) if taken.size else None)
    return speeds


def rounds_text(speeds: Sequence[Optional[float]], trend: Optional[float]) -> str:
    """The rounds' relative times and their trend in one line, as `calibrate` prints them."""
    return ("rounds' times over the points' medians: " + "  ".join("n/a" if v is None else f"{v:.3f}" for v in speeds)
            + f" (trend {trend_text(trend)})")


def trend_text(trend: Optional[float]) -> str:
    """A `speed_trend` as text ('n/a' without one)."""
    return "n/a" if trend is None else f"{trend:+.1%}"


def drift_warning(trend: Optional[float]) -> Optional[str]:
    """What a trend past DRIFT_WARNING means (None within it, or without a trend)."""
    if trend is None or abs(trend) <= DRIFT_WARNING:
        return None
    return (f"the server's speed drifted {trend:+.1%} over the sweep (other work on its CPUs, a shared "
            "host's neighbours): each point's median mixes speeds, and terms that few points tell apart "
            "can move by more")


def speed_trend(speeds: Sequence[Optional[float]]) -> Optional[float]:
    """The change of the rounds' times from the first round to the last along their least-squares line
    (−0.08: the server ran 8% faster by the end), over the rounds that measured something; None with
    fewer than 3 of them, too few for a trend."""
    rounds = [k for k, v in enumerate(speeds) if v is not None]
    if len(rounds) < 3:
        return None
    slope, intercept = np.polyfit(rounds, [speeds[k] for k in rounds], 1)
    return float(slope * (len(speeds) - 1) / intercept)
