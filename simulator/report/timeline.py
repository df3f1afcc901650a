"""The run over time: task arrivals and calls sent (binned, so bursts show), tasks and calls in flight,
what the server's /metrics showed (requests running and waiting, KV-cache usage on its own scale, the
prefix-cache hit share), output throughput and failed calls; with the time outside the measurement
window greyed out and lines where arrivals ended, where the drain limit fell and where the window
starts and ends. For several folders, the same series overlaid."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from . import plots, series
from .cells import number
from .folder_data import RunData
from .page import Chart

ERROR_CLASSES_SHOWN = 4
PANEL_HEIGHT = 1.75
"""Inches per panel of a timeline."""
MARKER_REACH = 0.25
"""A marker past the records' last time is drawn when the axis need grow by at most this share."""
OUTSIDE_WINDOW = "#000000"


@dataclass(frozen=True)
class Marker:
    """A moment of the run drawn as a vertical line on every panel: where arrivals ended, the drain
    limit, the window's start and end."""

    t: float
    label: str
    colour: str
    style: Any
    kind: str
    """'window', 'arrivals' or 'drain'."""


def time_bins(run: RunData) -> int:
    """Time bins for a run: up to `series.TIME_BINS`, fewer for a run of few calls (about five calls
    a bin, at least 60 bins) so that rates are not a row of spikes."""
    return int(min(series.TIME_BINS, max(60, len(run.calls) // 5)))


def drain_setting(run: RunData) -> Optional[float]:
    """The run's `run.drain` (seconds after the last arrival before unfinished tasks are cancelled), or
    None when it had none."""
    drain = (((run.info.get("settings") or {}).get("run")) or {}).get("drain")
    return float(drain) if isinstance(drain, (int, float)) and not isinstance(drain, bool) else None


def markers(run: RunData) -> list[Marker]:
    """The moments of a run worth a line: the window's start (after a warm-up) and end (before a
    cool-down), the last arrival, and the drain limit (the last arrival plus `run.drain`)."""
    out = []
    window = run.window
    if window.start > 0:
        out.append(Marker(window.start, f"warm-up ends: window starts ({number(window.start)} s)", "#555555", ":",
                          "window"))
    if window.end is not None:
        out.append(Marker(window.end, f"cool-down starts: window ends ({number(window.end)} s)", "#555555", ":",
                          "window"))
    last = series.last_arrival(run.tasks)
    if last is not None:
        tasks = run.summary.tasks
        unrecorded = (tasks.interrupted or 0) + (tasks.not_started or 0)
        label = (f"end of arrivals ({number(last)} s)" if not unrecorded else
                 f"last recorded arrival ({number(last)} s; {unrecorded:,} judged tasks left no record)")
        out.append(Marker(last, label, "#0072B2", "--", "arrivals"))
        drain = drain_setting(run)
        if drain is not None and not unrecorded:  # else the last arrival, and the limit, are not known
            out.append(Marker(last + drain, f"drain limit ({number(last + drain)} s: last arrival + {number(drain)} s)",
                              plots.BAD, "-.", "drain"))
    return out


def _shown(marks: Sequence[Marker], span: tuple[float, float]) -> tuple[list[Marker], tuple[float, float]]:
    """The markers to draw and the span that shows them: one a little past the records' end widens
    the axis; one far past it (a drain limit the run never reached) is left out."""
    reach = span[1] + MARKER_REACH * (span[1] - span[0])
    shown = [m for m in marks if span[0] <= m.t <= reach]
    end = max([span[1], *(m.t for m in shown)])
    return shown, (span[0], end + 0.01 * (end - span[0]))


def _draw_markers(axes: Sequence[Axes], marks: Sequence[Marker], colour: Optional[str] = None) -> None:
    for ax in axes:
        for m in marks:
            ax.axvline(m.t, color=colour or m.colour, linestyle=m.style, linewidth=1.1, alpha=0.85)


def _marker_handles(marks: Sequence[Marker], colour: Optional[str] = None, prefix: str = "") -> list[Line2D]:
    return [Line2D([], [], color=colour or m.colour, linestyle=m.style, linewidth=1.1,
                   label=plots.plain(prefix + m.label)) for m in marks]


def _panel_legend(ax: Axes, handles: Optional[list[Any]] = None) -> None:
    """The panel's legend in a row above it, where it covers no data."""
    if handles is None:
        handles, _ = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncols=min(4, len(handles)),
                  borderaxespad=0.2, handlelength=1.6, columnspacing=1.2)


def _figure_legend(fig: Figure, handles: list[Any]) -> None:
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncols=min(3, len(handles)),
                   handlelength=2.2, columnspacing=1.6)


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
    if "kv_cache_usage_perc" in keys:
        panels.append("kv")
    if {"prefix_cache_hits", "prefix_cache_queries"} <= keys and series.hit_share_series(run.samples) is not None:
        panels.append("hits")
    return panels


def _per_bin(times: np.ndarray, edges: np.ndarray) -> np.ndarray:
    return np.histogram(times, bins=edges)[0].astype(np.float64)


def _draw_arrivals(ax: Axes, run: RunData, edges: np.ndarray) -> None:
    """Top-level tasks arriving (intended arrivals) and call attempts sent (actual sends) in each bin,
    on their own scales (a task makes many calls)."""
    width = number(edges[1] - edges[0])
    ax.stairs(_per_bin(run.tasks.arrival[run.tasks.top], edges), edges, fill=True, color="#000000", alpha=0.5,
              linewidth=0, label=f"tasks arriving per {width} s (left)")
    ax.set_ylabel("tasks")
    _count_axis(ax)
    plots.plain_ticks(ax, x=False)
    handles, _ = ax.get_legend_handles_labels()
    if len(run.calls):
        sent = ax.twinx()
        sent.grid(False)
        sent.spines["right"].set_visible(True)
        sent.stairs(_per_bin(run.calls.send, edges), edges, color="#D55E00", linewidth=1.1,
                    label=f"calls sent per {width} s (right)")
        sent.set_ylabel("calls", color="#D55E00")
        _count_axis(sent)
        plots.plain_ticks(sent, x=False)
        handles += sent.get_legend_handles_labels()[0]
    _panel_legend(ax, handles)


def _draw_requests(ax: Axes, run: RunData, edges: np.ndarray, colour_running: str, colour_waiting: str) -> None:
    for key, name, colour in (("num_requests_running", "running", colour_running),
                              ("num_requests_waiting", "waiting", colour_waiting)):
        points = series.series(run.samples, key, edges)
        if points is not None:
            ax.plot(points[0], points[1], color=colour, linewidth=1.2, label=f"requests {name}",
                    drawstyle="steps-post")
    ax.set_ylabel("server requests")
    _count_axis(ax)
    plots.plain_ticks(ax, x=False)


def _count_axis(ax: Axes) -> None:
    """A y axis of counts: from 0, ticks at whole numbers, at least up to 1 (a panel of zeros)."""
    ax.set_ylim(0, max(1.0, ax.get_ylim()[1]))
    ax.yaxis.get_major_locator().set_params(integer=True)


def _usage_axis(ax: Axes, peak: float) -> None:
    """A percentage axis from 0 to a little above `peak` (so that a usage of 3% fills the panel)."""
    ax.set_ylim(0, max(1.2 * peak, 0.1) if peak < 80 else 105)
    plots.percent_ticks(ax)


def _draw_kv(ax: Axes, run: RunData, edges: np.ndarray, colour: str, label: str = "KV-cache usage") -> float:
    """KV-cache usage in % on its own scale; returns its peak (% of the pool)."""
    usage = series.series(run.samples, "kv_cache_usage_perc", edges)
    if usage is None:
        return 0.0
    percent = 100 * usage[1]
    ax.plot(usage[0], percent, color=colour, linewidth=1.5, label=plots.plain(label))
    return float(np.nanmax(percent)) if percent.size else 0.0


def _draw_hits(ax: Axes, run: RunData, edges: np.ndarray) -> None:
    share = series.hit_share_series(run.samples, edges)
    if share is not None:
        ax.plot(share[0], 100 * np.clip(share[1], 0.0, 1.0), color="#009E73", linewidth=1.1,
                label="prefix-cache hits (share of queried tokens)")
    ax.set_ylim(0, 105)
    ax.set_ylabel("hit share")
    plots.percent_ticks(ax)


def _output_rate(run: RunData, edges: np.ndarray) -> np.ndarray:
    ok = run.calls.ok
    return series.per_second(run.calls.end[ok], edges, run.calls.output_tokens[ok])


def _draw_output_and_errors(ax: Axes, run: RunData, edges: np.ndarray) -> None:
    centers = (edges[:-1] + edges[1:]) / 2
    failed_end = run.calls.end[~run.calls.ok]
    ax.plot(centers, _output_rate(run, edges), color="#0072B2", linewidth=1.2, drawstyle="steps-mid",
            label="output tokens/s" + (" (left)" if failed_end.size else ""))
    ax.set_ylabel("output tokens/s")
    ax.set_ylim(bottom=0)
    plots.plain_ticks(ax, x=False)
    if not failed_end.size:
        _panel_legend(ax)
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
                      label=plots.plain(f"failed: {name} (right)"))
        bottom = top
    errors.set_ylabel("failed calls/s", color=plots.BAD)
    errors.set_ylim(bottom=0)
    errors.spines["right"].set_visible(True)
    plots.plain_ticks(errors, x=False)
    _panel_legend(ax, ax.get_legend_handles_labels()[0] + errors.get_legend_handles_labels()[0])


def _shading(ax: Axes, run: RunData, span: tuple[float, float]) -> bool:
    """Grey out the time outside the window; whether any was."""
    window = run.window
    plots.window_shading(ax, window.start, window.end, span)
    return window.start > span[0] or (window.end is not None and window.end < span[1])


@plots.in_style
def timeline(run: RunData) -> Optional[Chart]:
    """One folder's timeline, a panel per kind of series it has."""
    if not len(run.calls) and not len(run.tasks) and not run.samples:
        return None
    every = markers(run)
    marks, span = _shown(every, series.run_span(run.calls, run.tasks, run.samples))
    edges = series.time_edges(*span, bins=time_bins(run))
    panels = ["arrivals", "load"] + _server_panels(run) + (["output"] if len(run.calls) else [])
    fig = plots.new_figure(10.0, 1.3 + PANEL_HEIGHT * len(panels))
    axes = plots.subplots(fig, 1, len(panels), sharex=True)
    shaded = False
    for ax, panel in zip(axes, panels):
        shaded = _shading(ax, run, span) or shaded
        if panel == "arrivals":
            _draw_arrivals(ax, run, edges)
        elif panel == "load":
            _band(ax, _load(run, edges)[0], "#000000", "tasks in flight")
            _band(ax, _load(run, edges)[1], "#D55E00", "calls in flight")
            ax.set_ylabel("in flight")
            _count_axis(ax)
            plots.plain_ticks(ax, x=False)
            _panel_legend(ax)
        elif panel == "requests":
            _draw_requests(ax, run, edges, "#0072B2", "#D55E00")
            _panel_legend(ax)
        elif panel == "kv":
            peak = _draw_kv(ax, run, edges, "#CC79A7", "KV-cache usage (% of the pool, own scale)")
            ax.set_ylabel("KV-cache usage")
            _usage_axis(ax, peak)
            _panel_legend(ax)
        elif panel == "hits":
            _draw_hits(ax, run, edges)
            _panel_legend(ax)
        else:
            _draw_output_and_errors(ax, run, edges)
    fig.suptitle("The run over time", x=0.01, ha="left", fontsize=10.0, fontweight="bold")
    _draw_markers(axes, marks)
    handles: list[Any] = _marker_handles(marks)
    if shaded:
        handles.append(Patch(color=OUTSIDE_WINDOW, alpha=0.12, label="outside the measurement window"))
    _figure_legend(fig, handles)
    axes[-1].set_xlabel("seconds since the run's start")
    axes[-1].set_xlim(*span)
    plots.plain_ticks(axes[-1], x=True, y=False)
    width = edges[1] - edges[0]
    limit = [m.t for m in every if m.kind == "drain"]
    unreached = bool(limit) and not any(m.kind == "drain" for m in marks)
    return Chart("timeline", "Over time", fig,
                 f"Time in bins of {number(width)} s: arrivals and sends are counted per bin (a burst shows as a "
                 "tall bin), output and failures per second over each bin; lines "
                 "in flight are means over each bin, shaded bands reach the bin's peak; requests and KV-cache "
                 "usage as the server's /metrics showed them, the KV-cache usage on its own scale. Arrivals "
                 "are the intended arrivals of the tasks that ended (completed, failed or cancelled: a task "
                 "interrupted or never started left no record). Vertical lines: the end of arrivals"
                 + (", the drain limit" if limit and not unreached else "")
                 + (", the measurement window's bounds" if run.window.start > 0 or run.window.end is not None else "")
                 + ". Grey: outside the measurement window (warm-up, cool-down), recorded but not counted."
                 + (f" The drain limit ({number(limit[0])} s) lies past the run's end." if unreached else ""))


@plots.in_style
def timeline_overlay(runs: Sequence[RunData]) -> Optional[Chart]:
    """Several folders' load (tasks and calls in flight), output and server series, overlaid, with
    each folder's end of arrivals and drain limit in its colour."""
    if not any(len(run.calls) or len(run.tasks) for run in runs):
        return None
    with_samples = [run for run in runs if run.samples]
    panels = ["tasks", "calls", "output"] + (["waiting", "kv"] if with_samples else [])
    fig = plots.new_figure(10.0, 1.3 + PANEL_HEIGHT * len(panels))
    axes = plots.subplots(fig, 1, len(panels), sharex=True)
    end, peak = 1.0, 0.0
    handles: list[Any] = []
    for i, run in enumerate(runs):
        span = series.run_span(run.calls, run.tasks, run.samples)
        marks, span = _shown([m for m in markers(run) if m.kind != "window"], span)
        end = max(end, span[1])
        edges = series.time_edges(*span, bins=time_bins(run))
        tasks, calls = _load(run, edges)
        colour, label = plots.colour(i), plots.plain(run.label)
        axes[0].plot(tasks.centers, tasks.mean, color=colour, linewidth=1.2, label=label, drawstyle="steps-mid")
        axes[1].plot(calls.centers, calls.mean, color=colour, linewidth=1.2, drawstyle="steps-mid")
        axes[2].plot(tasks.centers, _output_rate(run, edges), color=colour, linewidth=1.2, drawstyle="steps-mid")
        if run.samples:
            waiting = series.series(run.samples, "num_requests_waiting", edges)
            if waiting is not None:
                axes[3].plot(waiting[0], waiting[1], color=colour, linewidth=1.2, drawstyle="steps-post")
            peak = max(peak, _draw_kv(axes[4], run, edges, colour, label))
        _draw_markers(axes, marks, colour)
        handles += [Line2D([], [], color=colour, linewidth=1.6, label=label)]
        handles += _marker_handles(marks, colour, f"{run.label}: ")
    for ax, ylabel in zip(axes, ("tasks in flight", "calls in flight", "output tokens/s",
                                 "requests waiting", "KV-cache usage")):
        ax.set_ylabel(ylabel)
        if ylabel in ("output tokens/s", "KV-cache usage"):
            ax.set_ylim(bottom=0)
        else:
            _count_axis(ax)
        plots.plain_ticks(ax, x=False)
    if with_samples:
        _usage_axis(axes[4], peak)
    _figure_legend(fig, handles)
    fig.suptitle("Load, output and server state over time", x=0.01, ha="left", fontsize=10.0, fontweight="bold")
    axes[-1].set_xlabel("seconds since each run's start")
    axes[-1].set_xlim(0.0, end)
    plots.plain_ticks(axes[-1], x=True, y=False)
    return Chart("timeline", "Over time", fig,
                 "Means over time bins of each run; server series where a folder has /metrics scrapes"
                 + (f" ({', '.join(r.label for r in with_samples)})" if with_samples else "")
                 + ", the KV-cache usage on its own scale. Vertical lines in each folder's colour: its end of "
                 "arrivals (dashed) and its drain limit (dash-dot) where it had one.")
