"""A simulation's coverage (`simulator.metrics.summary.Coverage`) in words: what `agentload simulate`
prints and the report shows under `TITLE`, from the numbers summary.json holds."""

from __future__ import annotations

from typing import Optional

from ..metrics.summary import RangeCoverage, SimulationStats
from .cells import number

LABELS = {
    "prompt_tokens": "prompt tokens",
    "cached_share": "cached share of the prompt",
    "running_calls": "calls in the engine",
    "burst_calls": "calls sent together",
    "output_tokens": "output tokens",
}
"""How the text names each dimension of the calibrated region."""
TITLE = "calibrated region"


def coverage_lines(simulation: SimulationStats) -> list[str]:
    """The coverage in the console's words: `TITLE` and `coverage_parts`, the second part on a line of
    its own."""
    first, *rest = coverage_parts(simulation)
    return [f"{TITLE}: {first}"] + [f"  {part}" for part in rest]


def coverage_parts(simulation: SimulationStats) -> list[str]:
    """The share of the calls outside the calibrated region (or why there is none to tell), and when some
    are outside, each dimension they leave, how many and how far: one part or two."""
    cover = simulation.coverage
    if cover is None:
        why = "the profile is uncalibrated" if not simulation.calibrated else "its calibration recorded none"
        return [f"not known ({why}), so no coverage of the calls"]
    if not cover.calls:
        return ["no call done in the measurement window to hold against it"]
    if not cover.outside:
        return [f"all {cover.calls:,} calls inside what the calibration measured"]
    parts = []
    for name, dimension in cover.dimensions.items():
        sides = [text for text in (_side(dimension, "below"), _side(dimension, "above")) if text]
        if sides:
            parts.append(f"{LABELS.get(name, name)} {' and '.join(sides)}")
    return [f"{percent(cover.outside)} of the {cover.calls:,} calls outside what the calibration measured",
            "; ".join(parts)]


def _side(dimension: RangeCoverage, side: str) -> Optional[str]:
    """The calls below or above one dimension's range: their share, the bound, and how far past it."""
    share = getattr(dimension, f"{side}_share")
    if not share:
        return None
    bound = dimension.low if side == "below" else dimension.high
    median, furthest = getattr(dimension, f"{side}_median"), getattr(dimension, f"{side}_max")
    if dimension.measure == "difference":
        bound_text = percent(bound)
        sign = "-" if side == "below" else "+"
        by = [f"{sign}{100 * v:,.2f} points" for v in (median, furthest)]
    else:
        bound_text = number(bound)
        by = [f"{v:,.2f}x" for v in (median, furthest)]
    under = " under" if side == "below" else ""
    return f"{percent(share)} {side} {bound_text} (median {by[0]}{under}, up to {by[1]})"


def percent(share: float) -> str:
    """A share in percent with one decimal, or as many more as keep a share between 0 and 1 from reading
    as 0% or 100%."""
    decimals = 1
    while 0 < share < 1 and round(100 * share, decimals) in (0, 100) and decimals < 12:
        decimals += 1
    return f"{100 * share:.{decimals}f}%"
