"""Result folders side by side (a real run and its simulation, or several server configs): the same
figures from each `summary.json`, with the ratio of each to the first folder's, a mark on a folder with
partial results, and a check that the folders replayed the same workload. Ratios far from 1 are
highlighted without a verdict (see `ratio_legend`). A figure is named by its path in summary.json, so
a summary that lacks it (an older version's) just leaves its cell empty."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Sequence

from rich import box
from rich.table import Table
from rich.text import Text

from ..metrics import results
from ..metrics.folder import RUN_KEYS_OUTSIDE_FINGERPRINT
from ..metrics.summary import Summary, load_summary
from .cells import DEVIATION, band_range, deviates, lookup, number, ratio_text
from . import energy
from .partial import partial_state

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
    for key, label, higher in (("judged", "judged (arrived in the window)", None), ("completed", "completed", True),
                               ("failed", "failed", False), ("cancelled", "cancelled", False),
                               ("interrupted", "interrupted", False), ("not_started", "not started", False)):
        yield "tasks judged", f"tasks {label}", ("tasks", key), higher
    if any(s.get("fleet") for s in summaries):
        yield "fleet", "prefix-hit share (replicas' /metrics)", ("fleet", "prefix_hit_share"), True
        yield "fleet", "imbalance (most calls on one replica / mean)", ("fleet", "imbalance"), False
        yield "fleet", "share of tasks that moved replica", ("fleet", "moves", "moved_share"), False
    if any(s.get("energy") for s in summaries):
        for key, label, unit in energy.ROWS[:3]:
            yield "energy", f"{label} ({unit})", ("energy", key), False


def compare_many(summaries: Sequence[Summary]) -> list[dict[str, Any]]:
    """One row per figure present in any summary: section, figure, path, higher_is_better, values (one
    per summary, None when missing), ratios to the first (None when either is missing or the first
    is 0; the first's own ratio is None), each summary's band of the figure (a simulation's
    ``simulation.band``: {low, high}, None without one) and whether each folder's figure is within
    the band of the first's (`within_band`; the first's own is None)."""
    data = [s.to_dict() for s in summaries]
    rows = []
    for section, figure, path, better in figure_paths(data):
        values = [lookup(d, path) for d in data]
        if all(v is None for v in values):
            continue
        first = values[0]
        ratios = [None] + [v / first if first and v is not None else None for v in values[1:]]
        bands = [band_of(s, path) for s in summaries]
        within = [None] + [within_band(values[0], bands[0], v, b) for v, b in zip(values[1:], bands[1:])]
        rows.append({"section": section, "figure": figure, "path": list(path), "higher_is_better": better,
                     "values": values, "ratios": ratios, "bands": bands, "within_band": within})
    return rows


def band_of(summary: Summary, path: Sequence[str]) -> Optional[dict[str, float]]:
    """{low, high} of the figure at `path` in a simulation's band (None: the summary has no band of it)."""
    band = summary.simulation.band if summary.simulation is not None else None
    figure = band.figures.get(".".join(path)) if band is not None else None
    return None if figure is None else {"low": figure.low, "high": figure.high}


def within_band(a: Optional[float], band_a: Optional[Mapping[str, float]], b: Optional[float],
                band_b: Optional[Mapping[str, float]]) -> Optional[bool]:
    """Whether two folders' figures lie within the twin's band: their ranges overlap, a folder without a
    band counting as its value alone (a live run's figure inside a simulation's band). None when
    neither has a band of the figure, or a value is missing."""
    if (band_a is None and band_b is None) or a is None or b is None:
        return None
    low_a, high_a = (band_a["low"], band_a["high"]) if band_a is not None else (a, a)
    low_b, high_b = (band_b["low"], band_b["high"]) if band_b is not None else (b, b)
    return max(low_a, low_b) <= min(high_a, high_b)


def band_legend() -> str:
    """What a band beside a figure and the within-band mark mean, said under a comparison that has one."""
    return ("A simulation's figure shows its band in brackets: the lowest and highest over the nominal simulation "
            "and its draws from the calibration's fit (the range of 1 + K simulations, not a confidence "
            f"interval). A ratio marked{BAND_MARK} is within the band: the two folders' ranges of the figure "
            "overlap (a folder without a band counting as its value alone), a difference the twin's own "
            "uncertainty could make.")


def compare_summaries(a: Summary, b: Summary) -> list[dict[str, Any]]:
    """Two summaries: one row per figure present in either: section, figure, a, b, ratio b/a (None when
    either is missing or a is 0)."""
    return [{"section": r["section"], "figure": r["figure"], "a": r["values"][0], "b": r["values"][1],
             "ratio": r["ratios"][1]} for r in compare_many([a, b])]


def letters(n: int) -> list[str]:
    """A, B, C, ... (then A2, B2, ... past Z) naming the folders of a comparison."""
    return [chr(ord("A") + i % 26) + (str(i // 26 + 1) if i >= 26 else "") for i in range(n)]


def better(higher_is_better: Optional[bool]) -> str:
    """Which way a figure is better: 'higher', 'lower', or '' when neither (tool and think time)."""
    return "" if higher_is_better is None else "higher" if higher_is_better else "lower"


def ratio_legend(marked: str = "highlighted") -> str:
    """What the marking of the ratios means, said under every comparison (`marked`: how they are marked)."""
    return (f"Ratios more than {DEVIATION:.0%} away from 1 are {marked}, in neither direction: a difference worth "
            "a look, not a verdict. One run per folder cannot tell a difference between servers from run-to-run "
            "noise (repeat the runs, e.g. a study with repeats, to judge one); between a run and its simulation a "
            "ratio holds the twin's error and the run's noise. 'better' says only which way a figure is better.")


RATIO_MARK = " *"
"""What follows a ratio past `DEVIATION` in the terminal (bold does not reach a CI log)."""
BAND_MARK = " ~"
"""What follows a ratio whose two figures are within the band (`within_band`), in every view."""


def banded_number(value: Optional[float], band: Optional[Mapping[str, float]]) -> str:
    """A folder's figure, its band after it in brackets where it has one: '2.41 [2.18–2.73]'."""
    text = number(value)
    return text if band is None else f"{text} {band_range(band['low'], band['high'])}"


def folder_titles(labels: Sequence[str], states: Sequence[Optional[str]]) -> list[str]:
    """'A: label', with ' — PARTIAL (...): ...' for a folder with partial results."""
    return [f"{name}: {label}" + (f" — {state}" if state else "")
            for name, label, state in zip(letters(len(labels)), labels, states)]


def compare_table(rows: list[dict[str, Any]], labels: Sequence[str],
                  states: Optional[Sequence[Optional[str]]] = None) -> Table:
    """The rows of `compare_many` as a rich table, one block per section: each folder's value, then the
    ratio of each other folder to the first (bold past `DEVIATION`, never green or red), and which way
    the figure is better. The title names the folders and marks those with partial results (`states`,
    from `partial.partial_state`)."""
    names = letters(len(labels))
    title = "   ".join(folder_titles(labels, states or [None] * len(labels)))
    banded = any(b is not None for row in rows for b in row.get("bands") or ())
    caption = ratio_legend(f"marked{RATIO_MARK} (and bold)") + (" " + band_legend() if banded else "")
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, caption=caption, caption_justify="left")
    body = []
    for row in rows:
        values = [banded_number(v, b) for v, b in zip(row["values"], row.get("bands") or [None] * len(row["values"]))]
        marks = [(BAND_MARK if w else " " * len(BAND_MARK)) if banded else ""
                 for w in (row.get("within_band") or [None] * len(row["values"]))[1:]]
        ratios = [Text("-" + " " * len(RATIO_MARK) + m) if r is None else
                  Text(ratio_text(r) + RATIO_MARK + m, style="bold") if deviates(r) else
                  Text(ratio_text(r) + " " * len(RATIO_MARK) + m) for r, m in zip(row["ratios"][1:], marks)]
        body.append((row, values, ratios))
    # a section is a row of its own, so the figures get the width; numbers keep their whole width on a
    # narrow terminal (the figure names wrap instead)
    table.add_column("figure", min_width=16, ratio=1)
    for i, name in enumerate(names):
        table.add_column(name, justify="right", no_wrap=True,
                         min_width=max([len(name), *(len(values[i]) for _, values, _ in body)]))
    for i, name in enumerate(names[1:]):
        table.add_column(f"{name}/{names[0]}", justify="right", no_wrap=True,
                         min_width=max([len(name) + 3, *(len(ratios[i]) for _, _, ratios in body)]))
    table.add_column("better", no_wrap=True, min_width=6)
    last = None
    for row, values, ratios in body:
        if row["section"] != last:
            if last is not None:
                table.add_section()
            table.add_row(Text(row["section"], style="bold"))
            last = row["section"]
        table.add_row(Text("  " + row["figure"]), *values, *ratios, better(row["higher_is_better"]))
    return table


def folder_states(summaries: Sequence[Summary]) -> list[Optional[str]]:
    """Each folder's `partial_state` (None for a run that completed)."""
    return [partial_state(s) for s in summaries]


def partial_warnings(labels: Sequence[str], states: Sequence[Optional[str]]) -> list[str]:
    """A line per folder with partial results: which, and how many of its judged tasks did not complete."""
    return [f"{name} ({label}): {state}. Its figures count what it measured before it stopped; every judged "
            "task that did not complete counts against its task SLO."
            for name, label, state in zip(letters(len(labels)), labels, states) if state]


def comparison(folders: Sequence[Path], labels: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """What `compare` (and `report` of several folders) prints: the folders, each one's partial state,
    the warnings (partial folders, then what keeps them from being compared figure for figure) and the
    rows; for two folders also a, b and each row's ratio b/a. `labels`: the folders' short names (by
    default `folder_data.folder_labels`)."""
    if labels is None:
        from .folder_data import folder_labels

        labels = folder_labels(folders)
    summaries = [load_summary(f) for f in folders]
    states = folder_states(summaries)
    infos = [results.read_json(f, results.RUN_FILE) or {} for f in folders]
    rows = compare_many(summaries)
    out: dict[str, Any] = {"folders": [str(f) for f in folders], "labels": list(labels), "partial": states,
                           "warnings": partial_warnings(labels, states) + workload_warnings(infos, labels),
                           "ratio_highlight": DEVIATION, "rows": rows}
    if len(folders) == 2:  # the two-folder shape: a, b and ratio b/a in each row
        out.update(a=str(folders[0]), b=str(folders[1]))
        for row in rows:
            row.update(a=row["values"][0], b=row["values"][1], ratio=row["ratios"][1])
    return out


def print_comparison(folders: Sequence[Path], as_json: bool, console: Any) -> None:
    """Print the comparison of `folders` (as JSON, or on `console` a table titled with the folders as
    given, then its warnings)."""
    data = comparison(folders)
    if as_json:
        print(json.dumps(data, indent=1))
        return
    table = compare_table(data["rows"], [str(f) for f in folders], data["partial"])
    # wider than the terminal rather than a number cut: the table's narrowest layout sets the width
    # (each column's least width and padding, the table's edges, a separator between columns)
    need = sum((column.min_width or 0) + 2 for column in table.columns) + 2 + len(table.columns) - 1
    width = console.width
    console.width = max(width, need)
    try:
        console.print(table)
    finally:
        console.width = width
    for warning in data["warnings"]:
        console.print(f"warning: {warning}", style="yellow", highlight=False, markup=False)


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
