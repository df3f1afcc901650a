"""The terminal view of the summary's ``server`` section: what the server's /metrics showed during the
run, and how the server's load and prefix-cache hits spread across tasks."""

from __future__ import annotations

from typing import Any, Optional

from rich.text import Text

from .fit import Grid

GAUGES = (
    ("num_requests_running", "requests running", 1.0, ""),
    ("num_requests_waiting", "requests waiting", 1.0, ""),
    ("kv_cache_usage_perc", "KV-cache usage", 100.0, "%"),
)
COUNTERS = (
    ("prefix_cache_queries_delta", "prefix-cache queries (tokens)"),
    ("prefix_cache_hits_delta", "prefix-cache hits (tokens)"),
    ("num_preemptions_delta", "preemptions"),
    ("prompt_tokens_delta", "prompt tokens"),
    ("generation_tokens_delta", "generation tokens"),
)
PER_TASK = (
    ("kv_cache_usage_mean", "mean KV-cache usage", 100.0, "%"),
    ("waiting_mean", "mean requests waiting", 1.0, ""),
    ("running_mean", "mean requests running", 1.0, ""),
    ("cache_hit_share", "prefix-cache hit share (usage)", 100.0, "%"),
)


def _num(value: Optional[float], scale: float = 1.0, unit: str = "") -> str:
    if value is None:
        return "-"
    value *= scale
    return f"{value:,.0f}{unit}" if abs(value) >= 1000 else f"{value:,.2f}{unit}"


def _share(value: Optional[float]) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def timeline_grid(section: dict[str, Any]) -> Grid:
    """Gauges (mean, max over the scrapes) and counters (increase over the run)."""
    timeline = section.get("timeline") or {}
    grid = Grid("", [("metric", "left"), ("mean", "right"), ("max", "right")])
    gauges = list(GAUGES) + [(key, key.replace("_", " "), 1.0, "") for key in sorted(timeline)
                             if key.startswith("gpu") and isinstance(timeline[key], dict)]
    for key, label, scale, unit in gauges:
        entry = timeline.get(key)
        if isinstance(entry, dict):
            grid.add(label, _num(entry.get("mean"), scale, unit), _num(entry.get("max"), scale, unit))
    return grid


def header_text(section: dict[str, Any]) -> Text:
    """How the /metrics timeline was taken."""
    timeline = section.get("timeline") or {}
    interval = section.get("interval_s")
    every = f" every {interval:g} s" if interval else ""
    return Text(f"Server /metrics: {timeline.get('samples', 0)} scrapes{every}, "
                f"{timeline.get('failed_scrapes', 0)} failed", style="bold")


def counters_text(section: dict[str, Any]) -> Text:
    """Counter deltas and prefix-cache hit shares (from /metrics and from the calls' usage)."""
    timeline = section.get("timeline") or {}
    lines = []
    parts = [f"{label} {timeline[key]:,.0f}" for key, label in COUNTERS if key in timeline]
    if parts:
        lines.append("over the run: " + ", ".join(parts))
    if timeline:
        lines.append(f"prefix-cache hit share (server counters): {_share(timeline.get('prefix_cache_hit_share'))}")
    usage = section.get("usage_cached_tokens") or {}
    if usage.get("calls_reporting"):
        lines.append(
            f"prefix-cache hit share (usage.cached_tokens): {_share(usage.get('hit_share'))} "
            f"({usage['cached_tokens']:,} of {usage['prompt_tokens']:,} prompt tokens; "
            f"{usage['calls_reporting']} of {usage.get('calls_ok', 0)} calls reported it)")
    if section.get("note"):
        lines.append(section["note"])
    return Text("\n".join(lines))


def per_task_grid(section: dict[str, Any]) -> Optional[Grid]:
    """How the per-task values (mean over each task's lifetime) spread across tasks."""
    per_task = section.get("per_task") or {}
    if not any(per_task.get(key) for key, *_ in PER_TASK):
        return None
    grid = Grid(f"Per-task server load, across {section.get('tasks', 0):,} tasks",
                [("over each task's life", "left"), *((col, "right") for col in ("tasks", "mean", "p50", "p90", "max"))])
    for key, label, scale, unit in PER_TASK:
        d = per_task.get(key)
        if d:
            grid.add(label, f"{d['count']:,}", *(_num(d[k], scale, unit) for k in ("mean", "p50", "p90", "max")))
    return grid


def server_parts(section: Optional[dict[str, Any]], width: int) -> list[Any]:
    """The whole server part of the report, its tables fitted to `width` columns (nothing when the
    summary has no server section)."""
    if not section:
        return []
    parts: list[Any] = []
    text = counters_text(section)
    if section.get("timeline"):
        parts += [header_text(section), *timeline_grid(section).tables(width)]
    if text.plain:
        parts.append(text)
    grid = per_task_grid(section)
    if grid is not None:
        parts += grid.tables(width)
    return parts
