"""The figures of a study: goodput against offered load per config with capacity markers and their
confidence intervals, p95 task time against load with the task SLO, cost per task, and the twin's
predictions against the measurements."""

from __future__ import annotations

from collections import defaultdict
from typing import Optional

import numpy as np
from matplotlib.axes import Axes
from matplotlib.ticker import MaxNLocator

from . import plots
from .page import Chart
from .study import OBJECTIVE_NAMES, ConfigResult, Point, Study


LOAD_SOURCES = ("sweep", "capacity")
"""Points that sit on the load axis (the fixed-shape reference run does not)."""


def _on_axis(config: ConfigResult) -> list[Point]:
    return [p for p in config.points if p.source in LOAD_SOURCES]


def _x(study: Study) -> tuple[str, bool]:
    """The x axis of the load plots: offered task rate per hour when every measured point has it
    (then capacities can be drawn on it), else the sweep's own axis."""
    points = [p for c in study.configs for p in _on_axis(c) if p.status == "ok"]
    if points and all(p.offered_rate_per_s is not None for p in points):
        return "offered task rate (tasks/hour)", True
    return study.axis_title(), False


def _xy(points: list[Point], offered: bool, key: str) -> tuple[np.ndarray, np.ndarray]:
    pairs = [((p.offered_per_hour if offered else p.load), getattr(p, key)) for p in points
             if p.status == "ok" and getattr(p, key) is not None and (p.offered_per_hour if offered else p.load) is not None]
    if not pairs:
        return np.empty(0), np.empty(0)
    arr = np.asarray(pairs, dtype=np.float64)
    return arr[:, 0], arr[:, 1]


def _means(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean of the repeats at each x."""
    groups: dict[float, list[float]] = defaultdict(list)
    for xi, yi in zip(x.tolist(), y.tolist()):
        groups[round(xi, 9)].append(yi)
    keys = sorted(groups)
    return np.asarray(keys), np.asarray([np.mean(groups[k]) for k in keys])


def _draw_points(ax: Axes, config: ConfigResult, i: int, offered: bool, key: str) -> None:
    """A config's sweep (dots for repeats, a line through their means), its capacity probes (open
    circles) and its failed points (red crosses at the foot of the axes)."""
    colour = plots.colour(i)
    sweep = [p for p in config.points if p.source == "sweep"]
    x, y = _xy(sweep, offered, key)
    if x.size:
        ax.plot(x, y, "o", color=colour, alpha=0.35, markersize=4)
        mx, my = _means(x, y)
        ax.plot(mx, my, "-o", color=colour, linewidth=1.6, markersize=4, label=plots.plain(config.name))
    px, py = _xy([p for p in config.points if p.source == "capacity"], offered, key)
    if px.size:
        ax.plot(px, py, "o", markerfacecolor="none", markeredgecolor=colour, markersize=6, alpha=0.8)
    failed = [p for p in _on_axis(config) if p.status == "failed"]
    fx = [v for v in ((p.offered_per_hour if offered else p.load) for p in failed) if v is not None]
    if fx:
        # at the foot of the axes whatever its scale: a failed point has no value
        ax.plot(fx, [0.0] * len(fx), "x", color=plots.BAD, markersize=7, markeredgewidth=1.8, clip_on=False,
                transform=ax.get_xaxis_transform())


@plots.in_style
def goodput_chart(study: Study) -> Optional[Chart]:
    """Goodput (tasks/hour within the task SLO) against load, one line per config (the mean of the
    repeats, each repeat a faint dot), capacity probes as open circles, failed points as red crosses,
    and each config's capacity with its confidence interval."""
    if not any(p.goodput_tasks_per_hour is not None or p.status == "failed" for c in study.configs for p in _on_axis(c)):
        return None
    xlabel, offered = _x(study)
    fig = plots.new_figure(10.0, 4.6)
    (ax,) = plots.subplots(fig)
    for i, config in enumerate(study.configs):
        _draw_points(ax, config, i, offered, "goodput_tasks_per_hour")
        cap = config.capacity
        if offered and cap is not None and cap.per_hour is None and cap.status == "above_range" and cap.at_least_per_s:
            ax.axvline(cap.at_least_per_s * 3600, color=plots.colour(i), linestyle=":", linewidth=1.1)
            ax.text(cap.at_least_per_s * 3600, 0.98, plots.plain(f" {config.name}: ≥ {cap.at_least_per_s * 3600:,.0f}"),
                    rotation=90, va="top", ha="right", fontsize=7.5, color=plots.colour(i),
                    transform=ax.get_xaxis_transform())
        if offered and cap is not None and cap.per_hour is not None:
            if cap.ci_per_hour is not None:
                ax.axvspan(*cap.ci_per_hour, color=plots.colour(i), alpha=0.12, linewidth=0)
            ax.axvline(cap.per_hour, color=plots.colour(i), linestyle="--", linewidth=1.1)
            ax.text(cap.per_hour, 0.98, plots.plain(f" {config.name}: {cap.per_hour:,.0f}"), rotation=90,
                    va="top", ha="right", fontsize=7.5, color=plots.colour(i), transform=ax.get_xaxis_transform())
    highest = max([p.goodput_tasks_per_hour or 0.0 for c in study.configs for p in _on_axis(c)] + [1.0])
    if offered:
        top = max([p.offered_per_hour or 0.0 for c in study.configs for p in _on_axis(c)] + [1.0])
        ax.plot([0, top], [0, top], ":", color="#888888", linewidth=1.0, label="every offered task within the SLO")
    _load_axis(ax, study, offered)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("goodput: tasks/hour within the task SLO")
    ax.set_ylim(0, highest * 1.15)  # the measured goodput, not the ideal line, sets the scale
    ax.legend(loc="upper left")
    caption = ("Each line is a config (mean of its repeats; dots are single repeats, open circles the capacity "
               "search's probes, red crosses failed points)."
               + (" Dashed: the capacity found within the SLO, shaded: its confidence interval." if offered else ""))
    return Chart("study-goodput", "Goodput against load", fig, caption)


def _load_axis(ax: Axes, study: Study, offered: bool) -> None:
    """A log x axis when the loads span more than a factor of 20 (a geometric sweep), else linear;
    plain numbers either way."""
    loads = [v for c in study.configs for p in _on_axis(c) for v in [p.offered_per_hour if offered else p.load]
             if v is not None and v > 0]
    if loads and max(loads) / min(loads) > 20:
        plots.log_axis(ax, (min(loads) / 1.3, max(loads) * 1.3))
        plots.plain_ticks(ax, x=False)
    else:
        plots.plain_ticks(ax)


def _slo_lines(ax: Axes, study: Study) -> None:
    task = (study.slo or {}).get("task_s") or {}
    for key, bound in task.items():
        if isinstance(bound, (int, float)) and not isinstance(bound, bool):
            ax.axhline(bound, color=plots.BAD, linestyle="--", linewidth=0.9, label=f"task SLO {key} ≤ {bound:g} s")


@plots.in_style
def task_time_chart(study: Study) -> Optional[Chart]:
    """p95 task completion time against load per config, with the task SLO's bounds."""
    if not any(p.task_p95_s for c in study.configs for p in _on_axis(c)):
        return None
    xlabel, offered = _x(study)
    fig = plots.new_figure(10.0, 4.0)
    (ax,) = plots.subplots(fig)
    for i, config in enumerate(study.configs):
        _draw_points(ax, config, i, offered, "task_p95_s")
    _slo_lines(ax, study)
    plots.log_yaxis(ax)
    _load_axis(ax, study, offered)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("p95 task completion time (s)")
    ax.legend(loc="upper left")
    return Chart("study-task-time", "Task time against load", fig,
                 "p95 of task completion time at each point; the task SLO's bounds dashed.")


@plots.in_style
def cost_chart(study: Study) -> Optional[Chart]:
    """Dollars per completed task, self-hosted and through an API, per config."""
    rows = [(c.name, c.cost) for c in study.configs if c.cost is not None
            and (c.cost.self_hosted_per_task is not None or c.cost.api_per_task is not None)]
    if not rows:
        return None
    fig = plots.new_figure(10.0, 1.3 + 0.55 * len(rows))
    (ax,) = plots.subplots(fig)
    ax.grid(axis="y", visible=False)
    y = np.arange(len(rows))[::-1]
    for offset, key, label, colour in ((0.18, "self_hosted_per_task", "self-hosted", "#0072B2"),
                                       (-0.18, "api_per_task", "API route", "#E69F00")):
        values = np.array([getattr(cost, key) or 0.0 for _, cost in rows])
        bars = ax.barh(y + offset, values, height=0.34, color=colour, label=label)
        ax.bar_label(bars, labels=[f"${v:,.4g}" if getattr(cost, key) is not None else "" for v, (_, cost)
                                   in zip(values, rows)], padding=3, fontsize=7.5)
    ax.set_yticks(y, [plots.plain(name) for name, _ in rows])
    ax.set_xlabel("US dollars per completed task")
    ax.margins(x=0.15)
    ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncols=2)
    return Chart("study-cost", "Cost per completed task", fig,
                 "Self-hosted: GPU dollars per hour times GPUs over the tasks completed per hour at the "
                 "utilisation measured; API route: the same tasks' tokens at the API's prices.")


@plots.in_style
def twin_chart(study: Study) -> Optional[Chart]:
    """The twin's predicted objective of each config against the measured one."""
    pairs = [(i, c.twin.predicted_value, c.objective.value) for i, c in enumerate(study.configs)
             if c.twin is not None and c.twin.predicted_value is not None and c.objective.value is not None]
    if not pairs:
        return None
    unit = next((c.objective.unit for c in study.configs if c.objective.unit), "")
    fig = plots.new_figure(7.5, 4.6)
    (ax,) = plots.subplots(fig)
    for i, predicted, measured in pairs:
        ax.plot([predicted], [measured], "D", color=plots.colour(i), markersize=8, markeredgecolor="black",
                label=plots.plain(study.configs[i].name))
    every = [v for _, x, y in pairs for v in (x, y)]
    low, high = min(every + [0.0]), max(every) * 1.08 or 1.0
    ax.plot([low, high], [low, high], ":", color="#888888", label="prediction = measurement")
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.set_aspect("equal", adjustable="box")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(MaxNLocator(5))
    plots.plain_ticks(ax)
    label = plots.plain(OBJECTIVE_NAMES.get(study.objective, study.objective) + (f" ({unit})" if unit else ""))
    ax.set_xlabel(f"predicted by the twin: {label}")
    ax.set_ylabel(f"measured: {label}")
    ax.legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=8)
    return Chart("study-twin", "Twin predicted against measured", fig,
                 "Each config's objective as the twin predicted it and as the live runs measured it; on the dotted "
                 "line the twin was exact.")
