"""The figures of a run, computed from its records: per call (with `vllm bench serve` field names),
per task (overall and per task class), the breakdown of task time, goodput against the SLO, errors.

Everything is computed from the call and task records (plus the ITL histogram, the only figure that
needs more than a record holds), so a summary rebuilt from the JSONL files after a crash is the same
as the one written at the end of the run.

The summary is a typed `Summary`; its `to_dict()` is summary.json. Every figure has a default, so a
summary.json written by an older version (or by hand, with a few figures) loads, and a part is written
only when it was set: a summary dumps to the keys it was built or loaded with.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Self

from hdrh.histogram import HdrHistogram
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_serializer, model_validator

from . import histograms as H
from . import results
from ..errors import InputError
from .records import CallRecord, TaskRecord
from .results import Window
from .slo import PERCENTILE_KEYS, PercentileTarget, Slo

SUMMARY_VERSION = 1

CALL_METRICS = ("ttft", "tpot", "itl", "e2el")
"""The per-call latencies, each written flat as ``{stat}_{metric}_ms`` (vLLM's names)."""


class Figures(BaseModel):
    """A part of the summary. Keys it does not know are kept (a summary.json from a newer version loads
    and dumps whole); fields whose JSON name is no identifier ('p99.9') have it as their alias."""

    model_config = ConfigDict(extra="allow", validate_by_name=True, validate_by_alias=True,
                              serialize_by_alias=True, use_attribute_docstrings=True)

    @classmethod
    def pick(cls, values: Mapping[str, Any]) -> Self:
        """This part with its figures taken from `values` by their JSON names (other keys ignored)."""
        return cls.model_validate({name: values[name] for name in
                                   (f.alias or key for key, f in cls.model_fields.items())})

    def to_dict(self) -> dict[str, Any]:
        """The part as summary.json holds it: the figures that were set, in field order."""
        return self.model_dump(mode="python", exclude_unset=True)


class CallLatency(Figures):
    """One per-call latency over the counted calls, milliseconds."""

    mean: float = 0.0
    median: float = 0.0
    std: float = 0.0
    p50: float = 0.0
    p90: float = 0.0
    p95: float = 0.0
    p99: float = 0.0
    p99_9: float = Field(0.0, alias="p99.9")


class ClientLag(Figures):
    """Actual minus intended send of the counted calls, milliseconds."""

    mean: float = 0.0
    p50: float = 0.0
    p99: float = 0.0
    max: float = 0.0


class TimeStats(Figures):
    """A distribution in seconds (task completion time)."""

    mean: float = 0.0
    std: float = 0.0
    median: float = 0.0
    max: float = 0.0
    p50: float = 0.0
    p90: float = 0.0
    p95: float = 0.0
    p99: float = 0.0
    p99_9: float = Field(0.0, alias="p99.9")


class CallAccounting(Figures):
    """Where every planned call went: done, or not done (its task failed, was cancelled or never started)."""

    attempts: int = 0
    ok: int = 0
    """Calls done (distinct task and call index with a successful attempt)."""
    failed_attempts: int = 0
    cancelled: int = 0
    excluded_by_window: int = 0
    planned: Optional[int] = None
    not_done: Optional[int] = None


class Breakdown(Figures):
    """Mean seconds per completed task: in calls (before first token / decoding), in gaps, client lag,
    and the rest (waiting for sub-agents)."""

    total: float = 0.0
    in_calls: float = 0.0
    ttft: float = 0.0
    decode: float = 0.0
    gaps: float = 0.0
    client_lag: float = 0.0
    other: float = 0.0


class TaskClassFigures(Figures):
    """The counted tasks of one task class."""

    completed: int = 0
    failed: int = 0
    throughput_per_hour: float = 0.0
    completion_time_s: TimeStats = TimeStats()
    goodput_per_hour: Optional[float] = None
    """Completed within the task SLO's per-item bound, per hour (with a task SLO)."""


class TaskFigures(Figures):
    """The top-level tasks: counts, throughput, completion time, its breakdown, per class, goodput."""

    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    finished_all: int = 0
    """Top-level tasks that ended, inside the window or not."""
    sub_tasks_finished: int = 0
    excluded_by_window: int = 0
    throughput_per_hour: float = 0.0
    completion_time_s: TimeStats = TimeStats()
    breakdown_s: Breakdown = Breakdown()
    by_class: dict[str, TaskClassFigures] = {}
    planned: Optional[int] = None
    not_started: Optional[int] = None
    goodput_per_hour: Optional[float] = None
    slo_met_share: Optional[float] = None
    """Share of the counted tasks completed within the task SLO's per-item bound."""


class PercentileCheck(Figures):
    """One percentile of a measure against its bound (in the target's unit)."""

    bound: float = 0.0
    measured: Optional[float] = None
    """None when nothing was measured."""
    met: bool = False


class TargetCheck(Figures):
    """One SLO target: each of its percentiles checked, and the per-item bound goodput uses."""

    percentiles: dict[str, PercentileCheck] = {}
    item_bound: float = 0.0
    met: bool = False


class SloFigures(Figures):
    """The run against its SLO: each target given, and the shares of calls within the per-call bounds."""

    ttft_ms: Optional[TargetCheck] = None
    tpot_ms: Optional[TargetCheck] = None
    task_s: Optional[TargetCheck] = None
    calls_meeting_ttft: Optional[float] = None
    calls_meeting_tpot: Optional[float] = None
    calls_meeting_all: Optional[float] = None
    call_goodput: Optional[float] = None
    """Calls per second meeting every per-call bound."""


class SimulationStats(Figures):
    """What the twin did in a simulated run (`agentload simulate`)."""

    profile: str = ""
    calibrated: bool = False
    simulated_seconds: float = 0.0
    wall_seconds: float = 0.0
    steps: int = 0
    preemptions: int = 0
    prefill_tokens: int = 0
    cached_prompt_tokens: int = 0
    kv_evicted_blocks: int = 0
    max_running: int = 0
    busy_fraction: float = 0.0


class Summary(Figures):
    """The figures of a run (summary.json). The per-call latencies are the parts `ttft`, `tpot`, `itl`
    and `e2el` here and flat in JSON (``mean_ttft_ms``, ``p99.9_ttft_ms``, ...), as vLLM names them.
    ``summary["p99.9_ttft_ms"]`` reads a figure by its summary.json name."""

    agentload_summary: int = SUMMARY_VERSION
    partial: bool = False
    stop_reason: str = "completed"
    duration: float = 0.0
    """Seconds from the window's start to the last counted call or task end."""
    window: Window = Window()
    completed: int = 0
    """Calls completed in the window."""
    failed: int = 0
    total_input_tokens: int = 0
    total_output_tokens: int = 0
    request_throughput: float = 0.0
    output_throughput: float = 0.0
    total_token_throughput: float = 0.0
    total_cached_tokens: Optional[int] = None
    """Set when the server reported cached prompt tokens."""
    ttft: CallLatency = CallLatency()
    tpot: CallLatency = CallLatency()
    itl: CallLatency = CallLatency()
    e2el: CallLatency = CallLatency()
    client_lag_ms: ClientLag = ClientLag()
    errors: dict[str, int] = {}
    """Failed attempts (all, not only the window's) by error class, most frequent first."""
    calls: CallAccounting = CallAccounting()
    tasks: TaskFigures = TaskFigures()
    slo: SloFigures = SloFigures()
    # the sections the runners add
    scenario: Optional[str] = None
    simulation: Optional[SimulationStats] = None
    result_dir: Optional[str] = None
    server: Optional[dict[str, Any]] = None
    """The server's /metrics timeline and per-task load (`simulator.metrics.server.server_section`)."""

    @model_validator(mode="before")
    @classmethod
    def _nest_call_latencies(cls, data: Any) -> Any:
        if not isinstance(data, Mapping) or any(metric in data for metric in CALL_METRICS):
            return data
        data = dict(data)
        for metric in CALL_METRICS:
            suffix = f"_{metric}_ms"
            flat = [key for key in data if key.endswith(suffix)]
            if flat:
                data[metric] = {key.removesuffix(suffix): data.pop(key) for key in flat}
        return data

    @model_serializer(mode="wrap")
    def _flatten_call_latencies(self, handler: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in handler(self).items():
            if key in CALL_METRICS and isinstance(value, dict):
                out.update((f"{stat}_{key}_ms", v) for stat, v in value.items())
            else:
                out[key] = value
        return out

    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def __contains__(self, key: object) -> bool:
        return key in self.to_dict()


# --- computing it ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Counted:
    """The records a summary counts: calls by intended send and top-level tasks by arrival within the
    window (all calls and tasks still go into the accounting), and the seconds they span."""

    calls: list[CallRecord]
    tasks: list[TaskRecord]
    window_calls: list[CallRecord]
    ok_calls: list[CallRecord]
    top_tasks: list[TaskRecord]
    window_tasks: list[TaskRecord]
    by_class: dict[str, list[TaskRecord]]
    """The window's tasks per class, classes sorted."""
    duration: float

    @classmethod
    def select(cls, calls: Iterable[CallRecord], tasks: Iterable[TaskRecord], window: Window) -> _Counted:
        calls, tasks = list(calls), list(tasks)
        window_calls = [c for c in calls if window.contains(c.intended_send)]
        top_tasks = [t for t in tasks if t.parent_id is None]
        window_tasks = [t for t in top_tasks if window.contains(t.arrival)]
        by_class: dict[str, list[TaskRecord]] = defaultdict(list)
        for t in window_tasks:
            by_class[t.task_class].append(t)
        ends = [c.end for c in window_calls] + [t.end for t in window_tasks]
        duration = max(0.0, max(ends, default=window.start) - window.start)
        return cls(calls, tasks, window_calls, [c for c in window_calls if c.ok], top_tasks, window_tasks,
                   dict(sorted(by_class.items())), duration)

    def per_second(self, n: float) -> float:
        return n / self.duration if self.duration > 0 else 0.0

    def per_hour(self, n: float) -> float:
        return n * 3600 / self.duration if self.duration > 0 else 0.0


def summarize(
    calls: Iterable[CallRecord],
    tasks: Iterable[TaskRecord],
    *,
    itl: Optional[HdrHistogram] = None,
    window: Window = Window(),
    slo: Slo = Slo(),
    planned: Optional[Mapping[str, int]] = None,
    partial: bool = False,
    stop_reason: str = "completed",
) -> tuple[Summary, dict[str, HdrHistogram]]:
    """(summary, histograms by name). `planned` holds the workload's counts (tasks, calls, subtasks);
    without the live `itl` histogram, ITL is approximated from each call's mean gap."""
    counted = _Counted.select(calls, tasks, window)
    hist = _histograms(counted, itl)
    ok = counted.ok_calls
    total_in = sum(c.input_tokens for c in ok)
    total_out = sum(c.output_tokens for c in ok)
    summary = Summary(
        agentload_summary=SUMMARY_VERSION, partial=partial, stop_reason=stop_reason,
        duration=counted.duration, window=window,
        completed=len(ok), failed=len(counted.window_calls) - len(ok),
        total_input_tokens=total_in, total_output_tokens=total_out,
        request_throughput=counted.per_second(len(ok)), output_throughput=counted.per_second(total_out),
        total_token_throughput=counted.per_second(total_in + total_out),
        **{metric: CallLatency.pick(H.stats_ms(hist[metric])) for metric in CALL_METRICS},
        client_lag_ms=ClientLag.pick(H.stats_ms(hist["client_lag"])),
        errors=_errors(counted.calls),
        calls=_call_accounting(counted, planned),
        tasks=_task_figures(counted, hist, slo, planned),
        slo=_slo_figures(counted, hist, slo),
    )
    cached = [c.cached_tokens for c in ok if c.cached_tokens is not None]
    if cached:
        summary.total_cached_tokens = sum(cached)
    return summary, hist


def _histograms(counted: _Counted, itl: Optional[HdrHistogram]) -> dict[str, HdrHistogram]:
    """The latency histograms the figures come from (saved as histograms.json)."""
    ok = counted.ok_calls
    hist = {
        "ttft": H.from_seconds(c.ttft for c in ok if c.ttft is not None),
        "tpot": H.from_seconds(c.tpot for c in ok if c.tpot is not None),
        "itl": itl if itl is not None else _approx_itl(ok),
        "e2el": H.from_seconds(c.latency for c in ok),
        "client_lag": H.from_seconds(c.client_lag for c in counted.window_calls),
        "task_completion": H.from_seconds(t.completion_time for t in counted.window_tasks if t.ok),
    }
    for name, group in counted.by_class.items():
        hist[f"task_completion[{name}]"] = H.from_seconds(t.completion_time for t in group if t.ok)
    return hist


def _approx_itl(ok_calls: list[CallRecord]) -> HdrHistogram:
    """Without the live ITL histogram (a crash before it was saved): each call's mean gap, weighted."""
    h = H.new_histogram()
    for c in ok_calls:
        if c.itl_count and c.itl_mean is not None:
            H.record_seconds(h, c.itl_mean, c.itl_count)
    return h


def _errors(calls: list[CallRecord]) -> dict[str, int]:
    """Failed attempts by error class, most frequent first."""
    return dict(Counter(c.error_class or "unknown" for c in calls if not c.ok).most_common())


def _call_accounting(counted: _Counted, planned: Optional[Mapping[str, int]]) -> CallAccounting:
    calls = counted.calls
    accounting = CallAccounting(
        attempts=len(calls),
        ok=len({(c.task_id, c.call_index) for c in calls if c.ok}),
        failed_attempts=sum(1 for c in calls if not c.ok and c.error_class != "cancelled"),
        cancelled=sum(1 for c in calls if c.error_class == "cancelled"),
        excluded_by_window=len(calls) - len(counted.window_calls),
    )
    if planned is not None:
        accounting.planned = planned.get("calls", 0)
        accounting.not_done = accounting.planned - accounting.ok
    return accounting


def _time_stats(h: HdrHistogram) -> TimeStats:
    return TimeStats.pick({k: v / 1000 for k, v in H.stats_ms(h).items()})


def _task_figures(counted: _Counted, hist: dict[str, HdrHistogram], slo: Slo,
                  planned: Optional[Mapping[str, int]]) -> TaskFigures:
    tasks, top, window = counted.tasks, counted.top_tasks, counted.window_tasks
    ok = [t for t in window if t.ok]
    bound = slo.task_s.item_bound() if slo.task_s else None
    figures = TaskFigures(
        completed=len(ok),
        failed=sum(1 for t in window if not t.ok and t.error_class != "cancelled"),
        cancelled=sum(1 for t in window if t.error_class == "cancelled"),
        finished_all=len(top),
        sub_tasks_finished=len(tasks) - len(top),
        excluded_by_window=len(top) - len(window),
        throughput_per_hour=counted.per_hour(len(ok)),
        completion_time_s=_time_stats(hist["task_completion"]),
        breakdown_s=_breakdown(ok),
        by_class={name: _class_figures(counted, group, hist[f"task_completion[{name}]"], bound)
                  for name, group in counted.by_class.items()},
    )
    if planned is not None:
        figures.planned = planned.get("tasks", 0)
        figures.not_started = max(0, figures.planned - len(top))
    if bound is not None:
        good = _within(ok, bound)
        figures.goodput_per_hour = counted.per_hour(good)
        figures.slo_met_share = good / len(window) if window else 0.0
    return figures


def _class_figures(counted: _Counted, group: list[TaskRecord], completion: HdrHistogram,
                   bound: Optional[float]) -> TaskClassFigures:
    ok = [t for t in group if t.ok]
    figures = TaskClassFigures(completed=len(ok), failed=len(group) - len(ok),
                               throughput_per_hour=counted.per_hour(len(ok)),
                               completion_time_s=_time_stats(completion))
    if bound is not None:
        figures.goodput_per_hour = counted.per_hour(_within(ok, bound))
    return figures


def _within(tasks: list[TaskRecord], bound: float) -> int:
    """How many of these tasks completed within `bound` seconds (task goodput)."""
    return sum(1 for t in tasks if t.completion_time <= bound)


def _breakdown(tasks: list[TaskRecord]) -> Breakdown:
    """Where the time of these (completed) tasks went, mean seconds per task."""
    n = len(tasks)
    if n == 0:
        return Breakdown(total=0.0, in_calls=0.0, ttft=0.0, decode=0.0, gaps=0.0, client_lag=0.0, other=0.0)
    total = sum(t.completion_time for t in tasks) / n
    in_calls = sum(t.time_in_calls for t in tasks) / n
    ttft = sum(t.time_in_ttft for t in tasks) / n
    gaps = sum(t.time_in_gaps for t in tasks) / n
    lag = sum(t.client_lag for t in tasks) / n
    return Breakdown(total=total, in_calls=in_calls, ttft=ttft, decode=in_calls - ttft, gaps=gaps,
                     client_lag=lag, other=max(0.0, total - in_calls - gaps - lag))


def _slo_figures(counted: _Counted, hist: dict[str, HdrHistogram], slo: Slo) -> SloFigures:
    """Per target: each percentile measured against its bound; per call: shares meeting TTFT/TPOT."""
    figures = SloFigures()
    for name, target, h, us_per_unit in (("ttft_ms", slo.ttft_ms, hist["ttft"], 1000.0),
                                         ("tpot_ms", slo.tpot_ms, hist["tpot"], 1000.0),
                                         ("task_s", slo.task_s, hist["task_completion"], 1e6)):
        if target is not None:
            setattr(figures, name, _target_check(target, h, us_per_unit))
    if slo.ttft_ms or slo.tpot_ms:
        _call_goodput(figures, counted, slo)
    return figures


def _target_check(target: PercentileTarget, h: HdrHistogram, us_per_unit: float) -> TargetCheck:
    checks = {}
    for key, bound in target.bounds().items():
        measured = h.get_value_at_percentile(PERCENTILE_KEYS[key]) / us_per_unit if h.get_total_count() else None
        checks[key] = PercentileCheck(bound=bound, measured=measured, met=measured is not None and measured <= bound)
    return TargetCheck(percentiles=checks, item_bound=target.item_bound(), met=all(c.met for c in checks.values()))


def _call_goodput(figures: SloFigures, counted: _Counted, slo: Slo) -> None:
    """The shares of the window's completed calls within the per-call TTFT and TPOT bounds, and the
    rate of those within all of them. A call without a TPOT (one output token) meets any TPOT bound."""
    ttft_bound = slo.ttft_ms.item_bound() / 1000 if slo.ttft_ms else None
    tpot_bound = slo.tpot_ms.item_bound() / 1000 if slo.tpot_ms else None

    def good(c: CallRecord) -> bool:
        if ttft_bound is not None and (c.ttft is None or c.ttft > ttft_bound):
            return False
        return tpot_bound is None or c.tpot is None or c.tpot <= tpot_bound

    ok = counted.ok_calls
    n = len(ok)
    if ttft_bound is not None:
        figures.calls_meeting_ttft = sum(1 for c in ok if c.ttft is not None and c.ttft <= ttft_bound) / n if n else 0.0
    if tpot_bound is not None:
        figures.calls_meeting_tpot = sum(1 for c in ok if c.tpot is None or c.tpot <= tpot_bound) / n if n else 0.0
    good_n = sum(1 for c in ok if good(c))
    figures.calls_meeting_all = good_n / n if n else 0.0
    figures.call_goodput = counted.per_second(good_n)


# --- reading it back ------------------------------------------------------------------------------


def rebuild(folder: Path) -> Summary:
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
    summary.scenario = info.get("scenario", folder.name)
    summary.result_dir = str(folder)
    return summary


def load_summary(folder: Path) -> Summary:
    """A result folder's summary: its summary.json, or rebuilt from its records when that is missing."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError("no such result folder", file=str(folder))
    data = results.read_json(folder, results.SUMMARY_FILE)
    if data is None:
        return rebuild(folder)
    try:
        return Summary.model_validate(data)
    except ValidationError as exc:
        raise InputError(f"bad summary: {exc}", file=str(folder / results.SUMMARY_FILE)) from None
