"""The figures of a study: goodput against offered load per config with its capacity on the same axis
(and its confidence interval where repeats give one), task time at the task SLO's own percentiles
against load with the SLO's bounds, cost per task on a log scale (self-hosted and API costs differ by
orders of magnitude), and the twin's predictions against the measurements."""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Optional

import numpy as np
from matplotlib.axes import Axes
from matplotlib.ticker import FuncFormatter, MaxNLocator

from . import plots
from .cells import number
from .page import Chart
from ..study.model import OBJECTIVE_NAMES, ConfigResult, Study, StudyPoint


LOAD_SOURCES = ("sweep", "capacity")
"""Points that sit on the load axis (the fixed-shape reference run does not)."""


def _on_axis(config: ConfigResult) -> list[StudyPoint]:
    return [p for p in config.points if p.source in LOAD_SOURCES]


def _x(study: Study) -> tuple[str, bool]:
    """The x axis of the load plots: offered task rate per hour when every measured point has it
    (then capacities can be drawn on it), else the sweep's own axis."""
    points = [p for c in study.configs for p in _on_axis(c) if p.status == "ok"]
    if points and all(p.offered_rate_per_s is not None for p in points):
        return "offered task rate (tasks/hour)", True
    return study.axis_title(), False


Value = Callable[[StudyPoint], Optional[float]]
"""What a chart draws of a point."""


def field(name: str) -> Value:
    """A point's figure by its study.json name."""
    return lambda p: getattr(p, name)


def _xy(points: list[StudyPoint], offered: bool, value: Value) -> tuple[np.ndarray, np.ndarray]:
    pairs = [((p.offered_per_hour if offered else p.load), value(p)) for p in points
             if p.status == "ok" and value(p) is not None and (p.offered_per_hour if offered else p.load) is not None]
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


def _draw_points(ax: Axes, config: ConfigResult, i: int, offered: bool, value: Value, label: str = "",
                 style: str = "-") -> None:
    """A config's sweep (dots for repeats, a line through their means), its capacity probes (open
    circles) and its failed points (red crosses at the foot of the axes); the legend names the config
    once, on its sweep line or (without a sweep) its probes."""
    colour = plots.colour(i)
    name = plots.plain(config.name + label)
    sweep = [p for p in config.points if p.source == "sweep"]
    x, y = _xy(sweep, offered, value)
    if x.size:
        ax.plot(x, y, "o", color=colour, alpha=0.35, markersize=4)
        mx, my = _means(x, y)
        ax.plot(mx, my, "o", linestyle=style, color=colour, linewidth=1.6, markersize=4, label=name)
    px, py = _xy([p for p in config.points if p.source == "capacity"], offered, value)
    if px.size:
        ax.plot(px, py, "o", markerfacecolor="none", markeredgecolor=colour, markersize=6, alpha=0.8,
                label=None if x.size else f"{name} (capacity probes)")
    failed = [p for p in _on_axis(config) if p.status == "failed"]
    fx = [v for v in ((p.offered_per_hour if offered else p.load) for p in failed) if v is not None]
    if fx:
        # at the foot of the axes whatever its scale: a failed point has no value
        ax.plot(fx, [0.0] * len(fx), "x", color=plots.BAD, markersize=7, markeredgewidth=1.8, clip_on=False,
                transform=ax.get_xaxis_transform())


def _capacity_line(ax: Axes, config: ConfigResult, i: int) -> None:
    """A config's capacity on the offered-rate axis, named in the legend (a lower bound dotted)."""
    cap, colour = config.capacity, plots.colour(i)
    if cap is None:
        return
    if cap.per_hour is not None:
        if cap.ci_per_hour is not None:
            ax.axvspan(*cap.ci_per_hour, color=colour, alpha=0.12, linewidth=0)
        ci = f" (CI {cap.ci_per_hour[0]:,.0f} – {cap.ci_per_hour[1]:,.0f})" if cap.ci_per_hour else " (no CI: 1 repeat)"
        ax.axvline(cap.per_hour, color=colour, linestyle="--", linewidth=1.2,
                   label=plots.plain(f"{config.name}: capacity {cap.per_hour:,.0f}/h{ci}"))
    elif cap.status == "above_range" and cap.at_least_per_s:
        ax.axvline(cap.at_least_per_s * 3600, color=colour, linestyle=":", linewidth=1.4,
                   label=plots.plain(f"{config.name}: capacity ≥ {cap.at_least_per_s * 3600:,.0f}/h (above the range tested)"))


@plots.in_style
def goodput_chart(study: Study) -> Optional[Chart]:
    """Goodput (tasks/hour within the task SLO) against the offered rate (tasks/hour), one line per
    config (the mean of the repeats, each repeat a faint dot), capacity probes as open circles, failed
    points as red crosses, and each config's capacity on the same axis: the offered rate it carries."""
    if not any(p.goodput_tasks_per_hour is not None or p.status == "failed" for c in study.configs for p in _on_axis(c)):
        return None
    xlabel, offered = _x(study)
    fig = plots.new_figure(10.0, 4.8)
    (ax,) = plots.subplots(fig)
    for i, config in enumerate(study.configs):
        _draw_points(ax, config, i, offered, field("goodput_tasks_per_hour"))
        if offered:
            _capacity_line(ax, config, i)
    highest = max([p.goodput_tasks_per_hour or 0.0 for c in study.configs for p in _on_axis(c)] + [1.0])
    if offered:
        top = max([p.offered_per_hour or 0.0 for c in study.configs for p in _on_axis(c)] + [1.0])
        ax.plot([0, top], [0, top], ":", color="#888888", linewidth=1.0, label="goodput = offered rate")
    _load_axis(ax, study, offered)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("goodput: tasks/hour within the task SLO")
    ax.set_ylim(0, highest * 1.15)  # the measured goodput, not the ideal line, sets the scale
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    caption = ("Each line is a config (mean of its repeats; dots are single repeats, open circles the capacity "
               "search's probes, red crosses failed points)."
               + (" Vertical lines: each config's capacity, the highest offered rate at which every SLO target "
                  "held (shaded: its confidence interval, where repeats give one). A run's goodput counts its "
                  "tasks within the task bound per hour of the run, the tail after its last arrival included, so it "
                  "stays below the offered rate even where the SLO held." if offered else ""))
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


def _slo_keys(study: Study) -> list[tuple[str, float]]:
    """The task SLO's percentiles and bounds ('p50', 1.5), lowest percentile first."""
    task = (study.slo or {}).get("task_s") or {}
    return [(key, float(bound)) for key, bound in task.items()
            if key != "max" and isinstance(bound, (int, float)) and not isinstance(bound, bool)]


@plots.in_style
def task_time_chart(study: Study) -> Optional[Chart]:
    """Task completion time against load per config at the percentile(s) the task SLO names, each drawn
    against its own bound (a percentile that fell among tasks that never completed marked at the top);
    without a task SLO, the p95."""
    keys = _slo_keys(study)
    if not any(p.status == "ok" for c in study.configs for p in _on_axis(c)):
        return None
    xlabel, offered = _x(study)
    fig = plots.new_figure(10.0, 4.2)
    (ax,) = plots.subplots(fig)
    styles = ("-", "--", "-.", ":")
    for i, config in enumerate(study.configs):
        if not keys:
            _draw_points(ax, config, i, offered, field("task_p95_s"), " p95")
        for k, (key, _) in enumerate(keys):
            _draw_points(ax, config, i, offered, lambda p, key=key: p.task_slo_s.get(key),
                         f" {key}" if len(keys) > 1 else "", styles[k % len(styles)])
    for k, (key, bound) in enumerate(keys):
        ax.axhline(bound, color=plots.BAD, linestyle=styles[k % len(styles)], linewidth=0.9,
                   label=f"task SLO: {key} ≤ {bound:g} s")
    unreached = [(p.offered_per_hour if offered else p.load) for c in study.configs for p in _on_axis(c)
                 for key, _ in keys if p.status == "ok" and key in p.task_slo_s and p.task_slo_s[key] is None]
    unreached = [x for x in unreached if x is not None]
    if unreached:
        ax.plot(unreached, [1.0] * len(unreached), "^", color=plots.BAD, markersize=7, clip_on=False,
                transform=ax.get_xaxis_transform(), label="percentile not reached (tasks did not complete)")
    plots.log_yaxis(ax)
    _load_axis(ax, study, offered)
    ax.set_xlabel(xlabel)
    named = " and ".join(key for key, _ in keys) or "p95"
    ax.set_ylabel(f"task completion time, {named} (s)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    caption = (f"The {named} of task completion time at each point, as the SLO check measured it (over every "
               "task meant to run; one that did not complete counts as slower than any bound), against the "
               "task SLO's bound for the same percentile." if keys else
               "p95 of task completion time at each point (the study sets no task SLO).")
    return Chart("study-task-time", "Task time against load", fig, caption)


@plots.in_style
def cost_chart(study: Study) -> Optional[Chart]:
    """Dollars per completed task, self-hosted and through an API, per config, on a log scale: the two
    often differ by orders of magnitude, and each is labelled with its value."""
    rows = [(c.name, c.cost) for c in study.configs if c.cost is not None
            and (c.cost.self_hosted_per_task is not None or c.cost.api_per_task is not None)]
    if not rows:
        return None
    fig = plots.new_figure(10.0, 1.5 + 0.55 * len(rows))
    (ax,) = plots.subplots(fig)
    y = np.arange(len(rows))[::-1]
    shown = []
    for offset, key, label, colour in ((0.15, "self_hosted_per_task", "self-hosted", "#0072B2"),
                                       (-0.15, "api_per_task", "API route", "#E69F00")):
        points = [(yi + offset, getattr(c, key)) for yi, (_, c) in zip(y, rows) if getattr(c, key)]
        if not points:
            continue
        ys, xs = zip(*points)
        shown += xs
        ax.plot(xs, ys, "o", color=colour, markersize=8, label=label)
        for yi, xi in points:
            ax.annotate(f"${number(xi)}", (xi, yi), xytext=(6, 0), textcoords="offset points", va="center",
                        fontsize=7.5)
    if not shown:
        return None
    plots.log_axis(ax, (min(shown) / 3, max(shown) * 6))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos=None: f"${number(v)}"))
    ax.set_yticks(y, [plots.plain(name) for name, _ in rows])
    ax.set_ylim(y.min() - 0.6, y.max() + 0.6)
    ax.set_xlabel("US dollars per completed task (log scale)")
    ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncols=2, frameon=False)
    return Chart("study-cost", "Cost per completed task", fig,
                 "Self-hosted: GPU dollars per hour times GPUs over the tasks completed per hour at the capacity (else "
                 "at the ranking load); API route: the same tasks' tokens at the API's prices. A log scale: each "
                 "step of the axis is ten times the last.")


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


@plots.in_style
def policy_chart(study: Study) -> Optional[Chart]:
    """The router policies side by side: each fleet config's prefix-hit share against its imbalance (the
    trade a router makes between keeping a session on the replica that holds its prefix and spreading the
    load), and its task p95 per task class beside it."""
    fleets = [(i, c) for i, c in enumerate(study.configs) if c.fleet is not None]
    traded = [(i, c) for i, c in fleets if c.fleet.imbalance is not None and c.fleet.prefix_hit_share is not None]
    classes = sorted({name for _, c in fleets for name in c.fleet.by_class})
    timed = [(i, c) for i, c in fleets if any(t.task_p95_s is not None for t in c.fleet.by_class.values())]
    if not traded and not timed:
        return None
    fig = plots.new_figure(11.0, 2.4 + 0.45 * max(len(fleets), 4))
    left, right = plots.subplots(fig, ncols=2)
    markers = "osD^vP*Xph"
    for k, (i, c) in enumerate(traded):
        f = c.fleet
        # configs of similar trade sit on one another: each its own marker, named in the legend
        left.plot([f.imbalance], [100 * f.prefix_hit_share], markers[k % len(markers)], color=plots.colour(i),
                  markersize=9, markeredgecolor="black", alpha=0.85, label=plots.plain(c.name))
    left.axvline(1.0, color="#888888", linestyle=":", linewidth=1.0)
    if traded:
        left.legend(loc="lower left", bbox_to_anchor=(0.0, 1.02), ncols=3, fontsize=7.5, frameon=False)
    left.set_xlabel("imbalance: most calls on one replica / mean (1: even)")
    left.set_ylabel("prefix-cache hit share (%)")
    left.margins(x=0.25, y=0.15)
    plots.plain_ticks(left)
    y = np.arange(len(timed))[::-1]
    height = 0.8 / max(len(classes), 1)
    for k, name in enumerate(classes):
        values = [c.fleet.by_class[name].task_p95_s if name in c.fleet.by_class else None for _, c in timed]
        ys = [yi + (k - (len(classes) - 1) / 2) * height for yi in y]
        shown = [(yi, v) for yi, v in zip(ys, values) if v is not None]
        if shown:
            right.barh([s[0] for s in shown], [s[1] for s in shown], height=height * 0.9, color=plots.colour(k),
                       label=plots.plain(name))
    right.set_yticks(y, [plots.plain(c.name) for _, c in timed])
    right.set_xlabel("task completion time p95 (s)")
    plots.plain_ticks(right, y=False)
    if classes:
        right.legend(loc="lower left", bbox_to_anchor=(0.0, 1.02), ncols=3, fontsize=7.5, frameon=False,
                     title="task class", title_fontsize=8)
    return Chart("study-policies", "Router policies: cache hits, balance and task time", fig,
                 "Left: each fleet config's prefix-cache hit share (the replicas' own counters) against how unevenly "
                 "its router spread the calls; a router that keeps sessions where their prefixes are hits more and "
                 "balances less. Right: the p95 of task completion time per task class. Both at each config's "
                 "ranking points, repeats pooled.")
