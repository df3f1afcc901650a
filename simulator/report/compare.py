"""Result folders side by side (a real run and its simulation, or several server configs): the same
figures from each `summary.json`, with the ratio of each to the first folder's, and a check that the
folders replayed the same workload. A figure is named by its path in summary.json, so a summary that
lacks it (an older version's) just leaves its cell empty."""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Optional, Sequence

from rich import box
from rich.table import Table

from ..metrics.folder import RUN_KEYS_OUTSIDE_FINGERPRINT
from ..metrics.summary import Summary
from .cells import lookup

CALL_METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "end to end"))
STATS = ("mean", "p50", "p90", "p95", "p99", "p99.9")
BREAKDOWN = ("ttft", "decode", "gaps", "client_lag", "other")


def figure_paths(summaries: Sequence[Mapping[str, Any]]) -> Iterator[tuple[str, str, tuple[str, ...], Optional[bool]]]:
    """(section, figure, path in summary.json, whether higher is better: None when neither) of every
    figure compared; per-class rows for the classes every summary has."""
    yield "throughput", "output tokens/s", ("output_throughput",), True
    yield "throughput", "calls/s", ("request_throughput",), True
    yield "throughput", "tasks/hour", ("tasks", "throughput_per_hour"), True
    yield "throughput", "tasks/hour within SLO", ("tasks", "goodput_per_hour"), True
    for key, label in CALL_METRICS:
        for stat in STATS:
            yield "per call (ms)", f"{label} {stat}", (f"{stat}_{key}_ms",), False
    for stat in STATS:
        yield "per task (s)", f"completion {stat}", ("tasks", "completion_time_s", stat), False
    for part in BREAKDOWN:
        yield "per task (s)", f"mean time in {part.replace('_', ' ')}", ("tasks", "breakdown_s", part), (
            None if part == "gaps" else False)
    class_sets = [set((s.get("tasks") or {}).get("by_class") or {}) for s in summaries]
    classes = sorted(set.intersection(*class_sets)) if class_sets else []
    if len(classes) > 1:
        for name in classes:
            for stat in ("p50", "p95"):
                yield ("per task class (s)", f"{name} completion {stat}",
                       ("tasks", "by_class", name, "completion_time_s", stat), False)
    yield "cache and errors", "cached prompt tokens", ("total_cached_tokens",), True
    yield "cache and errors", "calls completed", ("completed",), True
    yield "cache and errors", "failed call attempts", ("calls", "failed_attempts"), False
    yield "cache and errors", "tasks failed", ("tasks", "failed"), False


def compare_many(summaries: Sequence[Summary]) -> list[dict[str, Any]]:
    """One row per figure present in any summary: section, figure, path, higher_is_better, values (one
    per summary, None when missing) and ratios to the first (None when either is missing or the first
    is 0; the first's own ratio is None)."""
    data = [s.to_dict() for s in summaries]
    rows = []
    for section, figure, path, better in figure_paths(data):
        values = [lookup(d, path) for d in data]
        if all(v is None for v in values):
            continue
        first = values[0]
        ratios = [None] + [v / first if first and v is not None else None for v in values[1:]]
        rows.append({"section": section, "figure": figure, "path": list(path), "higher_is_better": better,
                     "values": values, "ratios": ratios})
    return rows


def compare_summaries(a: Summary, b: Summary) -> list[dict[str, Any]]:
    """Two summaries: one row per figure present in either: section, figure, a, b, ratio b/a (None when
    either is missing or a is 0)."""
    return [{"section": r["section"], "figure": r["figure"], "a": r["values"][0], "b": r["values"][1],
             "ratio": r["ratios"][1]} for r in compare_many([a, b])]


def _fmt(value: Optional[float]) -> str:
    if value is None:
        return "-"
    if value == int(value) or abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:,.3g}" if abs(value) < 1 else f"{value:,.2f}"


def letters(n: int) -> list[str]:
    """A, B, C, ... (then A2, B2, ... past Z) naming the folders of a comparison."""
    return [chr(ord("A") + i % 26) + (str(i // 26 + 1) if i >= 26 else "") for i in range(n)]


def compare_table(rows: list[dict[str, Any]], labels: Sequence[str]) -> Table:
    """The rows of `compare_many` as a rich table, one block per section: each folder's value, then the
    ratio of each other folder to the first."""
    names = letters(len(labels))
    title = "   ".join(f"{n}: {label}" for n, label in zip(names, labels))
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("section")
    table.add_column("figure")
    for name in names:
        table.add_column(name, justify="right")
    for name in names[1:]:
        table.add_column(f"{name}/{names[0]}", justify="right")
    last = None
    for row in rows:
        if row["section"] != last and last is not None:
            table.add_section()
        section = row["section"] if row["section"] != last else ""
        last = row["section"]
        ratios = ["-" if r is None else f"{r:.3f}" for r in row["ratios"][1:]]
        table.add_row(section, row["figure"], *(_fmt(v) for v in row["values"]), *ratios)
    return table


def _run_settings(info: Mapping[str, Any]) -> dict[str, Any]:
    run = (info.get("settings") or {}).get("run") or {}
    return {k: v for k, v in run.items() if k not in RUN_KEYS_OUTSIDE_FINGERPRINT}


def _counts(info: Mapping[str, Any]) -> str:
    planned = info.get("planned") or {}
    return f"{planned.get('tasks', '?')} tasks, {planned.get('calls', '?')} calls"


def workload_warnings(infos: Sequence[Mapping[str, Any]], labels: Sequence[str]) -> list[str]:
    """What keeps the folders (their run.json) from being compared figure for figure: a folder without
    a fingerprint, a different workload, other run settings, another SLO; each against the first."""
    warnings = []
    first, first_label = infos[0], labels[0]
    first_print = first.get("fingerprint") or {}
    for info, label in zip(infos, labels):
        if not info.get("fingerprint"):
            warnings.append(f"{label} has no workload fingerprint in its run.json (written by an older "
                            "agentload, or no run.json): whether it replayed the same workload cannot be checked.")
    for info, label in zip(infos[1:], labels[1:]):
        fingerprint = info.get("fingerprint") or {}
        if not fingerprint or not first_print:
            continue
        if fingerprint.get("workload") != first_print.get("workload"):
            counts, first_counts = _counts(info), _counts(first)
            how = (f"the same counts ({counts}) but other arrivals, calls or prefixes" if counts == first_counts
                   else f"{counts} against {first_counts}")
            warnings.append(f"{label} replayed a different workload from {first_label} ({how}): its task and "
                            "call figures are not of the same tasks and calls.")
        if fingerprint.get("run") != first_print.get("run"):
            a, b = _run_settings(first), _run_settings(info)
            changed = ", ".join(f"{key} {a.get(key)!r} → {b.get(key)!r}" for key in sorted(set(a) | set(b))
                                if a.get(key) != b.get(key))
            warnings.append(f"{label} ran with other run settings than {first_label}"
                            + (f": {changed}." if changed else "."))
        if fingerprint.get("slo") != first_print.get("slo"):
            warnings.append(f"{label} was judged against another SLO than {first_label}: its goodput and SLO "
                            "figures answer another question.")
    return warnings
