"""The figures of a run, computed from its records: per call (with `vllm bench serve` field names),
per task (overall and per task class), the breakdown of task time, goodput against the SLO, errors.

Everything is computed from the call and task records (plus the ITL histogram, the only figure that
needs more than a record holds), so a summary rebuilt from the JSONL files after a crash is the same
as the one written at the end of the run.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Iterable, Optional

from hdrh.histogram import HdrHistogram

from . import histograms as H
from .records import CallRecord, TaskRecord
from ..errors import InputError
from . import results
from .results import Window
from .slo import PERCENTILE_KEYS, PercentileTarget, Slo

SUMMARY_VERSION = 1


def summarize(
    calls: Iterable[CallRecord],
    tasks: Iterable[TaskRecord],
    *,
    itl: Optional[HdrHistogram] = None,
    window: Window = Window(),
    slo: Slo = Slo(),
    planned: Optional[dict[str, int]] = None,
    partial: bool = False,
    stop_reason: str = "completed",
) -> tuple[dict[str, Any], dict[str, HdrHistogram]]:
    """(summary dict, histograms by name). `planned` holds the workload's counts (tasks, calls, subtasks)."""
    calls = list(calls)
    tasks = list(tasks)
    counted_calls = [c for c in calls if window.contains(c.intended_send)]
    ok_calls = [c for c in counted_calls if c.ok]
    top_tasks = [t for t in tasks if t.parent_id is None]
    counted_tasks = [t for t in top_tasks if window.contains(t.arrival)]

    hist: dict[str, HdrHistogram] = {
        "ttft": H.from_seconds(c.ttft for c in ok_calls if c.ttft is not None),
        "tpot": H.from_seconds(c.tpot for c in ok_calls if c.tpot is not None),
        "itl": itl if itl is not None else _approx_itl(ok_calls),
        "e2el": H.from_seconds(c.latency for c in ok_calls),
        "client_lag": H.from_seconds(c.client_lag for c in counted_calls),
        "task_completion": H.from_seconds(t.completion_time for t in counted_tasks if t.ok),
    }
    by_class: dict[str, list[TaskRecord]] = defaultdict(list)
    for t in counted_tasks:
        by_class[t.task_class].append(t)
    for name, group in sorted(by_class.items()):
        hist[f"task_completion[{name}]"] = H.from_seconds(t.completion_time for t in group if t.ok)

    ends = [c.end for c in counted_calls] + [t.end for t in counted_tasks]
    duration = max(0.0, max(ends, default=window.start) - window.start)
    per_s = (lambda n: n / duration) if duration > 0 else (lambda n: 0.0)

    total_in = sum(c.input_tokens for c in ok_calls)
    total_out = sum(c.output_tokens for c in ok_calls)
    summary: dict[str, Any] = {
        "agentload_summary": SUMMARY_VERSION,
        "partial": partial,
        "stop_reason": stop_reason,
        "duration": duration,
        "window": {"start": window.start, "end": window.end},
        "completed": len(ok_calls),
        "failed": sum(1 for c in counted_calls if not c.ok),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": per_s(len(ok_calls)),
        "output_throughput": per_s(total_out),
        "total_token_throughput": per_s(total_in + total_out),
    }
    cached = [c.cached_tokens for c in ok_calls if c.cached_tokens is not None]
    if cached:
        summary["total_cached_tokens"] = sum(cached)
    for metric in ("ttft", "tpot", "itl", "e2el"):
        stats = H.stats_ms(hist[metric])
        summary[f"mean_{metric}_ms"] = stats["mean"]
        summary[f"median_{metric}_ms"] = stats["median"]
        summary[f"std_{metric}_ms"] = stats["std"]
        for p in H.PERCENTILES:
            summary[f"{H.percentile_name(p)}_{metric}_ms"] = stats[H.percentile_name(p)]
    lag = H.stats_ms(hist["client_lag"])
    summary["client_lag_ms"] = {k: lag[k] for k in ("mean", "p50", "p99", "max")}
    summary["errors"] = dict(Counter(c.error_class or "unknown" for c in calls if not c.ok).most_common())
    summary["calls"] = _call_accounting(calls, counted_calls, planned)
    summary["tasks"] = _task_section(tasks, top_tasks, counted_tasks, by_class, hist, duration, slo, planned)
    summary["slo"] = _slo_section(slo, hist, ok_calls, counted_tasks, duration)
    return summary, hist


def _approx_itl(ok_calls: list[CallRecord]) -> HdrHistogram:
    """Without the live ITL histogram (a crash before it was saved): each call's mean gap, weighted."""
    h = H.new_histogram()
    for c in ok_calls:
        if c.itl_count and c.itl_mean is not None:
            H.record_seconds(h, c.itl_mean, c.itl_count)
    return h


def _call_accounting(calls: list[CallRecord], counted: list[CallRecord], planned: Optional[dict[str, int]]) -> dict[str, Any]:
    """Where every planned call went: done, or not done (its task failed, was cancelled or never started)."""
    done = {(c.task_id, c.call_index) for c in calls if c.ok}
    out = {
        "attempts": len(calls),
        "ok": len(done),
        "failed_attempts": sum(1 for c in calls if not c.ok and c.error_class != "cancelled"),
        "cancelled": sum(1 for c in calls if c.error_class == "cancelled"),
        "excluded_by_window": len(calls) - len(counted),
    }
    if planned is not None:
        out["planned"] = planned.get("calls", 0)
        out["not_done"] = out["planned"] - out["ok"]
    return out


def _stats_s(h: HdrHistogram) -> dict[str, float]:
    return {k: v / 1000 for k, v in H.stats_ms(h).items()}


def _task_section(
    tasks: list[TaskRecord],
    top: list[TaskRecord],
    counted: list[TaskRecord],
    by_class: dict[str, list[TaskRecord]],
    hist: dict[str, HdrHistogram],
    duration: float,
    slo: Slo,
    planned: Optional[dict[str, int]],
) -> dict[str, Any]:
    per_hour = (lambda n: n * 3600 / duration) if duration > 0 else (lambda n: 0.0)
    ok = [t for t in counted if t.ok]
    section: dict[str, Any] = {
        "completed": len(ok),
        "failed": sum(1 for t in counted if not t.ok and t.error_class != "cancelled"),
        "cancelled": sum(1 for t in counted if t.error_class == "cancelled"),
        "finished_all": len(top),
        "sub_tasks_finished": len(tasks) - len(top),
        "excluded_by_window": len(top) - len(counted),
        "throughput_per_hour": per_hour(len(ok)),
        "completion_time_s": _stats_s(hist["task_completion"]),
        "breakdown_s": _breakdown(ok),
        "by_class": {},
    }
    if planned is not None:
        section["planned"] = planned.get("tasks", 0)
        section["not_started"] = max(0, section["planned"] - len(top))
    bound = slo.task_s.item_bound() if slo.task_s else None
    if bound is not None:
        good = sum(1 for t in ok if t.completion_time <= bound)
        section["goodput_per_hour"] = per_hour(good)
        section["slo_met_share"] = good / len(counted) if counted else 0.0
    for name, group in sorted(by_class.items()):
        good_group = [t for t in group if t.ok]
        entry = {
            "completed": len(good_group),
            "failed": len(group) - len(good_group),
            "throughput_per_hour": per_hour(len(good_group)),
            "completion_time_s": _stats_s(hist[f"task_completion[{name}]"]),
        }
        if bound is not None:
            entry["goodput_per_hour"] = per_hour(sum(1 for t in good_group if t.completion_time <= bound))
        section["by_class"][name] = entry
    return section


def _breakdown(tasks: list[TaskRecord]) -> dict[str, float]:
    """Mean seconds per completed task: in calls (before first token / decoding), in gaps, client lag,
    and the rest (waiting for sub-agents)."""
    n = len(tasks)
    if n == 0:
        return {"total": 0.0, "in_calls": 0.0, "ttft": 0.0, "decode": 0.0, "gaps": 0.0, "client_lag": 0.0, "other": 0.0}
    total = sum(t.completion_time for t in tasks) / n
    in_calls = sum(t.time_in_calls for t in tasks) / n
    ttft = sum(t.time_in_ttft for t in tasks) / n
    gaps = sum(t.time_in_gaps for t in tasks) / n
    lag = sum(t.client_lag for t in tasks) / n
    return {
        "total": total,
        "in_calls": in_calls,
        "ttft": ttft,
        "decode": in_calls - ttft,
        "gaps": gaps,
        "client_lag": lag,
        "other": max(0.0, total - in_calls - gaps - lag),
    }


def _slo_section(slo: Slo, hist: dict[str, HdrHistogram], ok_calls: list[CallRecord],
                 counted_tasks: list[TaskRecord], duration: float) -> dict[str, Any]:
    """Per target: each percentile measured against its bound; per call: share meeting TTFT/TPOT."""
    out: dict[str, Any] = {}
    targets: list[tuple[str, Optional[PercentileTarget], HdrHistogram, float]] = [
        ("ttft_ms", slo.ttft_ms, hist["ttft"], 1000.0),
        ("tpot_ms", slo.tpot_ms, hist["tpot"], 1000.0),
        ("task_s", slo.task_s, hist["task_completion"], 1e6),
    ]
    for name, target, h, us_per_unit in targets:
        if target is None:
            continue
        checks = {}
        for key, bound in target.bounds().items():
            measured = h.get_value_at_percentile(PERCENTILE_KEYS[key]) / us_per_unit if h.get_total_count() else None
            checks[key] = {"bound": bound, "measured": measured, "met": measured is not None and measured <= bound}
        out[name] = {"percentiles": checks, "item_bound": target.item_bound(),
                     "met": all(c["met"] for c in checks.values())}
    if slo.ttft_ms or slo.tpot_ms:
        ttft_bound = slo.ttft_ms.item_bound() / 1000 if slo.ttft_ms else None
        tpot_bound = slo.tpot_ms.item_bound() / 1000 if slo.tpot_ms else None

        def good(c: CallRecord) -> bool:
            if ttft_bound is not None and (c.ttft is None or c.ttft > ttft_bound):
                return False
            return tpot_bound is None or c.tpot is None or c.tpot <= tpot_bound

        n = len(ok_calls)
        if ttft_bound is not None:
            out["calls_meeting_ttft"] = sum(1 for c in ok_calls if c.ttft is not None and c.ttft <= ttft_bound) / n if n else 0.0
        if tpot_bound is not None:
            out["calls_meeting_tpot"] = sum(1 for c in ok_calls if c.tpot is None or c.tpot <= tpot_bound) / n if n else 0.0
        good_n = sum(1 for c in ok_calls if good(c))
        out["calls_meeting_all"] = good_n / n if n else 0.0
        out["call_goodput"] = good_n / duration if duration > 0 else 0.0
    return out


def rebuild(folder: Path) -> dict[str, Any]:
    """A summary from the records of a result folder whose summary.json is missing (after a crash)."""
    folder = Path(folder)
    info = results.read_json(folder, results.RUN_FILE)
    if info is None and not (folder / results.CALLS_FILE).exists():
        raise InputError("not a result folder (no run.json, summary.json or calls.jsonl)", file=str(folder))
    info = info or {}
    win = info.get("window") or {}
    slo = Slo.model_validate((info.get("settings") or {}).get("slo") or {})
    itl = None
    if (folder / results.HISTOGRAMS_FILE).exists():
        itl = H.load(folder / results.HISTOGRAMS_FILE).get("itl")
    summary, _ = summarize(
        results.read_calls(folder), results.read_tasks(folder), itl=itl,
        window=Window(win.get("start", 0.0), win.get("end")), slo=slo, planned=info.get("planned"),
        partial=True, stop_reason="rebuilt from records (no summary.json)",
    )
    summary["scenario"] = info.get("scenario", folder.name)
    summary["result_dir"] = str(folder)
    return summary


def load_summary(folder: Path) -> dict[str, Any]:
    """A result folder's summary: its summary.json, or rebuilt from its records when that is missing."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError("no such result folder", file=str(folder))
    summary = results.read_json(folder, results.SUMMARY_FILE)
    return summary if summary is not None else rebuild(folder)
