"""The look shared by every figure: colours, the percentile axis of CDFs, SLO marks, and text from
traces made safe for matplotlib (a '$' in a task class would start math mode).

Figures are `matplotlib.figure.Figure`s made without pyplot, so nothing depends on a display or on
global state, and the same figure is written as SVG (inside the HTML page) and as PNG (``--png``).
"""

from __future__ import annotations

import functools
from typing import Callable, Optional, Sequence, TypeVar

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter, NullLocator

from ..metrics.slo import PERCENTILE_KEYS
from ..metrics.summary import TargetCheck
from .cells import number, significant

PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#8C6D31", "#000000",
           "#7F7F7F", "#F0E442")
"""Okabe and Ito's colour-blind-safe colours, then a few more."""

PART_COLOURS = {"ttft": "#D55E00", "decode": "#E69F00", "gaps": "#56B4E9", "client_lag": "#CC79A7",
                "other": "#A0A0A0"}
GOOD, BAD = "#009E73", "#C0392B"

STYLE = {
    "font.size": 9.0,
    "axes.titlesize": 10.0,
    "axes.titleweight": "bold",
    "axes.labelsize": 9.0,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#E3E3E3",
    "grid.linewidth": 0.6,
    "legend.fontsize": 8.0,
    "legend.frameon": False,
    "svg.fonttype": "none",
    "axes.axisbelow": True,
    "figure.dpi": 100,
    "axes.formatter.limits": (-30, 30),  # plain numbers on every linear axis: no 1e5, no offset
    "axes.formatter.useoffset": False,
}

PERCENTILE_TICKS = (0.0, 0.5, 0.9, 0.99, 0.999, 0.9999, 0.99999)


def colour(i: int) -> str:
    """The i-th colour of the palette (cycling)."""
    return PALETTE[i % len(PALETTE)]


def plain(text: object) -> str:
    """Text from a trace or a server as matplotlib should show it: literally (no math mode)."""
    return str(text).replace("$", r"\$")


F = TypeVar("F", bound=Callable[..., object])


def in_style(build: F) -> F:
    """Run a figure builder (or a writer) with the report's style in force: matplotlib reads most
    settings when an artist is made, and the SVG font setting when the figure is saved."""

    @functools.wraps(build)
    def wrapper(*args: object, **kwargs: object) -> object:
        with matplotlib.rc_context(STYLE):
            return build(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def new_figure(width: float, height: float) -> Figure:
    """An empty figure (constrained layout); call it inside `in_style`."""
    return Figure(figsize=(width, height), layout="constrained")


def subplots(figure: Figure, ncols: int = 1, nrows: int = 1, **kwargs: object) -> list[Axes]:
    """The figure's subplots as a flat list of axes."""
    return list(figure.subplots(nrows, ncols, squeeze=False, **kwargs).ravel())


def _tail(p: np.ndarray) -> np.ndarray:
    return -np.log10(np.clip(1.0 - p, 1e-7, 1.0))


def _untail(y: np.ndarray) -> np.ndarray:
    return 1.0 - np.power(10.0, -np.asarray(y, dtype=np.float64))


def percentile_axis(ax: Axes, top: float) -> None:
    """Make the y axis show percentiles with the tail stretched (50, 90, 99, 99.9 % equally spaced),
    up to the percentile `top` (below 1)."""
    ax.set_yscale("function", functions=(_tail, _untail))
    ticks = [p for p in PERCENTILE_TICKS if p <= top + 1e-12]
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_yticklabels([f"{100 * p:g}%" for p in ticks])
    ax.set_ylim(0.0, top)


def _tick(value: float, _pos: object = None) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else significant(value, 4)


def percent_ticks(ax: Axes) -> None:
    """The y axis labelled in plain percentages ('0.5%', '40%')."""
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _pos=None: f"{_tick(value)}%"))


def log_axis(ax: Axes, limits: Optional[tuple[float, float]]) -> None:
    """A log x axis over `limits`, labelled in plain numbers: at 1, 2 and 5 of each decade over a
    short range, at each decade over a long one."""
    ax.set_xscale("log")
    if limits is None:
        return
    low, high = limits
    decades = np.log10(high / low)
    subs = tuple(range(1, 10)) if decades <= 1.2 else (1.0, 2.0, 5.0) if decades <= 3 else (1.0,)
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=subs))
    ax.xaxis.set_major_formatter(FuncFormatter(_tick))
    # minor ticks only where the major ones are a decade apart (each tick is costly to lay out)
    ax.xaxis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)) if decades > 3 else NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlim(low, high)


def plain_ticks(ax: Axes, x: bool = True, y: bool = True) -> None:
    """Axes labelled in plain numbers with thousands separated (no offset, no 1e5): the y axis unless
    `y` is False, and the x axis unless `x` is False."""
    if x:
        ax.xaxis.set_major_formatter(FuncFormatter(_tick))
    if y:
        ax.yaxis.set_major_formatter(FuncFormatter(_tick))


def log_yaxis(ax: Axes) -> None:
    """A log y axis over what is drawn, labelled in plain numbers: at 1 to 9 of each decade over a
    short range, at 1, 2 and 5 over a longer one."""
    ax.set_yscale("log")
    low, high = ax.get_ylim()
    decades = np.log10(high / low) if low > 0 else 3.0
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=tuple(range(1, 10)) if decades <= 1.2 else (1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(_tick))
    ax.yaxis.set_minor_formatter(NullFormatter())


def cdf_limits(curves: list[tuple[np.ndarray, np.ndarray]], marks: Sequence[float] = ()) -> Optional[tuple[float, float]]:
    """The x range of CDFs on a log axis: from a fiftieth of the lowest median (a few near-zero values,
    such as gaps of chunks that came together, sit at the left edge instead of stretching the axis
    over decades) to past the highest value and every SLO bound in `marks`."""
    curves = [(v, p) for v, p in curves if v.size]
    if not curves:
        return None
    medians = [values[min(np.searchsorted(shares, 0.5), values.size - 1)] for values, shares in curves]
    low = max(min(values[0] for values, _ in curves), min(medians) / 50)
    high = max([values[-1] for values, _ in curves] + list(marks))
    low = max(low, 1e-9)
    return low / 1.15, max(high * 1.15, low * 2)


def tail_top(total: int) -> float:
    """The highest percentile worth showing for `total` values: 99% up to 100 values, 99.9% up to
    1000, and so on (at most 99.999%)."""
    digits = min(5, max(2, int(np.ceil(np.log10(max(total, 2))))))
    return 1.0 - 10.0 ** -digits


def draw_cdf(ax: Axes, values: np.ndarray, shares: np.ndarray, top: float, **style: object) -> None:
    """One CDF as a step line on a percentile axis whose top is `top`."""
    if values.size == 0:
        return
    y = np.minimum(np.concatenate([[0.0], shares]), top)
    x = np.concatenate([[values[0]], values])
    ax.step(x, y, where="post", **style)


def slo_bounds(check: Optional[TargetCheck]) -> list[float]:
    """The bounds of an SLO target (empty without one)."""
    return [item.bound for item in check.percentiles.values()] if check is not None else []


def slo_marks(ax: Axes, check: Optional[TargetCheck], unit: str, top: float, verdict: bool = True,
              whose: str = "") -> None:
    """Each percentile bound of an SLO target: a dashed line at the bound and a diamond at
    (bound, percentile), green when met and red when missed; grey and without a verdict when `verdict`
    is False (a class's panel: the verdict is of all tasks). `whose`: the folder the verdict is of, when
    several are drawn."""
    if check is None:
        return
    for key, item in check.percentiles.items():
        p = PERCENTILE_KEYS.get(key)
        if p is None:
            continue
        p = min(p / 100, top)
        tone = (GOOD if item.met else BAD) if verdict else "#7F7F7F"
        said = ("met" if item.met else "missed") if verdict else "the verdict is of all tasks"
        ax.axvline(item.bound, color=tone, linestyle="--", linewidth=0.9, alpha=0.7)
        ax.plot([item.bound], [p], marker="D", color=tone, markersize=5, linestyle="none", clip_on=False,
                label=f"SLO {key} ≤ {number(item.bound)} {unit} ({whose + ' ' if whose and verdict else ''}{said})")


def window_shading(ax: Axes, start: float, end: Optional[float], span: tuple[float, float]) -> None:
    """Grey out the time outside the measurement window (warm-up, cool-down)."""
    if start > span[0]:
        ax.axvspan(span[0], start, color="#000000", alpha=0.06, linewidth=0)
    if end is not None and end < span[1]:
        ax.axvspan(end, span[1], color="#000000", alpha=0.06, linewidth=0)
