"""A fleet run's replicas over time (the run report's Fleet section): per replica, from its own /metrics
scrapes (fleet/<name>_metrics.jsonl, live or the twin's), the requests it ran and held waiting, its
KV-cache usage and its prefix-cache hit share between scrapes; and the calls each replica answered per second,
from the call records. One colour per replica on every panel."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import numpy as np

from . import plots, series
from .timeline import time_bins
from .cells import number
from .folder_data import RunData, Scrapes
from .page import Chart

FLEET_FOLDER = "fleet"
PANEL_HEIGHT = 1.6
"""Inches per panel."""


def replica_scrapes(run: RunData) -> dict[str, Scrapes]:
    """Each replica's /metrics scrapes, by name in the summary's order (replicas without a file left out)."""
    fleet = run.summary.fleet
    if fleet is None:
        return {}
    found = {}
    for replica in fleet.replicas:
        samples = Scrapes.read(Path(run.folder) / FLEET_FOLDER / f"{replica.name}_metrics.jsonl")
        if samples:
            found[replica.name] = samples
    return found


def _answered(run: RunData, name: str, edges: np.ndarray) -> Optional[np.ndarray]:
    """Calls `name` answered per second over each bin (by their end), from the call records."""
    replicas = run.calls.replica
    if replicas is None:
        return None
    ends = run.calls.end[replicas == name]
    return series.per_second(ends, edges)


@plots.in_style
def replica_timeline(run: RunData) -> Optional[Chart]:
    """The replicas over time (None for a run that is no fleet, or whose replicas left no scrapes)."""
    scrapes = replica_scrapes(run)
    if not scrapes:
        return None
    span = series.run_span(run.calls, run.tasks, next(iter(scrapes.values())))
    edges = series.time_edges(*span, bins=time_bins(run))
    panels = ["answered", "requests", "kv", "hits"]
    fig = plots.new_figure(10.0, 1.3 + PANEL_HEIGHT * len(panels))
    axes = plots.subplots(fig, 1, len(panels), sharex=True)
    handles: list[Any] = []
    for i, (name, samples) in enumerate(scrapes.items()):
        colour = plots.colour(i)
        answered = _answered(run, name, edges)
        if answered is not None:
            axes[0].plot((edges[:-1] + edges[1:]) / 2, answered, color=colour, linewidth=1.2, drawstyle="steps-mid")
        for key, style in (("num_requests_running", "-"), ("num_requests_waiting", ":")):
            line = series.series(samples, key)
            if line is not None:
                axes[1].plot(line[0], line[1], color=colour, linewidth=1.2, linestyle=style, drawstyle="steps-post")
        kv = series.series(samples, "kv_cache_usage_perc")
        if kv is not None:
            axes[2].plot(kv[0], 100.0 * kv[1], color=colour, linewidth=1.2, drawstyle="steps-post")
        hits = series.hit_share_series(samples)
        if hits is not None:
            axes[3].plot(hits[0], 100.0 * hits[1], color=colour, linewidth=1.2, drawstyle="steps-post")
        handles.append(axes[0].plot([], [], color=colour, linewidth=1.6, label=plots.plain(name))[0])
    for ax, label in zip(axes, ("calls answered/s", "running (—), waiting (···)", "KV-cache usage (%)",
                                "prefix-hit share (%)")):
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        plots.plain_ticks(ax, x=False)
    fig.legend(handles=handles, loc="upper right", ncols=min(len(handles), 8), fontsize=8.0, frameon=False)
    fig.suptitle("Replicas over time", x=0.01, ha="left", fontsize=10.0, fontweight="bold")
    axes[-1].set_xlabel("seconds since the run's start")
    axes[-1].set_xlim(*span)
    plots.plain_ticks(axes[-1], x=True, y=False)
    return Chart("fleet-timeline", "Replicas over time", fig,
                 f"Each replica in its colour. Calls answered per second over bins of {number(edges[1] - edges[0])} s "
                 "(from the call records' replica); requests running and waiting, KV-cache usage and the prefix-cache "
                 "hit share (hits over queries between two scrapes, in tokens) as each replica's own /metrics showed them.")
