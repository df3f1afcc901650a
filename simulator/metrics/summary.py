"""The figures of a run, computed from its records: per call (with `vllm bench serve` field names),
per task (overall and per task class), the breakdown of task time, goodput against the SLO, errors.

Everything is computed from the call and task records (plus the ITL histogram, the only figure that
needs more than a record holds), in one pass that keeps only counters and histograms
(`simulator.metrics.tally.RunTally`): a run's summary comes from the tally fed as records finish, and
a summary rebuilt from the JSONL files after a crash streams them through the same tally, so it is the
same as the one written at the end of the run.

The summary is a typed `Summary`; its `to_dict()` is summary.json. Every figure has a default, so a
summary.json written by an older version (or by hand, with a few figures) loads, and a part is written
only when it was set: a summary dumps to the keys it was built or loaded with.
"""

from __future__ import annotations

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
from .tally import RunTally

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
    interrupted: Optional[int] = None
    """Top-level tasks started but never ended (a killed run's summary rebuilt from its records)."""
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
    calibration_rms_error: Optional[float] = None
    """The profile's calibration fit error (rms of predicted / measured - 1 over its sweep; None: the
    profile was not calibrated, or recorded no error)."""
    calibration_points: int = 0
    calibration_drift: Optional[float] = None
    """The trend of the calibration sweep's rounds' times (+0.05: the server ran 5% slower by its end;
    None: not measured)."""
    uncalibrated: list[str] = []
    """What the prediction leans on without a measurement of the server behind it (empty: nothing)."""
    uncertainty: str = ""
    """The two above in one sentence, as `agentload simulate` prints it."""


class ErrorMessage(Figures):
    """One error message of failed attempts (whitespace folded, cut at 300 characters) and how often."""

    error_class: str = ""
    message: str = ""
    count: int = 0


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
    error_messages: Optional[list[ErrorMessage]] = None
    """The most frequent messages of failed attempts, with their class (set when an attempt failed)."""
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
    """(summary, histograms by name) of these records, in one pass over them (`RunTally`). `planned`
    holds the workload's counts (tasks, calls, subtasks); without the live `itl` histogram, ITL is
    approximated from each call's mean gap."""
    tally = RunTally(window, slo).feed(calls, tasks)
    return from_tally(tally, itl=itl, planned=planned, partial=partial, stop_reason=stop_reason)


def from_tally(
    tally: RunTally,
    *,
    itl: Optional[HdrHistogram] = None,
    planned: Optional[Mapping[str, int]] = None,
    partial: bool = False,
    stop_reason: str = "completed",
) -> tuple[Summary, dict[str, HdrHistogram]]:
    """(summary, histograms by name) of the records a tally has counted."""
    hist = tally.histograms(itl)
    duration = tally.duration
    total_in, total_out = tally.input_tokens, tally.output_tokens
    summary = Summary(
        agentload_summary=SUMMARY_VERSION, partial=partial, stop_reason=stop_reason,
        duration=duration, window=tally.window,
        completed=tally.window_ok, failed=tally.window_calls - tally.window_ok,
        total_input_tokens=total_in, total_output_tokens=total_out,
        request_throughput=_per_second(tally.window_ok, duration), output_throughput=_per_second(total_out, duration),
        total_token_throughput=_per_second(total_in + total_out, duration),
        **{metric: CallLatency.pick(H.stats_ms(hist[metric])) for metric in CALL_METRICS},
        client_lag_ms=ClientLag.pick(H.stats_ms(hist["client_lag"])),
        errors=dict(tally.errors.most_common()),
        calls=_call_accounting(tally, planned),
        tasks=_task_figures(tally, hist, planned),
        slo=_slo_figures(tally, hist),
    )
    if tally.cached_tokens is not None:
        summary.total_cached_tokens = tally.cached_tokens
    if tally.messages:
        summary.error_messages = [ErrorMessage(**entry) for entry in tally.top_messages()]
    return summary, hist


def _per_second(n: float, duration: float) -> float:
    return n / duration if duration > 0 else 0.0


def _per_hour(n: float, duration: float) -> float:
    return n * 3600 / duration if duration > 0 else 0.0


def _call_accounting(tally: RunTally, planned: Optional[Mapping[str, int]]) -> CallAccounting:
    accounting = CallAccounting(
        attempts=tally.attempts,
        ok=tally.calls_ok,
        failed_attempts=tally.failed_attempts,
        cancelled=tally.cancelled_calls,
        excluded_by_window=tally.attempts - tally.window_calls,
    )
    if planned is not None:
        accounting.planned = planned.get("calls", 0)
        accounting.not_done = accounting.planned - accounting.ok
    return accounting


def _time_stats(h: HdrHistogram) -> TimeStats:
    return TimeStats.pick({k: v / 1000 for k, v in H.stats_ms(h).items()})


def _task_figures(tally: RunTally, hist: dict[str, HdrHistogram], planned: Optional[Mapping[str, int]]) -> TaskFigures:
    counts, duration = tally.all_tasks, tally.duration
    figures = TaskFigures(
        completed=counts.ok,
        failed=counts.failed,
        cancelled=counts.cancelled,
        finished_all=tally.top_finished,
        sub_tasks_finished=tally.tasks_finished - tally.top_finished,
        excluded_by_window=tally.top_finished - counts.counted,
        throughput_per_hour=_per_hour(counts.ok, duration),
        completion_time_s=_time_stats(hist["task_completion"]),
        breakdown_s=_breakdown(tally.breakdown, counts.ok),
        by_class={name: _class_figures(tally.by_class[name], hist[f"task_completion[{name}]"], tally)
                  for name in sorted(tally.by_class)},
    )
    if planned is not None:
        figures.planned = planned.get("tasks", 0)
        figures.not_started = max(0, figures.planned - tally.top_finished)
    if tally.slo.task_s is not None:
        figures.goodput_per_hour = _per_hour(counts.within_bound, duration)
        figures.slo_met_share = counts.within_bound / counts.counted if counts.counted else 0.0
    return figures


def _class_figures(counts: Any, completion: HdrHistogram, tally: RunTally) -> TaskClassFigures:
    duration = tally.duration
    figures = TaskClassFigures(completed=counts.ok, failed=counts.counted - counts.ok,
                               throughput_per_hour=_per_hour(counts.ok, duration),
                               completion_time_s=_time_stats(completion))
    if tally.slo.task_s is not None:
        figures.goodput_per_hour = _per_hour(counts.within_bound, duration)
    return figures


def _breakdown(sums: Any, n: int) -> Breakdown:
    """Where the time of the completed tasks went, mean seconds per task (`sums`: their totals)."""
    if n == 0:
        return Breakdown(total=0.0, in_calls=0.0, ttft=0.0, decode=0.0, gaps=0.0, client_lag=0.0, other=0.0)
    total = sums.total / n
    in_calls = sums.in_calls / n
    ttft = sums.ttft / n
    gaps = sums.gaps / n
    lag = sums.client_lag / n
    return Breakdown(total=total, in_calls=in_calls, ttft=ttft, decode=in_calls - ttft, gaps=gaps,
                     client_lag=lag, other=max(0.0, total - in_calls - gaps - lag))


def _slo_figures(tally: RunTally, hist: dict[str, HdrHistogram]) -> SloFigures:
    """Per target: each percentile measured against its bound; per call: shares meeting TTFT/TPOT."""
    figures = SloFigures()
    slo = tally.slo
    for name, target, h, us_per_unit in (("ttft_ms", slo.ttft_ms, hist["ttft"], 1000.0),
                                         ("tpot_ms", slo.tpot_ms, hist["tpot"], 1000.0),
                                         ("task_s", slo.task_s, hist["task_completion"], 1e6)):
        if target is not None:
            setattr(figures, name, _target_check(target, h, us_per_unit))
    if slo.ttft_ms or slo.tpot_ms:
        # the shares of the window's completed calls within the per-call bounds; a call without a
        # TPOT (one output token) meets any TPOT bound
        n = tally.window_ok
        if slo.ttft_ms is not None:
            figures.calls_meeting_ttft = tally.meeting_ttft / n if n else 0.0
        if slo.tpot_ms is not None:
            figures.calls_meeting_tpot = tally.meeting_tpot / n if n else 0.0
        figures.calls_meeting_all = tally.meeting_all / n if n else 0.0
        figures.call_goodput = _per_second(tally.meeting_all, tally.duration)
    return figures


def _target_check(target: PercentileTarget, h: HdrHistogram, us_per_unit: float) -> TargetCheck:
    checks = {}
    for key, bound in target.bounds().items():
        measured = h.get_value_at_percentile(PERCENTILE_KEYS[key]) / us_per_unit if h.get_total_count() else None
        checks[key] = PercentileCheck(bound=bound, measured=measured, met=measured is not None and measured <= bound)
    return TargetCheck(percentiles=checks, item_bound=target.item_bound(), met=all(c.met for c in checks.values()))


# --- reading it back ------------------------------------------------------------------------------


def rebuild(folder: Path) -> tuple[Summary, dict[str, HdrHistogram]]:
    """A summary and its histograms from the records of a result folder whose summary.json is missing
    (after a crash)."""
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
    summary, hists = summarize(
        results.iter_calls(folder), results.iter_tasks(folder), itl=itl,
        window=Window(win.get("start", 0.0), win.get("end")), slo=slo, planned=info.get("planned"),
        partial=True, stop_reason="rebuilt from records (no summary.json)",
    )
    _count_interrupted(summary.tasks, results.read_json(folder, results.PROGRESS_FILE))
    summary.scenario = info.get("scenario", folder.name)
    summary.result_dir = str(folder)
    return summary, hists


def _count_interrupted(tasks: TaskFigures, progress: Optional[Mapping[str, Any]]) -> None:
    """A run that ended without its summary (killed) left tasks started and never ended: those the
    run had started (progress.json) less those with a record are interrupted, not 'not started'."""
    started = (progress or {}).get("tasks_started")
    if not isinstance(started, int) or isinstance(started, bool):
        return
    tasks.interrupted = max(0, started - tasks.finished_all)
    if tasks.planned is not None:
        tasks.not_started = max(0, tasks.planned - tasks.finished_all - tasks.interrupted)


def load_summary(folder: Path) -> Summary:
    """A result folder's summary: its summary.json, or rebuilt from its records when that is missing."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError("no such result folder", file=str(folder))
    data = results.read_json(folder, results.SUMMARY_FILE)
    if data is None:
        return rebuild(folder)[0]
    try:
        return Summary.model_validate(data)
    except ValidationError as exc:
        raise InputError(f"bad summary: {exc}", file=str(folder / results.SUMMARY_FILE)) from None
