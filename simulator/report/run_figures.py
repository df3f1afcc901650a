"""The figures of one result folder or several overlaid: per-call latency CDFs, task completion CDFs,
the breakdown of task time, and the timeline of load, server state and errors. Each builder returns
None when the folders hold nothing to draw (a summary.json alone has no histograms)."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ..metrics.summary import Summary
from . import plots, series
from .cells import number
from .folder_data import RunData
from .page import Chart

CALL_PANELS = (("ttft", "TTFT", "ttft_ms"), ("tpot", "TPOT", "tpot_ms"), ("itl", "ITL", None),
               ("e2el", "End-to-end latency", None))
"""(histogram name, title, SLO target) of the per-call panels."""


def _total(runs: Sequence[RunData], name: str) -> int:
    return max((r.histograms[name].get_total_count() for r in runs if name in r.histograms), default=0)


def _curve_label(run: RunData, several: bool, extra: str = "") -> str:
    return plots.plain(f"{run.label}{extra}") if several else plots.plain(extra.strip(" ()") or "all calls")


@plots.in_style
def latency_cdfs(runs: Sequence[RunData]) -> Optional[Chart]:
    """TTFT, TPOT, ITL and end-to-end latency CDFs (ms), one line per folder, with the SLO marks of
    the first folder."""
    if not any(name in r.histograms for r in runs for name, _, _ in CALL_PANELS):
        return None
    fig = plots.new_figure(10.0, 6.4)
    axes = plots.subplots(fig, 2, 2)
    several = len(runs) > 1
    for ax, (name, title, slo_key) in zip(axes, CALL_PANELS):
        top = plots.tail_top(_total(runs, name))
        plots.percentile_axis(ax, top)
        ax.set_title(title)
        ax.set_xlabel("milliseconds")
        curves = []
        for i, run in enumerate(runs):
            h = run.histograms.get(name)
            if h is None or h.get_total_count() == 0:
                continue
            values, shares = series.cdf(h, 1000.0)
            curves.append((values, shares))
            label = run.label if several else f"{h.get_total_count():,} {'gaps' if name == 'itl' else 'calls'}"
            plots.draw_cdf(ax, values, shares, top, color=plots.colour(i), linewidth=1.5, label=plots.plain(label))
        drawn = bool(curves)
        check = getattr(runs[0].summary.slo, slo_key) if slo_key else None
        plots.slo_marks(ax, check, "ms", top, whose=plots.plain(runs[0].label) if several else "")
        plots.log_axis(ax, plots.cdf_limits(curves, plots.slo_bounds(check)))
        if drawn:
            ax.legend(loc="best")
        else:
            ax.text(0.5, 0.5, "nothing recorded", transform=ax.transAxes, ha="center", color="#888888")
    fig.supylabel("share of calls at or below (percentile)")
    return Chart("call-latency-cdf", "Per-call latency", fig,
                 "CDFs from the run's HdrHistograms on a percentile axis that stretches the tail; "
                 "SLO bounds as dashed lines, a diamond where the percentile must stay left of it.")


def _class_names(runs: Sequence[RunData]) -> list[str]:
    names: list[str] = []
    for run in runs:
        for key in run.histograms:
            if key.startswith("task_completion[") and key.endswith("]") and key[16:-1] not in names:
                names.append(key[16:-1])
    return sorted(names)


def _judged(run: RunData, cls: Optional[str]) -> Optional[int]:
    """The judged tasks (of a class) of a run's summary, None when it does not say."""
    tasks = run.summary.tasks
    if cls is None:
        return tasks.judged
    entry = tasks.by_class.get(cls)
    return entry.judged if entry is not None else None


def _task_label(count: int, judged: Optional[int], what: str = "tasks") -> str:
    """'6 tasks', or '3 of 6 judged tasks completed' when some did not complete."""
    if judged is not None and judged > count:
        return f"{count:,} of {judged:,} judged {what} completed"
    return f"{count:,} {what}"


def _class_label(count: int, judged: Optional[int]) -> str:
    """'3', or '1 of 3 completed' when some of the class's judged tasks did not complete."""
    return f"{count:,} of {judged:,} completed" if judged is not None and judged > count else f"{count:,}"


@plots.in_style
def task_cdfs(runs: Sequence[RunData]) -> Optional[Chart]:
    """Task completion time CDFs over the judged tasks (a curve stops at the share that completed):
    for one folder, all tasks and each class; for several, all tasks per folder (and a panel per class
    when there are few classes)."""
    if not any("task_completion" in r.histograms for r in runs):
        return None
    classes = _class_names(runs)
    several = len(runs) > 1
    panels = [None] + (classes if several and 1 < len(classes) <= 3 else [])
    fig = plots.new_figure(10.0, 3.8 if len(panels) == 1 else 3.6 * ((len(panels) + 1) // 2))
    axes = plots.subplots(fig, 1 if len(panels) == 1 else 2, (len(panels) + 1) // 2)
    short = False
    for ax, cls in zip(axes, panels):
        name = "task_completion" if cls is None else f"task_completion[{cls}]"
        top = plots.tail_top(_total(runs, name))
        plots.percentile_axis(ax, top)
        ax.set_xlabel("seconds from intended arrival to last byte")
        curves = []
        ax.set_title("All tasks" if cls is None else plots.plain(f"Class {cls}"))
        for i, run in enumerate(runs):
            h = run.histograms.get(name)
            if h is None or not h.get_total_count():
                continue
            count, judged = h.get_total_count(), _judged(run, cls)
            values, shares = series.cdf(h, 1e6)
            shares = series.judged_shares(shares, count, judged)
            short = short or bool(judged and judged > count)
            curves.append((values, shares))
            label = (f"{run.label} ({_task_label(count, judged)})" if several else
                     f"all ({_task_label(count, judged)})")
            plots.draw_cdf(ax, values, shares, top, color=plots.colour(i) if several else "#000000",
                           linewidth=2.0 if not several else 1.5, label=plots.plain(label))
        if not several and len(classes) > 1:
            for i, cls_name in enumerate(classes):
                h = runs[0].histograms[f"task_completion[{cls_name}]"]
                if h.get_total_count():
                    count, judged = h.get_total_count(), _judged(runs[0], cls_name)
                    values, shares = series.cdf(h, 1e6)
                    plots.draw_cdf(ax, values, series.judged_shares(shares, count, judged), top,
                                   color=plots.colour(i), linewidth=1.2,
                                   label=plots.plain(f"{cls_name} ({_class_label(count, judged)})"))
        plots.slo_marks(ax, runs[0].summary.slo.task_s, "s", top, verdict=cls is None,
                        whose=plots.plain(runs[0].label) if several else "")
        plots.log_axis(ax, plots.cdf_limits(curves, plots.slo_bounds(runs[0].summary.slo.task_s)))
        ax.legend(loc="best")
        ax.set_ylabel("share of judged tasks at or below")
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    return Chart("task-completion-cdf", "Task completion time", fig,
                 "Tasks judged: those the run meant to start that arrived in the measurement window; the task "
                 "SLO as a dashed line. "
                 + ("A curve that stops below the top is the share of the judged tasks that completed: the "
                    "rest (failed, cancelled, interrupted, never started) count as slower than any time, as the "
                    "task SLO counts them." if short else ""))


@plots.in_style
def breakdown_chart(runs: Sequence[RunData]) -> Optional[Chart]:
    """Where a completed task's time goes (mean seconds): one bar per class for one folder (from the
    task records), one bar per folder for several (from each summary)."""
    rows: list[tuple[str, dict[str, float]]] = []
    if len(runs) == 1:
        run = runs[0]
        rows.append(("all tasks", _summary_breakdown(run.summary)))
        by_class = series.breakdown_by_class(run.tasks, run.window)
        if len(by_class) > 1:
            rows += [(name, parts) for name, parts in by_class.items()]
    else:
        rows = [(run.label, _summary_breakdown(run.summary)) for run in runs]
    rows = [(name, parts) for name, parts in rows if parts["total"] > 0]
    if not rows:
        return None
    fig = plots.new_figure(10.0, 1.2 + 0.45 * len(rows))
    (ax,) = plots.subplots(fig)
    ax.grid(axis="y", visible=False)
    y = np.arange(len(rows))[::-1]
    keys = [key for key, _ in series.BREAKDOWN_PARTS]
    widths = np.array([[parts[key] for key in keys] for _, parts in rows])
    lefts = np.cumsum(widths, axis=1) - widths
    totals = widths.sum(axis=1)
    for j, (key, label) in enumerate(series.BREAKDOWN_PARTS):
        ax.barh(y, widths[:, j], left=lefts[:, j], height=0.6, color=plots.PART_COLOURS[key], label=label)
        for i in np.flatnonzero(widths[:, j] > 0.07 * totals):
            ax.text(lefts[i, j] + widths[i, j] / 2, y[i], f"{number(widths[i, j])} s", ha="center", va="center",
                    fontsize=7.5)
    ax.set_yticks(y, [plots.plain(name) for name, _ in rows])
    ax.set_xlabel("mean seconds per completed task")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35 if len(rows) < 3 else -0.18), ncols=5)
    return Chart("task-time-breakdown", "Where task time goes", fig,
                 "Mean per completed task: in calls before the first token (queueing and prefill) and "
                 "decoding, in tool and think time between calls, client lag, and the rest (waiting for "
                 "sub-agents).")


def _summary_breakdown(summary: Summary) -> dict[str, float]:
    b = summary.tasks.breakdown_s
    return {key: float(getattr(b, key)) for key, _ in series.BREAKDOWN_PARTS} | {"total": b.total}
