"""Two results side by side (a real run and its simulation, or two server configs): the same figures
from each `summary.json`, with the ratio B/A. A figure is named by its path in summary.json, so a
summary that lacks it (an older version's) just leaves its cell empty."""

from __future__ import annotations

from typing import Any, Iterator, Optional

from rich.table import Table

from ..metrics.summary import Summary

CALL_METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "end to end"))
STATS = ("mean", "p50", "p90", "p95", "p99", "p99.9")
BREAKDOWN = ("ttft", "decode", "gaps", "client_lag", "other")


def _get(summary: dict[str, Any], path: tuple[str, ...]) -> Optional[float]:
    value: Any = summary
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _paths(a: dict[str, Any], b: dict[str, Any]) -> Iterator[tuple[str, str, tuple[str, ...]]]:
    """(section, figure, path in summary.json) of every figure compared."""
    yield "throughput", "output tokens/s", ("output_throughput",)
    yield "throughput", "calls/s", ("request_throughput",)
    yield "throughput", "tasks/hour", ("tasks", "throughput_per_hour")
    yield "throughput", "tasks/hour within SLO", ("tasks", "goodput_per_hour")
    for key, label in CALL_METRICS:
        for stat in STATS:
            yield "per call (ms)", f"{label} {stat}", (f"{stat}_{key}_ms",)
    for stat in STATS:
        yield "per task (s)", f"completion {stat}", ("tasks", "completion_time_s", stat)
    for part in BREAKDOWN:
        yield "per task (s)", f"mean time in {part.replace('_', ' ')}", ("tasks", "breakdown_s", part)
    classes = sorted(set((a.get("tasks") or {}).get("by_class") or {}) & set((b.get("tasks") or {}).get("by_class") or {}))
    if len(classes) > 1:
        for name in classes:
            for stat in ("p50", "p95"):
                yield "per task class (s)", f"{name} completion {stat}", ("tasks", "by_class", name, "completion_time_s", stat)
    yield "cache and errors", "cached prompt tokens", ("total_cached_tokens",)
    yield "cache and errors", "calls completed", ("completed",)
    yield "cache and errors", "failed call attempts", ("calls", "failed_attempts")
    yield "cache and errors", "tasks failed", ("tasks", "failed")


def compare_summaries(a: Summary, b: Summary) -> list[dict[str, Any]]:
    """One row per figure present in either summary: section, figure, a, b, ratio b/a (None when
    either is missing or a is 0)."""
    json_a, json_b = a.to_dict(), b.to_dict()
    rows = []
    for section, figure, path in _paths(json_a, json_b):
        va, vb = _get(json_a, path), _get(json_b, path)
        if va is None and vb is None:
            continue
        ratio = vb / va if va and vb is not None else None
        rows.append({"section": section, "figure": figure, "a": va, "b": vb, "ratio": ratio})
    return rows


def _fmt(value: Optional[float]) -> str:
    if value is None:
        return "-"
    if value == int(value) or abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:,.3g}" if abs(value) < 1 else f"{value:,.2f}"


def compare_table(rows: list[dict[str, Any]], label_a: str, label_b: str) -> Table:
    """The rows as a rich table, one block per section."""
    table = Table(title=f"B / A   (A: {label_a}   B: {label_b})", title_justify="left")
    for name, justify in (("section", "left"), ("figure", "left"), ("A", "right"), ("B", "right"), ("B/A", "right")):
        table.add_column(name, justify=justify)
    last = None
    for row in rows:
        section = row["section"] if row["section"] != last else ""
        if row["section"] != last and last is not None:
            table.add_section()
        last = row["section"]
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.3f}"
        table.add_row(section, row["figure"], _fmt(row["a"]), _fmt(row["b"]), ratio)
    return table
