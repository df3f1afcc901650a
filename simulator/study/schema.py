"""The study file: which workload, which configs, which loads, judged how (docs/study.md).

YAML validated by pydantic with unknown keys forbidden; errors name the file, the line and the YAML
path of the bad key, as scenario errors do. The workload, run settings, target defaults and SLO come
from a scenario file (`scenario`, with `set` overrides) or are given inline (`workload`, `run`,
`target`, `slo`); inline keys replace the scenario's. Relative paths resolve against the study file.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, Optional, Sequence, Union

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from ..metrics.slo import Slo
from ..scenario import RunSpec, SyntheticSpec, WorkloadSpec
# read as scenario files are, so that both report errors alike
from ..scenario import overrides as override
from ..scenario.fleet import FleetSpec
from ..server_commands import ServerCommand, VLLMCommand
from ..scenario.yaml_io import FileModel, line_of, read_mapping, read_text, validate
from ..validation import unknown_keys
from . import settings as space_settings

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
"""Config names become folder names."""

Axis = Literal["rate", "rate_scale", "max_in_flight"]
Objective = Literal["goodput", "p95_task", "cost", "energy"]


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


class HoldoutSpec(_Strict):
    """The held-out capacity check: the found capacity run on traffic its search never saw
    (`simulator.study.holdout`). Give `seed` or `split`, or neither (the held-out seed's default)."""

    seed: Optional[int] = Field(None, ge=0)
    """The held-out traffic's run seed, one no repeat uses (default: the first after the repeats', run.seed
    + repeats); a generated workload's generator seed moves with it, as a repeat's does."""
    split: Optional[float] = Field(None, gt=0, lt=1)
    """Cut the workload's top-level tasks in arrival order: this share first, for every other point of the
    study (the sweep and the search), the rest for the check."""
    at: list[float] = [1.0, 0.9]
    """The rates checked, as shares of the found capacity."""

    @model_validator(mode="after")
    def _one(self) -> HoldoutSpec:
        if self.seed is not None and self.split is not None:
            raise ValueError("give `seed` or `split`, not both")
        if not self.at or any(not 0 < share <= 1 for share in self.at) or len(set(self.at)) != len(self.at):
            raise ValueError("`at`: one or more different shares of the capacity, each above 0 and at most 1")
        return self


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
    holdout: Optional[HoldoutSpec | bool] = None
    """The held-out check (`HoldoutSpec`; true: its defaults; false: off). Default: on, at the first seed no
    repeat uses, where the seed draws new tasks (a workload generated from a model); off otherwise, with a
    note (a trace replays the same tasks at every seed: give `split`)."""

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


class SettingRange(_Strict):
    """A setting searched over a range (`space.method: tpe`): a whole-number profile field takes whole
    numbers from `low` to `high`, a real one any number between them (or only `low + k x step`)."""

    low: float
    high: float
    log: bool = False
    """Sample evenly in log(value) rather than in value (low above 0; no `step`)."""
    step: Optional[float] = Field(None, gt=0)
    """Only values `low + k x step` (a whole-number field: default 1); high - low a multiple of it."""

    @model_validator(mode="after")
    def _order(self) -> SettingRange:
        if self.high <= self.low:
            raise ValueError("high must be above low")
        if self.log and self.low <= 0:
            raise ValueError("a log scale needs low above 0")
        if self.log and self.step is not None:
            raise ValueError("give `log` or `step`, not both")
        if self.step is not None and not _multiple(self.high - self.low, self.step):
            raise ValueError(f"high - low ({self.high - self.low:g}) must be a multiple of step {self.step:g}")
        return self


def _multiple(span: float, step: float) -> bool:
    """Whether `span` is a whole number of `step`s (to float precision)."""
    k = round(span / step)
    return abs(span - k * step) <= 1e-9 * max(abs(span), step)


SettingValues = Union[SettingRange, list[Any]]
"""A setting's values: a list (every one, or categorical choices), or a range."""
SETTING_KEY = r"[a-z_]+\.[a-z_]+"


class SpaceSpec(_Strict):
    """A config space of profile settings searched on the twin, every combination of a `grid` or a
    Bayesian search of `settings` within a `budget`; the best `top_k` (with several `objectives`, the
    Pareto front's) are then run live."""

    method: Literal["grid", "tpe"] = "grid"
    """grid: every combination of `grid`; tpe: Optuna's TPE sampler proposes candidates of `settings`
    until `budget` of them ran on the twin (pip install 'agentload[search]')."""
    grid: Optional[dict[str, list[Any]]] = None
    """Dotted profile keys (scheduler.max_num_seqs, spec_decode.num_tokens, ...) and their values."""
    settings: Optional[dict[str, SettingValues]] = None
    """The search's settings (tpe): a dotted profile key and a list of choices, or a range
    {low, high, log, step} of a number field (whole or real as the profile field is)."""
    budget: Optional[int] = Field(None, ge=1)
    """Twin evaluations the search may spend (tpe): candidates simulated. A candidate proposed again, or
    one the server could not start (`simulator.study.feasible`), costs none."""
    seed: int = Field(0, ge=0)
    """The search's seed (tpe): the same seed, space and study give the same candidates."""
    batch: int = Field(1, ge=1)
    """Candidates proposed at once (tpe), evaluated together (in parallel with --ray); the same batch gives
    the same search with or without --ray."""
    objectives: Optional[list[Objective]] = None
    """Two or more objectives: the space's Pareto front (no candidate better in one and no worse in the
    others) instead of the study's `objective` alone; the front's `top_k` best by the first run live."""
    args: dict[str, Any] = {}
    """How a key becomes a server flag for the live runs: "--flag {value}", or {value: "--flag ..."}."""
    top_k: int = Field(2, ge=1)
    profile: Optional[str] = None
    """The twin profile the grid overlays (default: twin.profile, else the base config's profile)."""

    @field_validator("grid")
    @classmethod
    def _grid(cls, grid: Optional[dict[str, list[Any]]]) -> Optional[dict[str, list[Any]]]:
        if grid is None:
            return grid
        if not grid:
            raise ValueError("give at least one setting")
        _known(grid)
        for key, values in grid.items():
            if not values:
                raise ValueError(f"{key}: give at least one value")
            _takes(key, values)
        return grid

    @field_validator("settings")
    @classmethod
    def _settings(cls, given: Optional[dict[str, SettingValues]]) -> Optional[dict[str, SettingValues]]:
        if given is None:
            return given
        if not given:
            raise ValueError("give at least one setting")
        _known(given)
        for key, values in given.items():
            if isinstance(values, list):
                if not values:
                    raise ValueError(f"{key}: give at least one value")
                odd = [v for v in values if v is not None and not isinstance(v, (bool, int, float, str))]
                if odd:
                    raise ValueError(f"{key}: a choice is a number, a flag or a name, not {odd[0]!r}")
                if len(set(map(repr, values))) != len(values):
                    raise ValueError(f"{key}: a choice is given twice")
                _takes(key, values)
                continue
            kind = space_settings.number_kind(key)
            if kind is None:
                raise ValueError(f"{key} is no number: give its choices as a list")
            if kind == "int" and not all(float(v).is_integer() for v in (values.low, values.high, values.step or 1)):
                raise ValueError(f"{key} takes whole numbers: low, high and step must be whole")
            _takes(key, [values.low, values.high])
        return given

    @model_validator(mode="after")
    def _method(self) -> SpaceSpec:
        if self.method == "grid":
            if self.grid is None:
                raise ValueError("give `grid` (or `method: tpe` with `settings` and `budget`)")
            unused = [k for k in ("settings", "budget") if getattr(self, k) is not None]
            if unused:
                raise ValueError(f"{' and '.join(unused)}: for `method: tpe`; a grid runs every combination of `grid`")
        else:
            if self.grid is not None:
                raise ValueError("method tpe searches `settings` (a list of choices or a range each), not `grid`")
            if self.settings is None or self.budget is None:
                raise ValueError("method tpe needs `settings` and `budget` (twin evaluations)")
        if self.objectives is not None and (len(self.objectives) < 2 or len(set(self.objectives)) != len(self.objectives)):
            raise ValueError("objectives: two or more different ones (one objective is the study's `objective`)")
        return self


def _known(keys: dict[str, Any]) -> None:
    """Each key a profile field a space may vary (an unknown one named, with the closest known key)."""
    for key in keys:
        if not re.fullmatch(SETTING_KEY, key):
            raise ValueError(f"{key}: a setting is section.field, e.g. scheduler.max_num_seqs")
    unknown = [key for key in keys if not space_settings.is_known(key)]
    if unknown:
        raise unknown_keys(unknown, space_settings.known_keys(), "profile setting")


def _takes(key: str, values: list[Any]) -> None:
    """Each value one the profile field takes."""
    for value in values:
        why = space_settings.refusal(key, value)
        if why is not None:
            raise ValueError(f"{key}: {value!r}: {why}")


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
