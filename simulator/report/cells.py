"""Cells that show a figure of a result file: the value read by its path of keys, and its text in a
format that keeps every digit a reader needs (never an ellipsis, never a cut number)."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any, Mapping, Optional, Sequence, Union

from .page import Cell


Key = Union[str, int]
"""A key of a mapping, or the index of a list."""


def lookup(data: Any, path: Sequence[Key]) -> Optional[float]:
    """The number at `path` in nested mappings and lists, or None when a key is missing or it is no
    number."""
    value = data
    for key in path:
        if isinstance(value, list) and isinstance(key, int) and 0 <= key < len(value):
            value = value[key]
        elif isinstance(value, Mapping) and key in value:
            value = value[key]
        else:
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value


BOUND_SIGNS = {"exact": "", "at_least": "≥ ", "at_most": "≤ "}
"""What a figure that only bounds the value is shown with (`Objective.bound`)."""
NOISE = 5e-13
"""Below this (in the figure's own unit) a value is float noise, such as the difference of two equal
figures (7.11e-15 for 0), and shows as 0."""


def significant(value: float, digits: int = 3) -> str:
    """`value` in fixed point (never 1e-07) to `digits` significant digits, trailing zeros dropped."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    text = f"{value:,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def number(value: Optional[float], unit: str = "") -> str:
    """A number for a reader, never in scientific notation: thousands separated, whole from 100 on,
    3 significant digits below (0.000000868, not 8.68e-07); float noise below `NOISE` is 0."""
    if value is None:
        return "-"
    if isinstance(value, int) and not isinstance(value, bool):
        text = f"{value:,}"
    elif not math.isfinite(value):
        text = str(value)
    elif abs(value) < NOISE:
        text = "0"
    elif abs(value) >= 100 or float(value).is_integer():
        text = f"{value:,.0f}"
    elif abs(value) >= 10:
        text = f"{value:.1f}"
    elif abs(value) >= 1:
        text = f"{value:.2f}"
    else:
        text = significant(value)
    return f"{text} {unit}" if unit else text


def figure(data: Mapping[str, Any], path: Sequence[Key], *, unit: str = "", scale: float = 1.0,
           folder: int = 0, tone: str = "") -> Cell:
    """A cell showing the figure at `path` of `data` (summary.json or study.json), times `scale`."""
    value = lookup(data, path)
    if value is None:
        return Cell("-")
    shown = value * scale
    text = f"{shown:.1f}%" if unit == "%" else number(shown, unit)
    return Cell(text, value=value, source=tuple(path), folder=folder, scale=scale, tone=tone)


DEVIATION = 0.10
"""How far from 1 a ratio between folders is highlighted (neutrally: a difference worth a look, not a
verdict; one run per folder cannot tell a difference between servers from run-to-run noise)."""


def band_range(low: Optional[float], high: Optional[float]) -> str:
    """A band as every view writes it after its figure: '[2.18–2.73]'."""
    return f"[{number(low)}–{number(high)}]"


def band_offsets(value: float, low: float, high: float) -> tuple[str, str]:
    """How far a band's ends lie from its figure, relative, as every view shows them ('-15%', '+29%');
    ('-', '-') for a figure of 0."""
    if not value:
        return "-", "-"
    return f"{low / value - 1:+.0%}", f"{high / value - 1:+.0%}"


def ratio_text(r: float) -> str:
    """A ratio to three decimals (to three significant digits below 0.1, so that none reads 0.000)."""
    return f"{r:,.3f}" if abs(r) >= 0.1 else number(r)


def deviates(r: Optional[float]) -> bool:
    """Whether a ratio is more than `DEVIATION` from 1."""
    return r is not None and abs(r - 1) > DEVIATION


def ratio(value: Optional[float], reference: Optional[float]) -> Cell:
    """value / reference, highlighted (tone 'mark', no good or bad) when it is more than `DEVIATION`
    from 1."""
    if value is None or not reference:
        return Cell("-")
    r = value / reference
    return Cell(ratio_text(r), value=r, tone="mark" if deviates(r) else "")


def started(iso: object) -> str:
    """run.json's start time to the second, or '-'."""
    if not iso:
        return "-"
    try:
        return datetime.fromisoformat(str(iso)).strftime("%Y-%m-%d %H:%M:%S %Z").strip()
    except ValueError:
        return str(iso)
