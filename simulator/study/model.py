"""study.json as a typed model: what every figure of a study is, defined once. The study writes it
(`simulator.study.result.build`), and every view reads it: the terminal table
(`simulator.report.study_terminal`), the HTML/PNG/CSV report (`simulator.report.study_report`).

Rates are per second where the name says ``_per_s`` and per hour where it says ``_per_hour``. The
figures of a load point are those of an ordinary run's summary (`simulator.metrics.summary`), read
back from its folder: a point's ``throughput_tasks_per_hour`` is its tasks completed per hour of the
run's duration (the window's start to its last counted end, the tail after the last arrival included)
and ``goodput_tasks_per_hour`` those completed within the task SLO's per-item bound, per the same hour.
A config's **capacity** answers another question: the highest *offered* arrival rate (tasks/h) at which
every SLO target held at a rate the workload could test. At a sustainable load a finite run's goodput
stays below its offered rate: the tail after the last arrival is in its hour, and a task SLO on a
percentile (p50: half the tasks) lets the other tasks take longer than the bound.

Every part allows keys it does not know (a newer study.json still loads) and gives defaults to what
older ones lack.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..errors import InputError
from ..metrics import results

STUDY_FILE = "study.json"
STUDY_VERSION = 2
"""The `agentload_study` number this version writes (2: judged tasks, verdicts, no one-repeat CI)."""
READS = (1, 2)
OBJECTIVE_LABELS = {"goodput": "goodput (tasks/h within the SLO)", "p95_task": "p95 task time",
                    "cost": "$ per task", "energy": "joules per task"}
OBJECTIVE_NAMES = {"goodput": "goodput", "p95_task": "p95 task time", "cost": "cost per task",
                   "energy": "energy per task"}
AXIS_LABELS = {"rate": "task arrival rate", "rate_scale": "rate scale", "max_in_flight": "tasks in flight at most"}
MIN_REPEATS_FOR_CI = 2
"""Repeats (capacity searches, runs of a point) a confidence interval or a significance test needs."""

Pair = Optional[tuple[Optional[float], Optional[float]]]


class Part(BaseModel):
    """A part of study.json (keys it does not know kept)."""

    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True)


class Tokens(Part):
    tasks: int = 0
    input: int = 0
    cached: int = 0
    output: int = 0


class StudyPoint(Part):
    """One (config, load, repeat): an ordinary run in its own folder, or a capacity probe."""

    load: Optional[float] = None
    repeat: int = 0
    seed: int = 0
    source: str = "sweep"
    """'sweep', 'capacity' or 'reference'."""
    folder: Optional[str] = None
    status: Literal["ok", "failed"] = "ok"
    error: Optional[str] = None
    offered_rate_per_s: Optional[float] = None
    """Top-level tasks per second the point's arrivals were sent at (None: a closed loop)."""
    slo_met: Optional[bool] = None
    """Every SLO target held over the judged tasks, not more than the allowed share of them failed, and
    the queue did not grow (`capacity.max_growth`); None without an SLO."""
    verdict: Optional[str] = None
    """'held', 'missed', 'untestable' (held, but the arrivals lasted under two median task times: a
    burst, no test of the offered rate), or None (no SLO, or the point failed)."""
    tests_rate: Optional[bool] = None
    """Whether the arrivals lasted long enough to test the offered rate (None: a closed loop)."""
    throughput_tasks_per_hour: Optional[float] = None
    """Completed tasks per hour of the run's duration (the run's summary)."""
    goodput_tasks_per_hour: Optional[float] = None
    """Tasks completed within the task SLO's per-item bound per hour of the run's duration."""
    sustained_tasks_per_hour: Optional[float] = None
    """At a point that held: the offered rate times the completed share of its judged tasks; in a
    closed loop the run's throughput; None where the point shows no sustainable rate."""
    output_tokens_per_s: Optional[float] = None
    requests_per_s: Optional[float] = None
    task_p50_s: Optional[float] = None
    """Median completion time of the completed tasks."""
    task_p95_s: Optional[float] = None
    task_slo_s: dict[str, Optional[float]] = Field(default_factory=dict)
    """The task SLO's percentiles as its check measured them, over every judged task (None: the
    percentile fell among tasks that did not complete)."""
    ttft_p95_ms: Optional[float] = None
    tasks_judged: Optional[int] = None
    tasks_completed: Optional[int] = None
    tasks_not_completed: Optional[int] = None
    arrival_span_s: Optional[float] = None
    busy_fraction: Optional[float] = None
    growth: Optional[float] = None
    growth_over_run_s: Optional[float] = None
    growing: Optional[bool] = None
    growth_baseline: Optional[float] = None
    tokens: Optional[Tokens] = None
    fleet: Optional[dict[str, Any]] = None
    """A fleet point's router figures (`simulator.study.figures.FleetPoint`; None: one server)."""
    joules_per_task: Optional[float] = Field(None, exclude_if=lambda v: v is None)
    """The GPUs' joules over the run's window per completed task (its summary's ``energy``: the twin's power
    model, or NVML's power samples; absent: not measured)."""
    joules_per_output_token: Optional[float] = Field(None, exclude_if=lambda v: v is None)
    """The same joules per output token."""
    gpu: Optional[dict[str, Any]] = None
    run_s: Optional[float] = None
    overhead_s: Optional[float] = None

    @property
    def offered_per_hour(self) -> Optional[float]:
        return None if self.offered_rate_per_s is None else self.offered_rate_per_s * 3600


class SweepRow(Part):
    """One load of the sweep, its repeats pooled: means of the runs' figures, task percentiles over
    their tasks pooled."""

    load: float
    repeats: int = 0
    ok: int = 0
    slo_met_share: Optional[float] = None
    """Share of the repeats that held every SLO target."""
    offered_tasks_per_hour: Optional[float] = None
    throughput_tasks_per_hour: Optional[float] = None
    goodput_tasks_per_hour: Optional[float] = None
    sustained_tasks_per_hour: Optional[float] = None
    output_tokens_per_s: Optional[float] = None
    task_p50_s: Optional[float] = None
    task_p95_s: Optional[float] = None
    ttft_p95_ms: Optional[float] = None


class Search(Part):
    """One repeat's capacity search."""

    repeat: int = 0
    low: Optional[float] = None
    high: Optional[float] = None
    estimate: Optional[float] = None
    untestable_from: Optional[float] = None
    status: Optional[str] = None
    probes: list[dict[str, Any]] = Field(default_factory=list)


class CapacityResult(Part):
    """The highest offered task rate at which every SLO target held (see the module doc)."""

    rate_per_s: Optional[float] = None
    """The mean of the repeats' estimates (None: no repeat bracketed it)."""
    per_min: Optional[float] = None
    per_hour: Optional[float] = None
    ci_per_s: Pair = None
    """The confidence interval: Student t over the repeats' estimates widened by the bisection's
    resolution; None from fewer than two repeats with an estimate."""
    ci_per_min: Pair = None
    confidence: Optional[float] = None
    resolution_per_s: Optional[float] = None
    """Mean half-width of the repeats' last brackets: how finely the bisection placed the capacity (not
    a confidence interval)."""
    estimates: int = 0
    """Repeats whose search bracketed the capacity."""
    status: Optional[str] = None
    """'ok', 'imprecise', 'partial', 'below_range' (no rate probed held), 'above_range' (every rate the
    workload could test held: the capacity is at least `at_least_per_s`), 'failed'."""
    at_least_per_s: Optional[float] = None
    at_most_per_s: Optional[float] = None
    untestable_from_per_s: Optional[float] = None
    """The lowest rate the workload's arrivals were too short to test (None: all were tested)."""
    repeats: list[Search] = Field(default_factory=list)

    @property
    def ci_per_hour(self) -> Pair:
        if not self.ci_per_s or any(v is None for v in self.ci_per_s):
            return None
        return self.ci_per_s[0] * 3600, self.ci_per_s[1] * 3600


class HoldoutRate(Part):
    """One rate of a held-out check: a share of the capacity, run once on the held-out traffic."""

    share: float = 1.0
    """Of the capacity (1: the capacity itself)."""
    rate_per_s: Optional[float] = None
    per_hour: Optional[float] = None
    verdict: Optional[str] = None
    """As a capacity probe's (`StudyPoint.verdict`): 'held', 'missed', 'untestable', or None (the point
    failed)."""
    slo_met: Optional[bool] = None
    status: Literal["ok", "failed"] = "ok"
    tasks_judged: Optional[int] = None
    folder: Optional[str] = None
    """The point's result folder (also among the config's `points`, source 'holdout')."""


class HoldoutResult(Part):
    """The capacity run on traffic its search never saw (`simulator.study.holdout`): a seed no repeat
    used, or the workload's part after a split by arrival; each rate judged as the search judges a probe
    (every SLO target over every task meant to run, the failed or cancelled share, the queue's growth
    with `max_growth`). One run per rate: a verdict on that traffic, not a probability."""

    traffic: str = ""
    """The held-out traffic, in words."""
    seed: Optional[int] = None
    """Its run seed."""
    split: Optional[float] = None
    """The share of the workload's tasks the rest of the study ran on (None: a held-out seed)."""
    tasks: Optional[int] = None
    """Top-level tasks of the held-out traffic."""
    capacity_per_s: Optional[float] = None
    """The rate the shares are of: the capacity, or its lower bound above the search's range (`bound`)."""
    capacity_per_hour: Optional[float] = None
    bound: Literal["exact", "at_least"] = "exact"
    baseline_per_s: Optional[float] = None
    """With `max_growth`: the light load run first on the held-out traffic, which the checked rates'
    growth is judged against (not itself checked)."""
    rates: list[HoldoutRate] = Field(default_factory=list)
    """Highest share first."""
    verdict: Literal["held", "held_below", "missed", "untestable", "failed", "not_run"] = "not_run"
    """'held' at every rate; 'held_below': missed at the capacity, held at a lower share; 'missed': held
    at none, or missed below a rate that held; 'untestable': no miss, but a burst too short to test its
    rate; 'failed': a point failed; 'not_run': no capacity to check."""
    answer: str = ""
    """The check in a sentence."""


class Cost(Part):
    self_hosted_per_task: Optional[float] = None
    """$ per completed task on the rented GPUs: gpu_hour x gpus (x replicas, for a fleet) / tasks per
    hour, at the capacity (else at the sustained rate of the ranking load)."""
    api_per_task: Optional[float] = None
    """$ per completed task through the priced API: its tokens at the API's prices."""
    at_rate_per_s: Optional[float] = None
    tasks_per_hour: Optional[float] = None
    """The tasks per hour the self-hosted cost divides by."""
    utilisation: Optional[float] = None
    utilisation_source: Optional[str] = None
    joules_per_task: Optional[float] = None
    """Joules per completed task where the self-hosted cost is taken: at each repeat's highest capacity
    probe that held, else at the ranking load, their mean: each point's GPU energy over its window per
    completed task (the twin's power model, or NVML), else, for a live point sampled by the study alone,
    its GPUs' energy over the whole point per completed task. None: not measured."""
    joules_per_output_token: Optional[float] = Field(None, exclude_if=lambda v: v is None)
    """Joules per output token at those points, their mean (absent: no point has it)."""
    energy_source: Optional[str] = Field(None, exclude_if=lambda v: v is None)
    """Where `joules_per_task` comes from: 'twin power model', 'NVML power samples' or 'NVML (whole
    point)' (absent: not measured)."""


class Quality(Part):
    status: Optional[str] = None
    reason: Optional[str] = None
    probes: Optional[int] = None
    identical_share: Optional[float] = None
    mean_common_prefix_tokens: Optional[float] = None
    mean_abs_logprob_delta: Optional[float] = None
    note: Optional[str] = None

    @property
    def flagged(self) -> bool:
        return self.status == "flagged"


class Gpu(Part):
    available: bool = False
    note: Optional[str] = None
    memory_used_max_bytes: Optional[float] = None
    utilisation_mean_perc: Optional[float] = None
    energy_j: Optional[float] = None
    joules_per_task: Optional[float] = None


class Objective(Part):
    """The figure a config is ranked by (`Study.objective`), in `unit`."""

    value: Optional[float] = None
    ci: Pair = None
    """Its confidence interval (None from fewer than `MIN_REPEATS_FOR_CI` repeats)."""
    unit: str = ""
    bound: Literal["exact", "at_least", "at_most"] = "exact"
    """'at_least' when the value is a lower bound (a capacity above the search's range), 'at_most' the
    reverse."""
    samples: int = 0
    """Repeats behind the value."""
    resolution: Optional[float] = None
    """The capacity search's resolution in the objective's unit (not a confidence interval)."""


class TwinBand(Part):
    """A twin config's band on the figure its rank rests on: each of its ranking points (its capacity
    points, each repeat's highest probe that held, when it ranks by capacity; else its sweep points at
    the ranking load) simulated again on `draws` profiles drawn from the calibration's fit
    (`simulator.sim.band`), the range over all those simulations. Not a confidence interval: how far the
    twin's own uncertainty moves the figure. Without a band (an uncalibrated profile), `note` says why."""

    figure: Optional[str] = None
    """The banded figure, by its path in summary.json, dotted (`tasks.goodput_per_hour`, ...)."""
    label: Optional[str] = None
    unit: str = ""
    where: Optional[str] = None
    """Which points: 'at its capacity points' or 'at the ranking load'."""
    value: Optional[float] = None
    """The mean of the points' nominal figures."""
    low: Optional[float] = None
    """The lowest of the figure over the points' nominal and drawn simulations."""
    high: Optional[float] = None
    draws: int = 0
    points: int = 0
    method: Optional[str] = None
    note: Optional[str] = None

    @property
    def banded(self) -> bool:
        """Whether it holds a band (not only why it has none)."""
        return self.low is not None and self.high is not None

    def overlaps(self, other: TwinBand) -> Optional[bool]:
        """Whether the two bands of the same figure overlap (None: either has none, or they are of another
        figure or taken at other points)."""
        if not (self.banded and other.banded) or (self.figure, self.where) != (other.figure, other.where):
            return None
        return max(self.low, other.low) <= min(self.high, other.high)  # type: ignore[type-var]


class TwinEntry(Part):
    predicted_value: Optional[float] = None
    predicted_rank: Optional[int] = None
    profile: Optional[str] = None


class TaskClassTrade(Part):
    """One task class of a fleet config, at the config's ranking points (`ConfigResult.at_load`), the
    completed top-level tasks of the class pooled over the repeats."""

    tasks: int = 0
    """Completed top-level tasks of the class behind the figures."""
    cached_share: Optional[float] = None
    """Prompt tokens the servers reported as served from the prefix cache over all prompt tokens, in the
    calls of those tasks (their sub-agents' included; None when a call did not report it)."""
    ttft_per_task_s: Optional[float] = None
    """Mean seconds a task spent before first tokens (its calls' queueing and prefill, summed: the
    breakdown's ``ttft``): where a router's choice of replica shows as waiting and recomputed prefixes."""
    task_p50_s: Optional[float] = None
    task_p95_s: Optional[float] = None
    """Completion time of those tasks, pooled over the repeats."""


class FleetResult(Part):
    """A fleet config: its size, its capacity per GPU, and what its router traded between cache hits and
    balance at the config's ranking points (`ConfigResult.at_load`; the fleet figures of each point's
    summary.json averaged over the points, the task figures pooled over their tasks)."""

    replicas: int = 1
    policy: Optional[str] = None
    """The router's policy."""
    router: Optional[str] = None
    """The policy with the router settings it has off their defaults: configs of one router that differ
    only in their replica count form one sizing group."""
    gpus_per_replica: int = 1
    """The study's cost.gpus (1 without a cost section)."""
    gpus: int = 1
    """GPUs the fleet holds: gpus_per_replica x replicas."""
    per_gpu_per_min: Optional[float] = None
    """Capacity per GPU: the highest task rate (tasks per minute) held within the SLO, over `gpus`
    (`capacity.per_min` / gpus)."""
    per_gpu_ci_per_min: Pair = None
    """Its confidence interval (the capacity's, over `gpus`; None from fewer than two repeats)."""
    per_gpu_at_least_per_min: Optional[float] = None
    """Where the capacity is above the search's range: at least this per GPU (its highest held rate)."""
    points: int = 0
    """Points the router figures below are averaged over."""
    prefix_hit_share: Optional[float] = None
    """The fleet's prefix-cache hits over queries (tokens), by the replicas' /metrics (summary.json's
    ``fleet.prefix_hit_share``)."""
    cached_share: Optional[float] = None
    """As `TaskClassTrade.cached_share`, over every task class."""
    imbalance: Optional[float] = None
    """Most calls on one replica over the mean per replica (1: even; ``fleet.imbalance``)."""
    call_share_cv: Optional[float] = None
    """Coefficient of variation of the replicas' call counts (``fleet.call_share_cv``)."""
    moved_share: Optional[float] = None
    """Share of tasks whose calls went to more than one replica (``fleet.moves.moved_share``)."""
    moves_per_task: Optional[float] = None
    """Replica changes per task (``fleet.moves.moves_per_task``)."""
    waiting_mean: Optional[float] = None
    """Requests waiting in a replica's queue: mean over the run and the replicas."""
    ttft_per_task_s: Optional[float] = None
    """As `TaskClassTrade.ttft_per_task_s`, over every task class."""
    by_class: dict[str, TaskClassTrade] = Field(default_factory=dict)


class ConfigResult(Part):
    """One server config of the study, its points and its verdicts. The figures beside `points` are at
    `at_load` (the ranking load: `rank_at`, else the sweep's highest; without a sweep, the capacity
    probes that held), repeats pooled."""

    name: str
    kind: Optional[str] = None
    is_base: bool = False
    differs_by: Optional[str] = None
    status: Optional[str] = None
    error: Optional[str] = None
    server: Optional[dict[str, Any]] = None
    points: list[StudyPoint] = Field(default_factory=list)
    sweep: list[SweepRow] = Field(default_factory=list)
    at_load: Optional[float] = None
    offered_tasks_per_hour: Optional[float] = None
    throughput_tasks_per_hour: Optional[float] = None
    goodput_tasks_per_hour: Optional[float] = None
    sustained_tasks_per_hour: Optional[float] = None
    output_tokens_per_s: Optional[float] = None
    task_p50_s: Optional[float] = None
    task_p95_s: Optional[float] = None
    ttft_p95_ms: Optional[float] = None
    capacity: Optional[CapacityResult] = None
    holdout: Optional[HoldoutResult] = None
    """The capacity checked on held-out traffic (None: no check)."""
    cost: Optional[Cost] = None
    quality: Optional[Quality] = None
    gpu: Optional[Gpu] = None
    reference: Optional[dict[str, Any]] = None
    objective: Objective = Field(default_factory=Objective)
    rank: Optional[int] = None
    twin: Optional[TwinEntry] = None
    twin_band: Optional[TwinBand] = None
    """On the twin: the band of the figure its rank rests on (None: a live config, or no band asked for)."""
    fleet: Optional[FleetResult] = None
    """A fleet config's size, capacity per GPU and router trade-off (None: one server)."""


class Comparison(Part):
    """Two configs next to each other in the ranking."""

    better: str
    worse: str
    difference: Optional[float] = None
    """Of the objective, in the better one's favour."""
    ci: Pair = None
    tested: bool = True
    """Whether both had the repeats a test needs (`MIN_REPEATS_FOR_CI`); untested, no verdict of
    significance is given."""
    significant: Optional[bool] = None
    """The difference's interval excludes zero (None: not tested)."""
    verdict: Optional[str] = None
    within_twin_band: Optional[bool] = None
    """On the twin: whether the two configs' bands (`ConfigResult.twin_band`) overlap, their order then
    within what the twin's own uncertainty could swap (None: either has no band)."""
    band_verdict: Optional[str] = None
    """The same in a sentence, with both bands."""


class Ranking(Part):
    objective: Optional[str] = None
    unit: Optional[str] = None
    better: Optional[str] = None
    order: list[str] = Field(default_factory=list)
    comparisons: list[Comparison] = Field(default_factory=list)


class TwinPrediction(Part):
    profile: Optional[str] = None
    calibrated: Optional[bool] = None
    configs: list[str] = Field(default_factory=list)
    predicted_order: list[str] = Field(default_factory=list)
    measured_order: list[str] = Field(default_factory=list)
    same_order: Optional[bool] = None
    note: Optional[str] = None
    within_band: list[str] = Field(default_factory=list)
    """For each two configs next to each other in the predicted order whose twin bands overlap: a
    sentence saying so (their predicted order is within the twin's own uncertainty)."""


class FailedPoint(Part):
    config: str = ""
    load: Optional[float] = None
    repeat: Optional[int] = None
    source: Optional[str] = None
    error: Optional[str] = None
    folder: Optional[str] = None


class SizingRow(Part):
    """A fleet config against the sizing rate."""

    config: str
    router: Optional[str] = None
    replicas: int = 1
    gpus: int = 1
    carries: Literal["yes", "no", "unsure", "unknown"] = "unknown"
    """'yes': the capacity's confidence interval lies at or above the rate (its lower bound; above the
    search's range, every repeat held the SLO at the rate or higher); 'no': it lies below (its upper
    bound; below the range, the lowest rate that failed); 'unsure': it straddles the rate; 'unknown':
    no interval (one repeat) or no capacity."""
    reason: str = ""
    cost_per_task_at_rate: Optional[float] = None
    """$ per task with the fleet's GPUs serving the sizing rate: gpu_hour x gpus / (the rate per hour),
    where it carries the rate."""


class SizingGroup(Part):
    """The fleet configs of one router (`FleetResult.router`), by replica count, and the fewest replicas
    among them that carry the rate."""

    router: str
    configs: list[str] = Field(default_factory=list)
    """In order of replica count."""
    fewest: Optional[str] = None
    """The config with the fewest replicas that carries the rate (None: none does)."""
    replicas: Optional[int] = None
    answer: str = ""


class Sizing(Part):
    """The sizing answer: the fewest replicas that carry `rate` tasks within the SLO."""

    rate: float
    per: str = "minute"
    """The unit `rate` was given per (second, minute, hour)."""
    rate_per_s: float
    rate_per_min: float
    confidence: Optional[float] = None
    rows: list[SizingRow] = Field(default_factory=list)
    groups: list[SizingGroup] = Field(default_factory=list)
    fewest: Optional[str] = None
    """Over every router: the config with the fewest replicas that carries the rate (a tie: the lower
    $ per task at the rate, then the first in the study)."""
    replicas: Optional[int] = None
    gpus: Optional[int] = None
    cost_per_task_at_rate: Optional[float] = None
    answer: str = ""


class SpaceCandidate(Part):
    """A candidate of the config space: its settings and what the twin predicted of it."""

    name: str
    settings: dict[str, Any] = Field(default_factory=dict)
    """Dotted profile key: value."""
    predicted_value: Optional[float] = None
    """The study's objective on the twin (None: infeasible, or its points gave none)."""
    predicted_rank: Optional[int] = None
    """Its place among the candidates by that value (1: the best; None: infeasible)."""
    predicted_bound: str = "exact"
    """'exact', or 'at_least' / 'at_most' where the value only bounds the figure."""
    predicted_values: dict[str, Optional[float]] = Field(default_factory=dict)
    """With several `objectives`: each one's value on the twin."""
    infeasible: Optional[str] = None
    """Why the server would not start it (it was never simulated; `simulator.study.feasible`)."""
    trial: Optional[int] = None
    """A search's first trial that proposed it (from 0)."""
    on_front: Optional[bool] = None
    """With several objectives: whether it is on the Pareto front."""


class SpaceLive(Part):
    """A candidate run live: the twin's prediction beside the measurement, of the study's objective."""

    name: str
    config: Optional[str] = None
    """The study's config that ran it: its own, or the base's when it adds no server flag (the base's
    server as it is)."""
    predicted_rank: Optional[int] = None
    """Its place among the space's candidates on the twin."""
    measured_rank: Optional[int] = None
    """Its place among the live candidates by the measured value."""
    predicted_value: Optional[float] = None
    predicted_bound: str = "exact"
    """'exact', or 'at_least' / 'at_most' where the value only bounds the figure (a capacity above its
    search's range)."""
    measured_value: Optional[float] = None
    measured_bound: str = "exact"
    unit: Optional[str] = None


class RankCorrelation(Part):
    """Spearman's rank correlation of the twin's predicted values with the measured ones, over the live
    candidates with both (``scipy.stats.spearmanr``): +1 when the twin put them in the measured order,
    -1 in the reverse one. It describes these candidates only, with no test: with 2 it is only their
    order."""

    objective: str = ""
    n: int = 0
    rho: Optional[float] = None
    """None with fewer than 2 candidates, or when one side's values are all equal."""
    statement: str = ""
    """The figure in a sentence, as every view shows it."""


class SpaceResult(Part):
    """The config space: how it was searched, each candidate on the twin, and those run live."""

    method: str = "grid"
    grid: Optional[dict[str, list[Any]]] = None
    settings: Optional[dict[str, Any]] = None
    """A search's settings as the study file gives them (a list of choices, or a range)."""
    objectives: list[str] = Field(default_factory=list)
    """What the space was searched for (one: the study's objective; several: the Pareto front)."""
    top_k: Optional[int] = None
    profile: Optional[str] = None
    budget: Optional[int] = None
    """A search's twin evaluations allowed."""
    seed: Optional[int] = None
    evaluations: Optional[int] = None
    """Candidates simulated on the twin."""
    trials: Optional[int] = None
    """Candidates a search proposed, those proposed again and the infeasible included."""
    repeated: Optional[int] = None
    """A search's trials that proposed a candidate proposed before (told its values, not simulated)."""
    infeasible: Optional[int] = None
    """Candidates the server would not start (not simulated)."""
    space_size: Optional[int] = None
    """Distinct candidates the space holds (None: a real-valued range makes them endless)."""
    candidates: list[SpaceCandidate] = Field(default_factory=list)
    """In the order first proposed (a grid's: its order)."""
    front: list[str] = Field(default_factory=list)
    """With several objectives: the Pareto front, best first by the first objective."""
    top: list[str] = Field(default_factory=list)
    """The best `top_k` on the twin (with several objectives, of the front), chosen to run live."""
    live: list[SpaceLive] = Field(default_factory=list)
    """Those of `top` that ran live (none on a twin base)."""
    rank_correlation: Optional[RankCorrelation] = None


class Study(Part):
    """study.json."""

    agentload_study: int = STUDY_VERSION
    name: str
    description: Optional[str] = None
    study_file: Optional[str] = None
    folder: Optional[str] = None
    started_at: Optional[str] = None
    finished_at: Optional[str] = None
    complete: Optional[bool] = None
    workload: Optional[dict[str, Any]] = None
    slo: Optional[dict[str, Any]] = None
    axis: Optional[str] = None
    axis_unit: Optional[str] = None
    objective: str = "goodput"
    confidence: Optional[float] = None
    repeats: Optional[int] = None
    """Runs of each sweep point."""
    capacity_repeats: Optional[int] = None
    """Capacity searches per config."""
    notes: list[str] = Field(default_factory=list)
    """What a reader must know to read the figures (settings that took effect, untestable rates)."""
    cost: Optional[dict[str, Any]] = None
    base: Optional[str] = None
    configs: list[ConfigResult]
    ranking: Optional[Ranking] = None
    twin_prediction: Optional[TwinPrediction] = None
    space: Optional[SpaceResult] = None
    overhead: Optional[dict[str, Any]] = None
    failed_points: list[FailedPoint] = Field(default_factory=list)
    sizing: Optional[Sizing] = None
    """The fewest replicas that carry the study's `sizing` rate (None: no sizing asked)."""

    @field_validator("agentload_study")
    @classmethod
    def _known_version(cls, version: int) -> int:
        if version not in READS:
            raise ValueError(f"study.json version {version}; this agentload reads versions "
                             f"{', '.join(map(str, READS))}")
        return version

    @field_validator("configs")
    @classmethod
    def _unique_names(cls, configs: list[ConfigResult]) -> list[ConfigResult]:
        names = [c.name for c in configs]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"config names must be unique: {', '.join(twice)} more than once")
        return configs

    def axis_title(self) -> str:
        """The sweep's axis as the plots name it, with its unit."""
        label = AXIS_LABELS.get(self.axis or "", self.axis or "load")
        return f"{label} ({self.axis_unit})" if self.axis_unit else label

    def lower_is_better(self) -> bool:
        """Whether a lower objective value ranks higher."""
        if self.ranking is not None and self.ranking.better:
            return self.ranking.better == "lower"
        return self.objective in ("p95_task", "cost", "energy")

    def ranked(self) -> list[ConfigResult]:
        """The configs best first (unranked last, in their order)."""
        order = sorted(range(len(self.configs)), key=lambda i: (self.configs[i].rank is None,
                                                                  self.configs[i].rank or 0, i))
        return [self.configs[i] for i in order]


def is_study_folder(folder: Path) -> bool:
    """Whether `folder` holds a study.json (and so gets a study report)."""
    return (Path(folder) / STUDY_FILE).is_file()


def save_study(folder: Path, study: Study) -> None:
    """Write `study` as the study.json of `folder` (atomically: a reader sees the old file or the new)."""
    results.write_json(folder, STUDY_FILE, study.model_dump(mode="json"))


def load_study(folder: Path) -> tuple[Study, dict[str, Any]]:
    """(the study, study.json as read) of a study folder; `InputError` naming the file and the field
    when it is not a study.json."""
    path = Path(folder) / STUDY_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", file=str(path)) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"bad JSON: {exc.msg}", file=str(path), line=exc.lineno) from None
    try:
        return Study.model_validate(data), data
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise InputError(error["msg"].removeprefix("Value error, "), file=str(path), path=where or None,
                         field=str(error["loc"][-1]) if error["loc"] else None) from None
