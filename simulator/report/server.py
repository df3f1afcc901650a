"""The terminal view of the summary's ``server`` section: what the server's /metrics showed during the
run, and how the server's load and prefix-cache hits spread across tasks."""

from __future__ import annotations

from typing import Any, Optional

from rich.console import Group
from rich.table import Table
from rich.text import Text

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


def timeline_table(section: dict[str, Any]) -> Table:
    """Gauges (mean, max over the scrapes) and counters (increase over the run)."""
    timeline = section.get("timeline") or {}
    table = Table()
    table.add_column("metric")
    table.add_column("mean", justify="right")
    table.add_column("max", justify="right")
    gauges = list(GAUGES) + [(key, key.replace("_", " "), 1.0, "") for key in sorted(timeline)
                             if key.startswith("gpu") and isinstance(timeline[key], dict)]
    for key, label, scale, unit in gauges:
        entry = timeline.get(key)
        if isinstance(entry, dict):
            table.add_row(label, _num(entry.get("mean"), scale, unit), _num(entry.get("max"), scale, unit))
    return table


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


def per_task_table(section: dict[str, Any]) -> Optional[Table]:
    """How the per-task values (mean over each task's lifetime) spread across tasks."""
    per_task = section.get("per_task") or {}
    if not any(per_task.get(key) for key, *_ in PER_TASK):
        return None
    table = Table(title=f"Per-task server load, across {section.get('tasks', 0)} tasks", title_justify="left")
    table.add_column("over each task's life")
    for col in ("tasks", "mean", "p50", "p90", "max"):
        table.add_column(col, justify="right")
    for key, label, scale, unit in PER_TASK:
        d = per_task.get(key)
        if d:
            table.add_row(label, str(d["count"]), *(_num(d[k], scale, unit) for k in ("mean", "p50", "p90", "max")))
    return table


def render_server(section: Optional[dict[str, Any]]) -> Optional[Group]:
    """The whole server part of the report; None when the summary has no server section."""
    if not section:
        return None
    parts: list[Any] = []
    text = counters_text(section)
    if section.get("timeline"):
        parts += [header_text(section), timeline_table(section)]
    if text.plain:
        parts.append(text)
    table = per_task_table(section)
    if table is not None:
        parts.append(table)
    return Group(*parts) if parts else None
