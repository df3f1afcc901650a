"""The run over time: tasks and calls in flight, what the server's /metrics showed (requests running
and waiting, KV-cache usage, prefix-cache hits), output throughput and failed calls, with the time
outside the measurement window greyed out. For several folders, the same series overlaid."""

from __future__ import annotations

from collections import Counter
from typing import Optional, Sequence

import numpy as np
from matplotlib.axes import Axes

from . import plots, series
from .folder_data import RunData
from .page import Chart

ERROR_CLASSES_SHOWN = 4


def time_bins(run: RunData) -> int:
    """Time bins for a run: up to `series.TIME_BINS`, fewer for a run of few calls (about five calls
    a bin, at least 60 bins) so that rates are not a row of spikes."""
    return int(min(series.TIME_BINS, max(60, len(run.calls) // 5)))


def _load(run: RunData, edges: np.ndarray) -> tuple[series.Occupancy, series.Occupancy]:
    """Top-level tasks (intended arrival to end) and calls (send to end) in flight."""
    top = run.tasks.top
    tasks = series.occupancy(run.tasks.arrival[top], run.tasks.end[top], edges)
    calls = series.occupancy(run.calls.send, run.calls.end, edges)
    return tasks, calls


def _band(ax: Axes, occ: series.Occupancy, colour: str, label: str) -> None:
    ax.fill_between(occ.centers, occ.mean, occ.peak, color=colour, alpha=0.15, linewidth=0, step="mid")
    ax.plot(occ.centers, occ.mean, color=colour, linewidth=1.3, label=label, drawstyle="steps-mid")


def _server_panels(run: RunData) -> list[str]:
    keys = {key for key, values in run.samples.values.items() if not np.isnan(values).all()}
    panels = []
    if keys & {"num_requests_running", "num_requests_waiting"}:
        panels.append("requests")
    if "kv_cache_usage_perc" in keys or {"prefix_cache_hits", "prefix_cache_queries"} <= keys:
        panels.append("kv")
    return panels


def _draw_requests(ax: Axes, run: RunData, edges: np.ndarray, colour_running: str, colour_waiting: str) -> None:
    for key, name, colour in (("num_requests_running", "running", colour_running),
                              ("num_requests_waiting", "waiting", colour_waiting)):
        points = series.series(run.samples, key, edges)
        if points is not None:
            ax.plot(points[0], points[1], color=colour, linewidth=1.2, label=name, drawstyle="steps-post")


def _draw_kv(ax: Axes, run: RunData, edges: np.ndarray, colour: str, prefix: str = "", hits: bool = True) -> None:
    usage = series.series(run.samples, "kv_cache_usage_perc", edges)
    if usage is not None:
        ax.plot(usage[0], 100 * usage[1], color=colour, linewidth=1.5, label=plots.plain(prefix + "KV-cache usage"))
        if hits:
            ax.fill_between(usage[0], 0, 100 * usage[1], color=colour, alpha=0.2, linewidth=0)
    share = series.hit_share_series(run.samples, edges) if hits else None
    if share is not None:
        ax.plot(share[0], 100 * np.clip(share[1], 0.0, 1.0), color="#009E73", linewidth=0.9, alpha=0.8,
                label="prefix-cache hits (share of queried tokens)")
    ax.set_ylim(0, 105)
    ax.set_ylabel("%")


def _output_rate(run: RunData, edges: np.ndarray) -> np.ndarray:
    ok = run.calls.ok
    return series.per_second(run.calls.end[ok], edges, run.calls.output_tokens[ok])


def _draw_output_and_errors(ax: Axes, run: RunData, edges: np.ndarray) -> None:
    centers = (edges[:-1] + edges[1:]) / 2
    ax.plot(centers, _output_rate(run, edges), color="#0072B2", linewidth=1.2, drawstyle="steps-mid",
            label="output tokens/s")
    ax.set_ylabel("output tokens/s")
    failed_end = run.calls.end[~run.calls.ok]
    if not failed_end.size:
        ax.legend(loc="upper left")
        return
    errors = ax.twinx()
    errors.grid(False)
    names = np.array(run.calls.failed_class, dtype=object)
    classes = [name for name, _ in Counter(run.calls.failed_class).most_common()]
    shown = classes[:ERROR_CLASSES_SHOWN]
    groups = [(name, failed_end[names == name]) for name in shown]
    if len(classes) > len(shown):
        groups.append(("other", failed_end[~np.isin(names, shown)]))
    bottom = np.zeros(len(centers))
    reds = ("#C0392B", "#E67E22", "#8E44AD", "#7F8C8D", "#34495E")
    for i, (name, ends) in enumerate(groups):
        top = bottom + series.per_second(ends, edges)
        errors.stairs(top, edges, baseline=bottom, fill=True, color=reds[i], alpha=0.75,
                      label=plots.plain(f"failed: {name}"))
        bottom = top
    errors.set_ylabel("failed calls/s", color=plots.BAD)
    errors.spines["right"].set_visible(True)
    lines, labels = ax.get_legend_handles_labels()
    more_lines, more_labels = errors.get_legend_handles_labels()
    ax.legend(lines + more_lines, labels + more_labels, loc="upper left")


@plots.in_style
def timeline(run: RunData) -> Optional[Chart]:
    """One folder's timeline, a panel per kind of series it has."""
    if not len(run.calls) and not len(run.tasks) and not run.samples:
        return None
    span = series.run_span(run.calls, run.tasks, run.samples)
    edges = series.time_edges(*span, bins=time_bins(run))
    panels = ["load"] + _server_panels(run) + (["output"] if len(run.calls) else [])
    fig = plots.new_figure(10.0, 1.0 + 2.0 * len(panels))
    axes = plots.subplots(fig, 1, len(panels), sharex=True)
    for ax, panel in zip(axes, panels):
        plots.window_shading(ax, run.window.start, run.window.end, span)
        if panel == "load":
            tasks, calls = _load(run, edges)
            _band(ax, tasks, "#000000", "tasks in flight")
            _band(ax, calls, "#D55E00", "calls in flight")
            ax.set_ylabel("in flight")
            ax.set_title("Load, server and errors over time", loc="left")
        elif panel == "requests":
            _draw_requests(ax, run, edges, "#0072B2", "#D55E00")
            ax.set_ylabel("server requests")
        elif panel == "kv":
            _draw_kv(ax, run, edges, "#CC79A7")
        else:
            _draw_output_and_errors(ax, run, edges)
        if panel != "output":
            ax.legend(loc="upper left")
    axes[-1].set_xlabel("seconds since the run's start")
    axes[-1].set_xlim(*span)
    return Chart("timeline", "Over time", fig,
                 "Lines are means over each time bin, shaded bands reach the bin's peak; requests "
                 "and KV-cache usage as the server's /metrics showed them. Grey: outside the measurement "
                 "window (warm-up, cool-down), recorded but not counted.")


@plots.in_style
def timeline_overlay(runs: Sequence[RunData]) -> Optional[Chart]:
    """Several folders' load (tasks and calls in flight), output and server series, overlaid."""
    if not any(len(run.calls) or len(run.tasks) for run in runs):
        return None
    with_samples = [run for run in runs if run.samples]
    panels = ["tasks", "calls", "output"] + (["waiting", "kv"] if with_samples else [])
    fig = plots.new_figure(10.0, 1.0 + 1.8 * len(panels))
    axes = plots.subplots(fig, 1, len(panels), sharex=True)
    end = 1.0
    for i, run in enumerate(runs):
        span = series.run_span(run.calls, run.tasks, run.samples)
        end = max(end, span[1])
        edges = series.time_edges(*span, bins=time_bins(run))
        tasks, calls = _load(run, edges)
        colour, label = plots.colour(i), plots.plain(run.label)
        axes[0].plot(tasks.centers, tasks.mean, color=colour, linewidth=1.2, label=label, drawstyle="steps-mid")
        axes[1].plot(calls.centers, calls.mean, color=colour, linewidth=1.2, label=label, drawstyle="steps-mid")
        axes[2].plot(tasks.centers, _output_rate(run, edges), color=colour, linewidth=1.2, label=label, drawstyle="steps-mid")
        if run.samples:
            waiting = series.series(run.samples, "num_requests_waiting", edges)
            if waiting is not None:
                axes[3].plot(waiting[0], waiting[1], color=colour, linewidth=1.2, label=label, drawstyle="steps-post")
            _draw_kv(axes[4], run, edges, colour, prefix=f"{run.label}: ", hits=False)
    for ax, ylabel in zip(axes, ("tasks in flight", "calls in flight", "output tokens/s",
                                 "requests waiting", "KV-cache usage %")):
        ax.set_ylabel(ylabel)
        ax.legend(loc="upper left")
    axes[0].set_title("Load, output and server state over time", loc="left")
    axes[-1].set_xlabel("seconds since each run's start")
    axes[-1].set_xlim(0.0, end)
    return Chart("timeline", "Over time", fig,
                 "Means over time bins of each run; server series where a folder has /metrics scrapes"
                 + (f" ({', '.join(r.label for r in with_samples)})" if with_samples else "") + ".")
