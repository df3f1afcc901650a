"""The study file: which workload, which configs, which loads, judged how (docs/study.md).

YAML validated by pydantic with unknown keys forbidden; errors name the file, the line and the YAML
path of the bad key, as scenario errors do. The workload, run settings, target defaults and SLO come
from a scenario file (`scenario`, with `set` overrides) or are given inline (`workload`, `run`,
`target`, `slo`); inline keys replace the scenario's. Relative paths resolve against the study file.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, Optional, Sequence

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from ..metrics.slo import Slo
from ..scenario import RunSpec, SyntheticSpec, WorkloadSpec
# read as scenario files are, so that both report errors alike
from ..scenario import overrides as override
from ..scenario.fleet import FleetSpec
from ..server_commands import ServerCommand, VLLMCommand
from ..scenario.yaml_io import FileModel, line_of, read_mapping, read_text, validate

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
"""Config names become folder names."""

Axis = Literal["rate", "rate_scale", "max_in_flight"]
Objective = Literal["goodput", "p95_task", "cost"]


class _Strict(BaseModel):
    """A section of the study file: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class ConfigEntry(_Strict):
    """One config: the base names what it runs (exactly one of `server`, `vllm`, `url`, `emulator`,
    `profile`, `fleet`); a variant names only what it changes (`args`, `env`, `overlay`, `emulator` or
    `fleet` settings), or replaces what runs."""

    name: str = Field(pattern=NAME_PATTERN)
    description: Optional[str] = None
    server: Optional[ServerCommand] = None
    vllm: Optional[VLLMCommand] = None
    url: Optional[str] = None
    """An existing server (not started or stopped by agentload)."""
    emulator: Optional[dict[str, Any]] = None
    """The built-in emulator with these settings (a variant's are merged over the base's)."""
    profile: Optional[str] = None
    """A twin profile: preset name or YAML file (relative to the study file)."""
    fleet: Optional[FleetSpec] = None
    """Replicas behind a router (a scenario's `fleet` section, `simulator.scenario.fleet.FleetSpec`): with
    `profile`, or no replica kind, a fleet on the twin; with `emulator`, `vllm`, `server` or `urls`, a
    live one. In a variant, what it changes of the base's fleet, merged key by key (`{replicas: 4}`,
    `{router: {policy: manual}}`); over a base that is no fleet, a fleet of the base's server."""
    args: list[str] = []
    """Flags appended to the base's server command (`server` argv or `vllm` args)."""
    env: dict[str, str] = {}
    """Environment variables added to the base's server."""
    overlay: dict[str, Any] = {}
    """Profile settings (shaped like a profile file) over the base's: the config on the twin."""
    model: Optional[str] = None
    """Model name to send (default: the target's, else the server's first)."""

    def kinds(self) -> list[str]:
        """The kinds this entry names (at most one is valid)."""
        return [k for k in ("server", "vllm", "url", "emulator", "profile", "fleet") if getattr(self, k) is not None]


class ConfigsSpec(_Strict):
    """The base config and its variants (each differs from the base in what its name says)."""

    base: ConfigEntry
    variants: list[ConfigEntry] = []

    @field_validator("base")
    @classmethod
    def _one_kind(cls, base: ConfigEntry) -> ConfigEntry:
        if len(base.kinds()) != 1:
            raise ValueError("the base config needs exactly one of server, vllm, url, emulator, profile, fleet")
        return base

    @model_validator(mode="after")
    def _check(self) -> ConfigsSpec:
        names = [self.base.name] + [v.name for v in self.variants]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"config names must differ: {', '.join(duplicates)} given twice")
        for v in self.variants:
            if len(v.kinds()) > 1:
                raise ValueError(f"variant {v.name}: at most one of server, vllm, url, emulator, profile, fleet")
        return self


class RangeSpec(_Strict):
    """`num` values from `start` to `stop`, evenly spaced (`linear`) or by a constant factor (`log`)."""

    start: float = Field(gt=0)
    stop: float = Field(gt=0)
    num: int = Field(ge=2, le=1000)
    scale: Literal["linear", "log"] = "linear"


class LoadSpec(_Strict):
    """The sweep: an axis and its values (`points` or `range`)."""

    axis: Axis
    """rate: top-level tasks per second (the workload's arrivals rescaled, the same tasks at each rate);
    rate_scale: the same as a factor of the workload's own rate; max_in_flight: closed-loop concurrency."""
    points: Optional[list[float]] = None
    range: Optional[RangeSpec] = None

    @model_validator(mode="after")
    def _one(self) -> LoadSpec:
        if (self.points is None) == (self.range is None):
            raise ValueError("give `points` or `range`")
        if self.points is not None and (not self.points or any(p <= 0 for p in self.points)):
            raise ValueError("points must be a non-empty list of values > 0")
        if self.axis == "max_in_flight" and any(v != int(v) for v in self.values()):
            raise ValueError("max_in_flight values must be whole numbers")
        return self

    def values(self) -> list[float]:
        """The sweep's values, in the order given (a range: ascending)."""
        if self.points is not None:
            return list(self.points)
        r = self.range
        assert r is not None
        if r.scale == "log":
            return [r.start * (r.stop / r.start) ** (i / (r.num - 1)) for i in range(r.num)]
        return [r.start + (r.stop - r.start) * i / (r.num - 1) for i in range(r.num)]


class CapacitySpec(_Strict):
    """The capacity search: the highest task arrival rate (tasks/s) at which every SLO holds."""

    low: float = Field(gt=0)
    """First rate probed (tasks/s); halved until a rate passes."""
    high: Optional[float] = Field(None, gt=0)
    """Second rate probed (default: 4 x low); doubled until a rate fails."""
    min_rate: Optional[float] = Field(None, gt=0)
    """Lowest rate probed when halving (default: low / 16): a config that fails the SLO even there is
    below the range (an SLO its tasks cannot meet at any load stops the search here)."""
    precision: float = Field(0.05, gt=0, lt=1)
    """Bisection stops when the bracket's high is within this share above its low."""
    max_probes: int = Field(12, ge=2, le=100)
    """Most points one repeat's search runs."""
    repeats: Optional[int] = Field(None, ge=1, le=100)
    """Independent searches (default: the study's `repeats`), each with its own seed."""
    max_failed_share: float = Field(0.01, ge=0, le=1)
    """A point whose share of failed or cancelled tasks exceeds this does not hold the SLO."""
    max_growth: Optional[float] = Field(None, ge=0)
    """Also require a steady queue: a point whose tasks' extra time over the same tasks at a lower load
    grew over its arrivals (significantly, and by more than this share of the task SLO's per-item bound)
    is not sustainable and does not hold the SLO. For runs much longer than a task, whose queue reaches
    its steady state (fixed-shape workloads, long traces with a warm-up): in a run of a few tasks' length
    the load's ramp-up from an empty server grows too. Default: not checked."""

    @model_validator(mode="after")
    def _order(self) -> CapacitySpec:
        if self.high is not None and self.high <= self.low:
            raise ValueError("high must be above low")
        if self.min_rate is not None and self.min_rate >= self.low:
            raise ValueError("min_rate must be below low")
        return self


class ApiPrices(_Strict):
    """API prices, $ per million tokens."""

    input: float = Field(ge=0)
    cached_input: Optional[float] = Field(None, ge=0)
    """Default: the input price."""
    output: float = Field(ge=0)


class CostSpec(_Strict):
    """What a task costs: self-hosted (GPU $/hour x GPUs) and through an API."""

    gpu_hour: Optional[float] = Field(None, ge=0)
    """$ per GPU-hour."""
    gpus: int = Field(1, ge=1)
    api: Optional[ApiPrices] = None


class QualitySpec(_Strict):
    """The quality check: probes from the workload sent greedily to every live config, compared with the base's."""

    probes: int = Field(8, ge=1, le=1000)
    """The first call of this many top-level tasks (in arrival order)."""
    max_tokens: int = Field(16, ge=1)
    """Fixed output length of every probe (the end-of-sequence token ignored)."""
    logprobs: bool = True
    """Ask for each output token's log probability (when the server gives them)."""
    flag_below: float = Field(1.0, gt=0, le=1)
    """A variant whose share of outputs identical to the base's is below this is flagged."""
    logprob_tolerance: Optional[float] = Field(1e-3, gt=0)
    """A variant whose log probabilities differ from the base's by more than this on average (nats, over
    the common prefixes) is flagged though its outputs be identical: its numerics changed. The same
    numerics move them by 0; bfloat16 against float32 moved them by 2.5e-3 on the tiny CPU model whose
    16-token outputs it left identical. None: outputs only."""


class ReferenceSpec(_Strict):
    """A fixed-shape run per config beside the agent figures (the 512/512 figure)."""

    synthetic: SyntheticSpec
    label: Optional[str] = None


SECONDS_PER = {"second": 1.0, "minute": 60.0, "hour": 3600.0}
"""Seconds in each unit a sizing rate may be given per."""


class SizingSpec(_Strict):
    """The sizing question: the fewest replicas whose capacity carries `rate` top-level tasks (sessions)
    within the SLO, asked of the fleet configs that differ only in their replica count."""

    rate: float = Field(gt=0)
    """The task arrival rate the fleet must carry, in tasks per `per`."""
    per: Literal["second", "minute", "hour"] = "minute"

    @property
    def rate_per_s(self) -> float:
        """The rate in tasks per second."""
        return self.rate / SECONDS_PER[self.per]


class TwinSpec(_Strict):
    """The twin's prediction of a live study: each config as `profile` plus its `overlay`."""

    profile: str
    """Preset name or YAML file (relative to the study file); with `calibrate`, the base whose
    scheduler and KV settings the calibration keeps."""
    calibrate: bool = False
    """Calibrate `profile` on the base config's server (as `agentload calibrate`) before its load."""
    calibrate_repeat: int = Field(1, ge=1)
    calibrate_max_prompt: Optional[int] = Field(None, gt=0)


class SpaceSpec(_Strict):
    """A grid of profile settings searched on the twin; the best `top_k` are then run live."""

    grid: dict[str, list[Any]]
    """Dotted profile keys (scheduler.max_num_seqs, spec_decode.num_tokens, ...) and their values."""
    args: dict[str, Any] = {}
    """How a key becomes a server flag for the live runs: "--flag {value}", or {value: "--flag ..."}."""
    top_k: int = Field(2, ge=1)
    profile: Optional[str] = None
    """The twin profile the grid overlays (default: twin.profile, else the base config's profile)."""

    @field_validator("grid")
    @classmethod
    def _grid(cls, grid: dict[str, list[Any]]) -> dict[str, list[Any]]:
        if not grid:
            raise ValueError("give at least one setting")
        for key, values in grid.items():
            if not re.fullmatch(r"[a-z_]+\.[a-z_]+", key):
                raise ValueError(f"{key}: a grid key is section.field, e.g. scheduler.max_num_seqs")
            if not values:
                raise ValueError(f"{key}: give at least one value")
        return grid


class TargetDefaults(_Strict):
    """Target settings of live configs (the server's URL comes from each config)."""

    model: Optional[str] = None
    api: Optional[Literal["completions", "chat"]] = None
    vocab_size: Optional[int] = Field(None, ge=32)
    stall_timeout: Optional[float] = Field(None, gt=0)
    total_timeout: Optional[float] = Field(None, gt=0)
    metrics: Optional[bool] = None


class StudySpec(_Strict, FileModel):
    """A study file."""

    name: Optional[str] = Field(None, pattern=NAME_PATTERN)
    description: Optional[str] = None
    scenario: Optional[str] = None
    """Scenario file whose workload, run settings, target and SLO the study uses."""
    set: list[str] = []
    """``key.path=value`` overrides of the scenario, as `agentload run --set` takes them."""
    workload: Optional[WorkloadSpec] = None
    run: Optional[RunSpec] = None
    """Run settings; keys given replace the scenario's."""
    target: Optional[TargetDefaults] = None
    slo: Optional[Slo] = None
    """The task SLO (task_s) and call SLOs (ttft_ms, tpot_ms) the capacity is judged against."""
    configs: ConfigsSpec
    load: Optional[LoadSpec] = None
    capacity: Optional[CapacitySpec] = None
    repeats: int = Field(1, ge=1, le=100)
    """Runs of each load point; repeat k uses seed + k (the workload's and the prompts')."""
    warmup: Optional[float] = Field(None, ge=0)
    """Seconds at the start of each point left out of its figures (at the workload's own rate; a
    rescaled workload's warm-up is rescaled with it). Default: the scenario's run.warmup."""
    warmup_calls: int = Field(0, ge=0)
    """Calls sent to a newly started server before its first point (not measured)."""
    drain: Optional[float] = Field(None, ge=0)
    """Seconds after the last arrival before a point's unfinished tasks are cancelled."""
    objective: Objective = "goodput"
    rank_at: Optional[float] = Field(None, gt=0)
    """Sweep value the per-config figures and a p95_task ranking are taken at (default: the highest)."""
    confidence: float = Field(0.9, gt=0.5, lt=1)
    cost: Optional[CostSpec] = None
    """What a task costs; for a fleet config, `gpus` is each replica's and the fleet pays for all of them."""
    sizing: Optional[SizingSpec] = None
    """The fewest replicas that carry a task rate within the SLO (needs `capacity`)."""
    quality: Optional[QualitySpec] = None
    gpu: Literal["auto", "on", "off"] = "auto"
    """Sample GPUs through NVML during live points (auto: when nvidia-ml-py and a GPU are there)."""
    reference: Optional[ReferenceSpec] = None
    twin: Optional[TwinSpec] = None
    space: Optional[SpaceSpec] = None
    output: Optional[str] = None
    """Study folder (default: results/<name>); a study started again in its folder resumes."""

    @model_validator(mode="after")
    def _check(self) -> StudySpec:
        if self.scenario is None and self.workload is None:
            raise ValueError("give `scenario` or `workload`")
        if self.load is None and self.capacity is None and self.reference is None:
            raise ValueError("give `load`, `capacity` or `reference`: the study has nothing to run")
        if self.sizing is not None and self.capacity is None:
            raise ValueError("`sizing` reads the fleets' capacities: give `capacity` too")
        return self

    _notes: list[str] = PrivateAttr(default_factory=list)
    _node: Any = PrivateAttr(None)
    """The YAML node the study was read from (None: made without a file), for the lines of later errors."""

    def line(self, path: Sequence[str | int]) -> Optional[int]:
        """The study file's line of the key at `path` (the deepest part of it the file has; None without
        a file)."""
        return line_of(self._node, list(path)) if self._node is not None else None

    @property
    def notes(self) -> list[str]:
        """What loading the file decided that a reader of the results must know (an override's reach)."""
        return self._notes

    @property
    def source(self) -> str:
        """The study file (set by the loader; "<study>" for a study made without one)."""
        return self._source or "<study>"

    def display_name(self) -> str:
        """The study's name: `name`, else the file's stem."""
        return self.name or (Path(self._source).stem if self._source else "study")

    def config_entries(self) -> list[ConfigEntry]:
        """The base, then the variants."""
        return [self.configs.base, *self.configs.variants]


def load(path: str | Path, overrides: Sequence[str] = ()) -> StudySpec:
    """Read and validate a study file, applying ``key.path=value`` overrides (values parsed as YAML)."""
    path = Path(path)
    return parse(read_text(path, "study file"), str(path), overrides)


def parse(text: str, source: str, overrides: Sequence[str] = ()) -> StudySpec:
    """Validate study YAML text; `source` names it in errors and anchors relative paths."""
    data, node = read_mapping(
        text, source, "a study", "a study must be a mapping (scenario or workload, configs, load or capacity)")
    set_keys = override.apply(data, overrides, source)
    notes = _repeats_everywhere(data, set_keys)
    spec = validate(StudySpec, data, node, source, set_keys, "a study")
    spec._notes = notes
    spec._node = node
    return spec


def _repeats_everywhere(data: dict, set_keys: set[str]) -> list[str]:
    """`--set repeats=N` means every repeat of the study: the capacity searches' too, whose own
    `capacity.repeats` in the file would otherwise win. Returns the note saying so (none when nothing
    was overridden)."""
    capacity = data.get("capacity")
    if "repeats" not in set_keys or "capacity.repeats" in set_keys or not isinstance(capacity, dict) \
            or capacity.get("repeats") is None:
        return []
    was, capacity["repeats"] = capacity["repeats"], data.get("repeats")
    return [f"repeats {data.get('repeats')} (--set) also for the capacity searches: the file's capacity.repeats "
            f"{was} overridden"]
