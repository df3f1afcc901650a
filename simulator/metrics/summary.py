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

import math
from pathlib import Path
from typing import Any, Iterable, Mapping, NamedTuple, Optional, Self

from hdrh.histogram import HdrHistogram
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_serializer, model_validator

from . import histograms as H
from . import results
from ..errors import InputError
from .energy import EnergyFigures
from .figures import Figures
from .fleet import FleetFigures
from .records import CallRecord, TaskRecord
from .results import Window
from .slo import PERCENTILE_KEYS, PercentileTarget, Slo
from .tally import RunTally, TaskCounts

SUMMARY_VERSION = 1

CALL_METRICS = ("ttft", "tpot", "itl", "e2el")
"""The per-call latencies, each written flat as ``{stat}_{metric}_ms`` (vLLM's names)."""


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
    """The judged tasks of one task class (see `TaskFigures`)."""

    judged: Optional[int] = None
    """Tasks of this class the run meant to start whose arrival is in the window (None: not known,
    a run.json from before this figure)."""
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    not_started: Optional[int] = None
    throughput_per_hour: float = 0.0
    completion_time_s: TimeStats = TimeStats()
    goodput_per_hour: Optional[float] = None
    """Completed within the task SLO's per-item bound, per hour (with a task SLO)."""


class TaskFigures(Figures):
    """The top-level tasks. Counts are of the *judged* tasks: the tasks the run meant to start whose
    intended arrival is in the measurement window; each ended one way: ``judged = completed + failed +
    cancelled + interrupted + not_started``. Rates are per hour of the run's `Summary.duration` (from the
    window's start to the last counted end, the tail after the last arrival included)."""

    judged: Optional[int] = None
    """Tasks the run meant to start (arriving before `run.duration`) whose arrival is in the window:
    what a task SLO and `slo_met_share` count (None: not known, a run.json from before this figure)."""
    completed: int = 0
    """Ended with every call done."""
    failed: int = 0
    """Ended early because a call failed (after its retries)."""
    cancelled: int = 0
    """Cut off by `run.drain` or a stop signal while running."""
    interrupted: Optional[int] = None
    """Started but never ended (a killed run's summary rebuilt from its records)."""
    not_started: Optional[int] = None
    """Judged tasks never started: the run stopped (a signal, the drain limit) before their arrival."""
    finished_all: int = 0
    """Top-level tasks that ended, inside the window or not."""
    sub_tasks_finished: int = 0
    excluded_by_window: int = 0
    """Top-level tasks that ended but arrived outside the window (warm-up, cool-down)."""
    throughput_per_hour: float = 0.0
    """Completed tasks per hour of the run's duration."""
    completion_time_s: TimeStats = TimeStats()
    """Of the completed tasks, seconds from intended arrival to the last byte."""
    breakdown_s: Breakdown = Breakdown()
    by_class: dict[str, TaskClassFigures] = {}
    planned: Optional[int] = None
    """Top-level tasks the run meant to start, in the window or not."""
    goodput_per_hour: Optional[float] = None
    """Tasks completed within the task SLO's per-item bound, per hour of the run's duration."""
    slo_met_share: Optional[float] = None
    """Share of the judged tasks completed within the task SLO's per-item bound."""

    @property
    def not_completed(self) -> int:
        """Judged tasks that did not complete: failed, cancelled, interrupted or never started."""
        return self.failed + self.cancelled + (self.interrupted or 0) + (self.not_started or 0)


class PercentileCheck(Figures):
    """One percentile of a measure against its bound (in the target's unit)."""

    bound: float = 0.0
    measured: Optional[float] = None
    """None when nothing was measured, or (task time) when the percentile falls among tasks that never
    completed, which count as slower than any bound."""
    met: bool = False


class TargetCheck(Figures):
    """One SLO target: each of its percentiles checked, and the per-item bound goodput uses."""

    percentiles: dict[str, PercentileCheck] = {}
    item_bound: float = 0.0
    met: bool = False
    judged: Optional[int] = None
    """Task time: the tasks judged, completed or not (None for the per-call targets)."""
    not_completed: Optional[int] = None
    """Task time: judged tasks that did not complete (failed, cancelled, interrupted, never started);
    each counts as slower than any bound."""


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


class BandedFigure(NamedTuple):
    """A figure of the summary that a simulation gives with its band: its path in summary.json, how a
    line or a table names it, and its unit."""

    path: tuple[str, ...]
    label: str
    unit: str

    @property
    def key(self) -> str:
        """Its key in `SimulationBand.figures`: the path, dotted."""
        return ".".join(self.path)


BANDED_FIGURES = (
    BandedFigure(("output_throughput",), "output tok/s", ""),
    BandedFigure(("tasks", "completion_time_s", "p50"), "task p50", "s"),
    BandedFigure(("tasks", "completion_time_s", "p95"), "task p95", "s"),
    BandedFigure(("p50_ttft_ms",), "TTFT p50", "ms"),
    BandedFigure(("p95_ttft_ms",), "TTFT p95", "ms"),
    BandedFigure(("tasks", "goodput_per_hour"), "tasks/h within SLO", ""),
)
"""The figures a simulation gives with a band (`SimulationBand`), each as summary.json holds it (the
goodput only with a task SLO)."""


def banded_values(summary: Summary) -> dict[str, float]:
    """The `BANDED_FIGURES` of `summary` that it holds, by key."""
    data = summary.to_dict()
    out = {}
    for banded in BANDED_FIGURES:
        value: Any = data
        for key in banded.path:
            value = value.get(key) if isinstance(value, Mapping) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[banded.key] = float(value)
    return out


class BandRange(Figures):
    """One figure with its band: the nominal simulation's value, and the lowest and the highest of it
    over the nominal simulation and the drawn ones."""

    value: float = 0.0
    low: float = 0.0
    high: float = 0.0


class SimulationBand(Figures):
    """The band on a simulation's figures (`simulator.sim.band`): the same plan simulated again on
    profiles drawn from the calibration's fit; each figure's band is the range over the nominal run
    and the draws. Without a band (`draws` 0), `note` says why."""

    draws: int = 0
    """Simulations on drawn profiles beside the nominal one (the band is the range of 1 + draws)."""
    method: str = ""
    """What was drawn, from what, in one line."""
    figures: dict[str, BandRange] = {}
    """By the figure's path in summary.json, dotted (`BANDED_FIGURES`)."""
    note: Optional[str] = None
    """Why there is no band (an uncalibrated profile)."""
    wall_seconds: Optional[float] = None
    """Wall time the draws took (the nominal simulation's is `SimulationStats.wall_seconds`)."""


class RangeCoverage(Figures):
    """One dimension of a calibrated region held against a simulation's calls (`Coverage`): the range
    the calibration measured, the share of the calls below and above it, and the median and the
    largest distance past the bound of those calls. The distance is by `measure`: a ``ratio`` (the
    value over the high bound, the low bound over the value; a count of 0 taken as 1) or a
    ``difference`` (the value minus the high bound, the low bound minus the value)."""

    low: float = 0.0
    high: float = 0.0
    measure: str = "ratio"
    calls: int = 0
    """Calls whose value is known (a call's cached share needs its cached tokens reported)."""
    below_share: float = 0.0
    below_median: Optional[float] = None
    below_max: Optional[float] = None
    above_share: float = 0.0
    above_median: Optional[float] = None
    above_max: Optional[float] = None


class Coverage(Figures):
    """How a simulation's calls lie against the region of call shapes its profile's calibration measured
    (`simulator.sim.profile.CalibratedRegion`, computed by `simulator.sim.coverage`): the calls counted
    are those done in the measurement window; where the calls in the engine and the bursts are
    concerned, every call of the run is counted as load."""

    calls: int = 0
    outside: float = 0.0
    """Share of the calls outside the range of at least one dimension."""
    dimensions: dict[str, RangeCoverage] = {}
    """By the region's dimension (its field name: prompt_tokens, cached_share, running_calls,
    burst_calls, output_tokens)."""


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
    """Share of the simulated time the engine was stepping (a fleet: the mean over its replicas)."""
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
    coverage: Optional[Coverage] = None
    """The calls against the region the profile's calibration measured (None: the profile is
    uncalibrated, or its calibration recorded no region)."""
    band: Optional[SimulationBand] = None
    """The band on the task-level figures (None: none was asked for)."""


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
    shards: Optional[list[dict[str, Any]]] = None
    """A sharded run's shards, one line each (`simulator.pipeline.sharded`)."""
    ray: Optional[dict[str, Any]] = None
    """A sharded run's shard count and the shards lost."""
    fleet: Optional[FleetFigures] = None
    """A fleet run's replicas, balance and task moves (`simulator.metrics.fleet`)."""
    energy: Optional[EnergyFigures] = None
    """The GPUs' energy over the window, per completed task and output token (`simulator.metrics.energy`;
    None: the profile states no power model, or the GPUs were not sampled)."""

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
    planned: Optional[Mapping[str, Any]] = None,
    partial: bool = False,
    stop_reason: str = "completed",
    started: Optional[int] = None,
) -> tuple[Summary, dict[str, HdrHistogram]]:
    """(summary, histograms by name) of these records, in one pass over them (`RunTally`). `planned`
    holds the workload's counts (`simulator.metrics.folder.planned_counts`); without the live `itl`
    histogram, ITL is approximated from each call's mean gap; `started`: see `from_tally`."""
    tally = RunTally(window, slo).feed(calls, tasks)
    return from_tally(tally, itl=itl, planned=planned, partial=partial, stop_reason=stop_reason, started=started)


def from_tally(
    tally: RunTally,
    *,
    itl: Optional[HdrHistogram] = None,
    planned: Optional[Mapping[str, Any]] = None,
    partial: bool = False,
    stop_reason: str = "completed",
    started: Optional[int] = None,
) -> tuple[Summary, dict[str, HdrHistogram]]:
    """(summary, histograms by name) of the records a tally has counted. `started`: the top-level tasks
    the run had started, when it ended without writing its summary (progress.json): those without a
    record were interrupted."""
    hist = tally.histograms(itl)
    duration = tally.duration
    total_in, total_out = tally.input_tokens, tally.output_tokens
    tasks = _task_figures(tally, hist, planned, started)
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
        tasks=tasks,
        slo=_slo_figures(tally, hist, tasks),
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


def _call_accounting(tally: RunTally, planned: Optional[Mapping[str, Any]]) -> CallAccounting:
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


def _task_figures(tally: RunTally, hist: dict[str, HdrHistogram], planned: Optional[Mapping[str, Any]],
                  started: Optional[int]) -> TaskFigures:
    counts, duration = tally.all_tasks, tally.duration
    judged_by_class = (planned or {}).get("judged_by_class") or {}
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
        by_class={name: _class_figures(tally.by_class.get(name), hist.get(f"task_completion[{name}]"), tally,
                                       judged_by_class.get(name))
                  for name in sorted(set(tally.by_class) | set(judged_by_class))},
    )
    if started is not None:
        figures.interrupted = max(0, started - tally.top_finished)
    if planned is not None:
        figures.planned = planned.get("tasks", 0)
        judged = planned.get("judged")
        if judged is None:  # a run.json from before `judged`: known only when the window holds every task
            whole = tally.window.start <= 0 and tally.window.end is None
            judged = figures.planned if whole else counts.counted + (figures.interrupted or 0)
        figures.judged = max(judged, counts.counted)
        figures.not_started = max(0, figures.judged - counts.counted - (figures.interrupted or 0))
    if tally.slo.task_s is not None:
        figures.goodput_per_hour = _per_hour(counts.within_bound, duration)
        judged = figures.judged if figures.judged is not None else counts.counted
        figures.slo_met_share = counts.within_bound / judged if judged else 0.0
    return figures


def _class_figures(counts: Any, completion: Optional[HdrHistogram], tally: RunTally,
                   judged: Optional[int]) -> TaskClassFigures:
    duration = tally.duration
    counts = counts if counts is not None else TaskCounts()
    figures = TaskClassFigures(completed=counts.ok, failed=counts.failed, cancelled=counts.cancelled,
                               throughput_per_hour=_per_hour(counts.ok, duration),
                               completion_time_s=_time_stats(completion if completion is not None else counts.completion))
    if judged is not None:
        figures.judged = max(judged, counts.counted)
        figures.not_started = figures.judged - counts.counted
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


def _slo_figures(tally: RunTally, hist: dict[str, HdrHistogram], tasks: TaskFigures) -> SloFigures:
    """Per target: each percentile measured against its bound (task time over every judged task, those
    that did not complete counted as slower than any bound); per call: shares meeting TTFT/TPOT."""
    figures = SloFigures()
    slo = tally.slo
    if slo.ttft_ms is not None:
        figures.ttft_ms = _target_check(slo.ttft_ms, hist["ttft"], 1000.0)
    if slo.tpot_ms is not None:
        figures.tpot_ms = _target_check(slo.tpot_ms, hist["tpot"], 1000.0)
    if slo.task_s is not None:
        missing = tasks.not_completed
        figures.task_s = _target_check(slo.task_s, hist["task_completion"], 1e6, missing)
        figures.task_s.judged = tasks.completed + missing
        figures.task_s.not_completed = missing
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


def _target_check(target: PercentileTarget, h: HdrHistogram, us_per_unit: float, missing: int = 0) -> TargetCheck:
    """Each percentile of `target` over the items in `h` and `missing` items that never ended (slower
    than any bound): the q-th percentile of all n + missing items is the histogram's percentile
    q * (n + missing) / n, or, past 100, one of the missing (not measured, and missed)."""
    checks = {}
    n = h.get_total_count()
    for key, bound in target.bounds().items():
        q = PERCENTILE_KEYS[key] * (n + missing) / n if n else math.inf
        measured = h.get_value_at_percentile(q) / us_per_unit if q <= 100 else None
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
    progress = results.read_json(folder, results.PROGRESS_FILE) or {}
    started = progress.get("tasks_started")
    summary, hists = summarize(
        results.iter_calls(folder), results.iter_tasks(folder), itl=itl,
        window=Window(win.get("start", 0.0), win.get("end")), slo=slo, planned=info.get("planned"),
        partial=True, stop_reason="rebuilt from records (no summary.json)",
        started=started if isinstance(started, int) and not isinstance(started, bool) else None,
    )
    summary.scenario = info.get("scenario", folder.name)
    summary.result_dir = str(folder)
    return summary, hists


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
