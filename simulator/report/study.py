"""study.json as the report reads it.

A study (`agentload study`, `simulator.study`) runs the same seeded workload against several server
configs at several load points, each point an ordinary result folder, and writes ``study.json`` in the
study folder. Its shape is defined where it is written (`simulator.study`'s docstring, docs/study.md);
this module is the report's reading of it: the parts the report shows, each optional but the study's
name and configs, every key it does not show kept and ignored, so a newer study.json still makes a
page. What the report reads (version ``agentload_study: 1``; rates per second unless named per hour)::

    name, description, complete, objective ("goodput" | "p95_task" | "cost"), confidence, slo,
    axis ("rate" | "rate_scale" | "max_in_flight"), axis_unit, base, workload {tasks, calls, ...},
    configs[]: name, kind, is_base, differs_by, status, error,
        points[]: load, repeat, source ("sweep" | "capacity" | "reference"), folder, status, error,
                  offered_rate_per_s, slo_met, throughput_tasks_per_hour, goodput_tasks_per_hour,
                  task_p50_s, task_p95_s, ttft_p95_ms
        throughput_tasks_per_hour, task_p50_s, task_p95_s, ttft_p95_ms    (at the ranking load)
        capacity {per_hour, ci_per_s [lo, hi], confidence, status, at_least_per_s},
        cost {self_hosted_per_task, api_per_task, utilisation, joules_per_task},
        quality {status ("base" | "same" | "flagged" | "n/a" | "failed"), reason ("outputs" | "logprobs"),
                 probes, identical_share, mean_common_prefix_tokens, mean_abs_logprob_delta, note},
        gpu {available, note, memory_used_max_bytes, utilisation_mean_perc, joules_per_task},
        reference {label, output_tokens_per_s, requests_per_s},
        objective {value, ci [lo, hi], unit}, rank, twin {predicted_value, predicted_rank, profile}
    ranking {objective, unit, better, order, comparisons[]: better, worse, difference, ci, significant, verdict}
    twin_prediction {profile, calibrated, predicted_order, measured_order, same_order, note}
    failed_points[]: config, load, repeat, source, error, folder
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..errors import InputError

STUDY_FILE = "study.json"
STUDY_VERSION = 1
OBJECTIVE_LABELS = {"goodput": "goodput (tasks/h within the SLO)", "p95_task": "p95 task time",
                    "cost": "$ per task"}
OBJECTIVE_NAMES = {"goodput": "goodput", "p95_task": "p95 task time", "cost": "cost per task"}
AXIS_LABELS = {"rate": "task arrival rate", "rate_scale": "rate scale", "max_in_flight": "tasks in flight at most"}

Pair = Optional[tuple[Optional[float], Optional[float]]]


class _Part(BaseModel):
    model_config = ConfigDict(extra="allow")


class Point(_Part):
    """One (load, repeat) of a config: an ordinary run, or a probe of the capacity search."""

    load: Optional[float] = None
    repeat: int = 0
    source: str = "sweep"
    folder: Optional[str] = None
    status: Literal["ok", "failed"] = "ok"
    error: Optional[str] = None
    offered_rate_per_s: Optional[float] = None
    slo_met: Optional[bool] = None
    throughput_tasks_per_hour: Optional[float] = None
    goodput_tasks_per_hour: Optional[float] = None
    task_p50_s: Optional[float] = None
    task_p95_s: Optional[float] = None
    ttft_p95_ms: Optional[float] = None

    @property
    def offered_per_hour(self) -> Optional[float]:
        return None if self.offered_rate_per_s is None else self.offered_rate_per_s * 3600


class Capacity(_Part):
    per_hour: Optional[float] = None
    """Tasks per hour (None unless the search bracketed it)."""
    ci_per_s: Pair = None
    confidence: Optional[float] = None
    status: Optional[str] = None
    """'ok', 'below_range' (no rate probed held the SLO), 'above_range' (every one did), 'failed'."""
    at_least_per_s: Optional[float] = None
    """With 'above_range': the highest rate probed, all of which held."""

    @property
    def ci_per_hour(self) -> Pair:
        if not self.ci_per_s or any(v is None for v in self.ci_per_s):
            return None
        return self.ci_per_s[0] * 3600, self.ci_per_s[1] * 3600


class Cost(_Part):
    self_hosted_per_task: Optional[float] = None
    api_per_task: Optional[float] = None
    utilisation: Optional[float] = None
    joules_per_task: Optional[float] = None


class Quality(_Part):
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


class Gpu(_Part):
    available: bool = False
    note: Optional[str] = None
    memory_used_max_bytes: Optional[float] = None
    utilisation_mean_perc: Optional[float] = None
    joules_per_task: Optional[float] = None


class Objective(_Part):
    value: Optional[float] = None
    ci: Pair = None
    unit: str = ""


class TwinEntry(_Part):
    predicted_value: Optional[float] = None
    predicted_rank: Optional[int] = None
    profile: Optional[str] = None


class ConfigResult(_Part):
    """One server config of the study, its points and its verdicts."""

    name: str
    kind: Optional[str] = None
    is_base: bool = False
    differs_by: Optional[str] = None
    status: Optional[str] = None
    error: Optional[str] = None
    points: list[Point] = Field(default_factory=list)
    throughput_tasks_per_hour: Optional[float] = None
    task_p50_s: Optional[float] = None
    task_p95_s: Optional[float] = None
    ttft_p95_ms: Optional[float] = None
    capacity: Optional[Capacity] = None
    cost: Optional[Cost] = None
    quality: Optional[Quality] = None
    gpu: Optional[Gpu] = None
    reference: Optional[dict[str, Any]] = None
    objective: Objective = Field(default_factory=Objective)
    rank: Optional[int] = None
    twin: Optional[TwinEntry] = None


class Comparison(_Part):
    better: str
    worse: str
    difference: Optional[float] = None
    ci: Pair = None
    significant: Optional[bool] = None
    verdict: Optional[str] = None


class Ranking(_Part):
    objective: Optional[str] = None
    unit: Optional[str] = None
    better: Optional[str] = None
    order: list[str] = Field(default_factory=list)
    comparisons: list[Comparison] = Field(default_factory=list)


class TwinPrediction(_Part):
    profile: Optional[str] = None
    calibrated: Optional[bool] = None
    predicted_order: list[str] = Field(default_factory=list)
    measured_order: list[str] = Field(default_factory=list)
    same_order: Optional[bool] = None
    note: Optional[str] = None


class FailedPoint(_Part):
    config: str = ""
    load: Optional[float] = None
    repeat: Optional[int] = None
    source: Optional[str] = None
    error: Optional[str] = None
    folder: Optional[str] = None


class Study(_Part):
    """study.json, as the report reads it."""

    agentload_study: int
    name: str
    description: Optional[str] = None
    complete: Optional[bool] = None
    objective: str = "goodput"
    confidence: Optional[float] = None
    slo: Optional[dict[str, Any]] = None
    axis: Optional[str] = None
    axis_unit: Optional[str] = None
    base: Optional[str] = None
    workload: Optional[dict[str, Any]] = None
    configs: list[ConfigResult]
    ranking: Optional[Ranking] = None
    twin_prediction: Optional[TwinPrediction] = None
    failed_points: list[FailedPoint] = Field(default_factory=list)

    @field_validator("agentload_study")
    @classmethod
    def _known_version(cls, version: int) -> int:
        if version != STUDY_VERSION:
            raise ValueError(f"study.json version {version}; this agentload reads version {STUDY_VERSION}")
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
        return self.objective in ("p95_task", "cost")


def is_study_folder(folder: Path) -> bool:
    """Whether `folder` holds a study.json (and so gets a study report)."""
    return (Path(folder) / STUDY_FILE).is_file()


def load_study(folder: Path) -> tuple[Study, dict[str, Any]]:
    """(the study, study.json as read) of a study folder; `InputError` naming the file and the field
    when the parts the report reads are not as above."""
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
