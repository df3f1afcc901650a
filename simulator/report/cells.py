"""Cells that show a figure of a result file: the value read by its path of keys, and its text in a
format that keeps every digit a reader needs (never an ellipsis, never a cut number)."""

from __future__ import annotations

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


def number(value: Optional[float], unit: str = "") -> str:
    """A number for a reader: thousands separated, 3 significant digits below 100, whole above."""
    if value is None:
        return "-"
    if isinstance(value, int) or float(value).is_integer() and abs(value) >= 1:
        text = f"{value:,.0f}"
    elif abs(value) >= 100:
        text = f"{value:,.0f}"
    elif abs(value) >= 10:
        text = f"{value:.1f}"
    elif abs(value) >= 1:
        text = f"{value:.2f}"
    elif value == 0:
        text = "0"
    else:
        text = f"{value:.3g}" if abs(value) >= 1e-4 else f"{value:.2e}"
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


def ratio(value: Optional[float], reference: Optional[float], higher_is_better: Optional[bool]) -> Cell:
    """value / reference, toned good or bad by more than 5% in the figure's better direction."""
    if value is None or not reference:
        return Cell("-")
    r = value / reference
    tone = ""
    if higher_is_better is not None and abs(r - 1) > 0.05:
        tone = "good" if (r > 1) == higher_is_better else "bad"
    return Cell(f"{r:.3f}", value=r, tone=tone)


def started(iso: object) -> str:
    """run.json's start time to the second, or '-'."""
    if not iso:
        return "-"
    try:
        return datetime.fromisoformat(str(iso)).strftime("%Y-%m-%d %H:%M:%S %Z").strip()
    except ValueError:
        return str(iso)
