"""The scenario file: what to replay (`workload`), against what (`target`), how (`run`), judged by (`slo`).

A scenario is YAML validated by pydantic with unknown keys forbidden. Errors name the file, the line
(from the YAML node marks) and the YAML path of the bad key. Relative trace and model paths resolve
against the scenario file's folder; `run.output` resolves against the current directory. Without a
`target` the run starts the built-in emulator (with the `emulator` settings) and targets it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Sequence, Union
from urllib.parse import urlsplit

import yaml
from pydantic import (BaseModel, ConfigDict, Field, PlainValidator, PrivateAttr, ValidationError, WithJsonSchema,
                      field_validator, model_validator)

from . import validation
from .errors import InputError
from .metrics.slo import PERCENTILE_KEYS, Slo
from .transforms import TransformSpec
from .transforms import apply as apply_transforms
from .workload import MAX_SECONDS, MAX_TOKENS, Workload


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # `drain: .inf` is a typo, not a setting


class GenerateOptions(_Strict):
    """How to generate a workload from a workload model."""

    tasks: Optional[int] = Field(None, gt=0, description="Number of top-level tasks to generate.")
    duration: Optional[float] = Field(None, gt=0, description="Seconds of arrivals to generate.")
    seed: Optional[int] = Field(None, description="Seed of the generator (default: run.seed).")
    rate: Optional[float] = Field(None, gt=0, description="Tasks per second, replacing the model's fitted rate.")
    burstiness: Optional[float] = Field(
        None, gt=0, le=1e6, description="Gamma shape of the gaps between arrivals, replacing the fitted arrival "
        "process by a gamma renewal process at the fitted rate or `rate` (1: Poisson; lower: burstier).")

    @model_validator(mode="after")
    def _one_amount(self) -> "GenerateOptions":
        if self.tasks is not None and self.duration is not None:
            raise ValueError("give `tasks` or `duration`, not both")
        return self


class SyntheticSpec(_Strict):
    """A fixed-shape workload, as servers are usually quoted ("512 in, 512 out, 256 concurrent"):
    `concurrency` closed-loop streams arriving at once, each sending its next call as soon as the last
    ended, every prompt unique (no prefix sharing)."""

    input_tokens: int = Field(gt=0, le=MAX_TOKENS, description="Prompt tokens of every call.")
    output_tokens: int = Field(gt=0, le=MAX_TOKENS, description="Output tokens of every call.")
    concurrency: int = Field(gt=0, le=1_000_000, description="Streams running at once (one task each).")
    calls: Optional[int] = Field(None, gt=0, le=100_000_000, description="Calls in all, spread evenly over the streams (default: 8 a stream).")


class WorkloadSpec(_Strict):
    """Where the tasks come from: a recorded trace, or a workload model to generate from; then transforms."""

    trace: Optional[Union[str, list[str]]] = Field(None, description="Trace file(s) or folder(s); relative to the scenario file.")
    format: Optional[str] = Field(None, description="Trace format (default: detected from content).")
    on_error: Literal["raise", "skip"] = Field("raise", description="Stop at a bad trace record, or skip and count it.")
    assume_append_only: bool = Field(
        False,
        description="For traces without hash ids: assume each call's prompt is the previous prompt + output + what "
        "was appended (an agent loop's context) and derive prefix hash ids from the token counts (with `trace`).",
    )
    model: Optional[str] = Field(None, description="Workload model YAML file to generate tasks from; relative to the scenario file.")
    synthetic: Optional[SyntheticSpec] = Field(None, description="A fixed-shape closed-loop workload instead of a trace or a model.")
    generate: Optional[GenerateOptions] = Field(None, description="Generation options (with `model`).")
    transforms: Optional[TransformSpec] = Field(
        None, description="Transforms applied to the workload, in the order filter, sample, rate, time, gaps, gap cap, tokens."
    )
    stagger: Optional[float] = Field(
        None, ge=0, le=MAX_SECONDS,
        description="Re-space top-level arrivals this many seconds apart, in arrival order, after the transforms "
        "(for traces whose sessions carry no arrival times).",
    )

    @field_validator("format")
    @classmethod
    def _known_format(cls, value: Optional[str]) -> Optional[str]:
        if value is None:
            return value
        try:
            from .traces import formats  # noqa: PLC0415 - the importers load only for a scenario that names one
        except ImportError:  # a broken importer is reported when the trace loads, not here
            return value
        known = formats()
        if value not in known:
            raise validation.bad_choice(value, known, "trace format")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> "WorkloadSpec":
        if sum(source is not None for source in (self.trace, self.model, self.synthetic)) != 1:
            raise ValueError("give exactly one of `trace`, `model` or `synthetic`")
        if self.generate is not None and self.model is None:
            raise ValueError("`generate` needs `model`")
        return self

    def trace_paths(self) -> list[str]:
        if self.trace is None:
            return []
        return [self.trace] if isinstance(self.trace, str) else list(self.trace)


class TargetSpec(_Strict):
    """The server under test: an OpenAI-compatible endpoint (vLLM, ...)."""

    base_url: str = Field(description="e.g. http://localhost:8000 (the /v1/... paths are added).")
    model: Optional[str] = Field(None, description="Model name to send (default: the server's first model).")
    api: Literal["completions", "chat"] = Field(
        "completions", description="completions: token-id prompts of exact length; chat: calibrated text."
    )
    api_key_env: Optional[str] = Field(None, description="Name of the environment variable holding the API key.")
    headers: dict[str, str] = Field(default_factory=dict, description="Extra HTTP headers.")
    connect_timeout: float = Field(10.0, gt=0, description="Seconds to connect.")
    stall_timeout: float = Field(60.0, gt=0, description="Seconds without a byte before a call fails as 'stall'.")
    total_timeout: Optional[float] = Field(None, gt=0, description="Seconds a call may take in all.")
    max_connections: int = Field(0, ge=0, description="Connection pool limit (0: unlimited).")
    share_prefixes: bool = Field(True, description="Build prompts so that equal hash ids share token prefixes.")
    vocab_size: int = Field(
        32000, ge=32, description="Size of the model's vocabulary: token-id prompts draw ids from [10, vocab_size - 10)."
    )
    metrics: bool = Field(
        True,
        description="Scrape the server's Prometheus /metrics (vLLM) every run.scrape_interval seconds during the run; "
        "a server without it (HTTP 404, ...) turns this off with a note.",
    )
    gpu_metrics: bool = Field(
        False, description="Also sample this machine's GPUs through NVML (needs nvidia-ml-py): for a server on this machine."
    )

    # The checks below never echo the value: a URL or a header may hold a credential.
    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, value: str) -> str:
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 - raises ValueError for a port that is not a number in range
        except ValueError:
            raise ValueError("not a URL (e.g. http://localhost:8000)") from None
        if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() or ord(c) < 32 for c in value):
            raise ValueError("must be an http:// or https:// URL with a host, e.g. http://localhost:8000")
        return value

    @field_validator("headers")
    @classmethod
    def _check_headers(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not _HEADER_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not an HTTP header name")
            if any(c in text for c in "\r\n\0"):
                raise ValueError(f"the value of header {name!r} holds a line break or NUL")
        return value


_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
"""An HTTP field name (RFC 9110 token)."""


def _check_workers(value: Any) -> Union[int, str]:
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise ValueError(f"must be a number of shards (1 or more) or 'auto', got {value!r}")


Workers = Annotated[Union[int, str], PlainValidator(_check_workers),
                    WithJsonSchema({"anyOf": [{"type": "integer", "minimum": 1}, {"const": "auto"}]})]
"""`run.workers`: a number of shards, or 'auto'."""


class RunSpec(_Strict):
    """How the replay runs. Figures cover the window [warmup, end of arrivals - cooldown]."""

    duration: Optional[float] = Field(
        None, gt=0, description="Seconds of arrivals: tasks arriving later are not started (default: all)."
    )
    max_tasks: Optional[int] = Field(None, gt=0, description="Replay only the first N tasks by arrival.")
    drain: Optional[float] = Field(
        None, ge=0, description="Seconds to let in-flight tasks finish after the last arrival before cancelling them (default: no limit)."
    )
    warmup: float = Field(0.0, ge=0, description="Seconds at the start whose arrivals and sends are left out of figures.")
    cooldown: float = Field(0.0, ge=0, description="Seconds at the end of the arrival window left out of figures.")
    max_in_flight: Optional[int] = Field(
        None, gt=0, description="Most top-level tasks running at once; later arrivals wait (their lag is reported)."
    )
    seed: int = Field(0, description="Seed for generation, sampling and prompt content.")
    retries: int = Field(0, ge=0, description="Retries of a failed call before its task gives up.")
    backoff: float = Field(1.0, ge=0, description="Seconds before the first retry; doubles on each further one.")
    output: str = Field("results", description="Folder under which each run writes its result folder.")
    scrape_interval: float = Field(1.0, gt=0, description="Seconds between two scrapes of the server's /metrics.")
    workers: Optional[Workers] = Field(
        None, description="Shards the run's tasks are spread over, each a Ray actor with its own process, event loop "
        "and client (whole tasks, dealt round-robin by arrival); 'auto': enough that no shard starts more calls at "
        "one instant than it times honestly, one per CPU of the cluster at most. Set, the run goes through Ray (`--ray` picks "
        "the cluster; pip install 'agentload[ray]'); see docs/scale-out.md. Default: one process (auto with --ray).")


class Scenario(_Strict):
    """A replay scenario: workload + target + run settings + SLO."""

    name: Optional[str] = Field(None, description="Name used for the result folder (default: the file name).")
    description: Optional[str] = None
    workload: WorkloadSpec
    target: Optional[TargetSpec] = Field(None, description="Server under test (default: the built-in emulator).")
    emulator: dict[str, Any] = Field(
        default_factory=dict,
        description="Settings of the built-in emulator, used when `target` is absent (simulator.emulator.settings."
        "EmulatorSettings). `profile: NAME|PATH` (a server-profile preset or YAML file, relative to the scenario "
        "file) makes it run the server twin of that profile in real time, as `agentload simulate -p` does; "
        "otherwise `ttft`/`itl` (fixed timing) or `prefill_per_token`/`decode_per_seq`/`decode_base` (batching).",
        json_schema_extra={"properties": {"profile": {
            "type": "string", "description": "Server profile (preset name or YAML path) whose twin serves the requests."}}},
    )
    run: RunSpec = Field(default_factory=RunSpec)
    slo: Slo = Field(default_factory=Slo)

    @field_validator("emulator", mode="before")
    @classmethod
    def _no_emulator(cls, value: Any) -> Any:
        return {} if value is None else value  # `emulator: null` (or --set emulator=null): no settings

    @field_validator("emulator")
    @classmethod
    def _check_emulator(cls, value: dict[str, Any]) -> dict[str, Any]:
        known = _emulator_settings()
        if known is not None:
            unknown = set(value) - known
            if unknown:
                raise validation.unknown_keys(unknown, known, "emulator setting")
        if "profile" in value and not isinstance(value["profile"], str):
            raise ValueError("emulator.profile must be a preset name or a YAML path")
        if known is not None:
            from .emulator.settings import check  # noqa: PLC0415 - keep scenario loading light

            value = check(value)
        return value

    @model_validator(mode="after")
    def _target_or_emulator(self) -> "Scenario":
        if self.target is not None and self.emulator:
            raise ValueError("`emulator` settings apply only without a `target` (the run would not start the "
                             "emulator): remove one of them (--set emulator=null drops the emulator settings)")
        return self

    _source: Optional[str] = PrivateAttr(None)

    @property
    def source(self) -> Optional[str]:
        """The scenario file (set by the loader)."""
        return self._source

    def base_dir(self) -> Path:
        """The folder relative workload paths resolve against."""
        return Path(self.source).resolve().parent if self.source else Path.cwd()

    def display_name(self) -> str:
        if self.name:
            return self.name
        return Path(self.source).stem if self.source else "scenario"


def _emulator_settings() -> Optional[set[str]]:
    try:
        from .emulator.settings import EmulatorSettings  # noqa: PLC0415 - keep scenario loading light
    except ImportError:
        return None
    return {f.name for f in dataclasses.fields(EmulatorSettings)} | {"host", "port"}


def json_schema() -> dict[str, Any]:
    """JSON Schema of a scenario file (docs/scenario.schema.json is generated from it)."""
    schema = Scenario.model_json_schema(by_alias=True)
    schema["$id"] = "https://agentload.dev/scenario.schema.json"
    schema["title"] = "agentload scenario"
    return schema


def schema_text() -> str:
    """docs/scenario.schema.json as it should read."""
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


def write_schema(path: str | Path = "docs/scenario.schema.json") -> None:
    """Regenerate the JSON Schema file of scenarios."""
    Path(path).write_text(schema_text())


# --- loading -----------------------------------------------------------------------------------


def load(path: str | Path, overrides: Sequence[str] = ()) -> Scenario:
    """Read and validate a scenario file, applying ``key.path=value`` overrides (values parsed as YAML)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read scenario: {exc.strerror}", file=str(path)) from None
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (byte {exc.start})", file=str(path)) from None
    return parse(text, str(path), overrides)


def parse(text: str, source: str, overrides: Sequence[str] = ()) -> Scenario:
    """Validate scenario YAML text; `source` names it in errors and anchors relative paths."""
    data, node, set_keys = read_mapping(text, source, overrides, "a scenario",
                                        "a scenario must be a mapping (workload, target, run, slo)")
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        raise describe_error(exc, node, source, set_keys, model=Scenario) from None
    except RecursionError:
        raise InputError("a value is nested too deeply to be a scenario setting", file=source) from None
    scenario._source = source
    _resolve_emulator_profile(scenario, node, source)
    return scenario


def read_mapping(text: str, source: str, overrides: Sequence[str], what: str,
                 not_a_mapping: str) -> tuple[dict, Any, set[str]]:
    """A YAML file's mapping (for a scenario, or a study that embeds one), with its `--set KEY=VALUE`
    overrides applied: (data, the YAML node that locates lines in errors, the keys set). `what` names
    the file in errors ("a scenario"); `not_a_mapping` is the error when the top level is no mapping."""
    if _too_deep(text):
        raise InputError(f"YAML nested more than {MAX_NESTING} levels deep: not {what}", file=source)
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise InputError(f"invalid YAML: {getattr(exc, 'problem', exc)}", file=source,
                         line=mark.line + 1 if mark else None) from None
    except RecursionError:  # PyYAML composes nested nodes recursively
        raise InputError(f"YAML nested too deeply to be {what}", file=source) from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise InputError(not_a_mapping, file=source)
    set_keys = {_apply_override(data, item, source) for item in overrides}
    return data, node, set_keys


def _resolve_emulator_profile(scenario: Scenario, root: Any, source: str) -> None:
    """Check `emulator.profile` loads, a relative YAML path resolved against the scenario's folder."""
    name = scenario.emulator.get("profile")
    if name is None:
        return
    from .sim.profile import load_profile  # noqa: PLC0415 - only scenarios that ask for a twin

    path = _resolve(scenario.base_dir(), name)
    try:
        if path.suffix in (".yaml", ".yml") and path.is_file():
            name = scenario.emulator["profile"] = str(path)
        load_profile(name)
    except (InputError, OSError) as exc:  # OSError: e.g. a name too long for the file system
        found = exc.problems if isinstance(exc, InputError) else (InputError(exc.strerror or str(exc)),)
        line = _line_of(root, ["emulator", "profile"])
        raise InputError.several([
            InputError(f"emulator profile: {f'at {p.path}: ' if p.path else ''}{p.message}", file=source, line=line,
                       path="emulator.profile", field="profile") for p in found]) from None


def _apply_override(data: dict, item: str, source: str) -> str:
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise InputError(f"--set expects key.path=value, got {item!r}", file=source)
    if _too_deep(raw):
        raise InputError(f"--set {key}: value nested more than {MAX_NESTING} levels deep", file=source)
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    except RecursionError:
        raise InputError(f"--set {key}: value nested too deeply", file=source) from None
    parts = _key_parts(key)
    here = data
    for i, part in enumerate(parts[:-1]):
        nxt = here.get(part)
        if nxt is None:
            nxt = here[part] = {}
        if not isinstance(nxt, dict):
            raise InputError(f"--set {key}: {'.'.join(parts[:i + 1])} is not a mapping", file=source)
        here = nxt
    here[parts[-1]] = value
    return key


MAX_NESTING = 64
"""Deepest nesting of brackets or braces a scenario's YAML may have (PyYAML slows to seconds, then fails,
on thousands)."""


def _too_deep(text: str) -> bool:
    """Whether YAML flow collections (``[``, ``{``) nest deeper than `MAX_NESTING`, quoted text and comments
    aside: checked before PyYAML sees the text."""
    depth = 0
    quote = ""
    comment = False
    for ch in text:
        if comment:
            comment = ch != "\n"
        elif quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#":
            comment = True
        elif ch in "[{":
            depth += 1
            if depth > MAX_NESTING:
                return True
        elif ch in "]}":
            depth = max(0, depth - 1)
    return False


_DOTTED_KEYS = frozenset(k for k in PERCENTILE_KEYS if "." in k)
"""Setting names with a dot in them (``p99.9``), kept whole when --set splits its key path."""


def _key_parts(key: str) -> list[str]:
    """The parts of a --set key path: split at dots, except inside a name that has one (``slo.ttft_ms.p99.9``)."""
    parts = key.split(".")
    out: list[str] = []
    i = 0
    while i < len(parts):
        if i + 1 < len(parts) and f"{parts[i]}.{parts[i + 1]}" in _DOTTED_KEYS:
            out.append(f"{parts[i]}.{parts[i + 1]}")
            i += 2
        else:
            out.append(parts[i])
            i += 1
    return out


def describe_error(exc: ValidationError, root: Any, source: str, set_keys: set[str], *,
                   model: Optional[type[BaseModel]] = None) -> InputError:
    """Every validation problem of a YAML file as one InputError (see `InputError.several`), each with its
    YAML path, its line (from the node marks of `root`) or "(from --set)", and for a misspelt key or
    choice the closest allowed one. `model` is the model validated (its fields give the allowed keys)."""
    found = [_located(problem, root, source, set_keys) for problem in validation.problems(exc, model)]
    if not found:  # pydantic reports at least one error; keep an error whatever it holds
        return InputError(str(exc).splitlines()[0], file=source)
    found.sort(key=lambda e: (e.line is None, e.line or 0))  # file order, then the --set ones
    return InputError.several(found)


def _located(problem: validation.Problem, root: Any, source: str, set_keys: set[str]) -> InputError:
    """One problem placed in the file, or named as coming from --set."""
    loc = list(problem.loc)
    dotted = problem.dotted
    set_key = _set_key_of(dotted, loc, root, set_keys)
    if set_key is None:
        message, line = problem.text(), _line_of(root, loc)
    else:
        spelled = None
        if problem.is_key and problem.suggestion is not None:
            # name the whole --set key as it should read: `run.max_taks` -> `run.max_tasks`
            fixed = ".".join([*(str(p) for p in loc[:-1]), problem.suggestion])
            below = set_key == dotted or set_key.startswith(dotted + ".")
            spelled = fixed + set_key[len(dotted):] if below else fixed
        message, line = f"{problem.text(spelled)} (from --set)", None
    return InputError(message, file=source, line=line, path=dotted or "$", field=problem.field)


def _set_key_of(dotted: str, loc: list, root: Any, set_keys: set[str]) -> Optional[str]:
    """The --set key a problem at `dotted` comes from: one that set this value or a value around it, or
    one under a section only --set made (the file has none); None when the value is the file's."""
    keys = sorted(set_keys)
    for key in keys:
        if dotted == key or dotted.startswith(key + "."):
            return key
    held = _depth_in_file(root, loc) if keys else len(loc)
    if held < len(loc):
        made = ".".join(str(p) for p in loc[:held + 1])  # the first part of the path the file lacks
        for key in keys:
            if key == made or key.startswith(made + "."):
                return key
    return None


def _depth_in_file(node: Any, loc: list) -> int:
    """How many leading parts of `loc` the YAML holds nodes for."""
    for depth, part in enumerate(loc):
        if isinstance(node, yaml.MappingNode):
            node = next((value for key, value in node.value if key.value == str(part)), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
        else:
            node = None
        if node is None:
            return depth
    return len(loc)


def _line_of(node: Any, loc: list) -> Optional[int]:
    """1-based line of the YAML node at `loc` (the deepest one that exists)."""
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if key.value == str(part):
                    # a bad or unknown key is best pointed at by the key itself
                    node, line = value, key.start_mark.line + 1
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


# --- what the scenario produces ------------------------------------------------------------------


def load_workload(scenario: Scenario) -> Workload:
    """The workload the scenario replays: read or generated, transformed, cut to `run.max_tasks`."""
    base = scenario.base_dir()
    spec = scenario.workload
    where = scenario.source
    if spec.trace is not None:
        from .traces import load as load_traces

        paths = [_resolve(base, p) for p in spec.trace_paths()]
        workload = load_traces(paths, spec.format, spec.on_error, spec.assume_append_only,
                               format_option=_format_option(where))
    elif spec.synthetic is not None:
        workload = synthetic_workload(spec.synthetic)
    else:
        workload = _generate(scenario, _resolve(base, spec.model))
    if spec.transforms is not None and not spec.transforms.is_identity():
        try:
            workload = apply_transforms(workload, spec.transforms, scenario.run.seed)
        except InputError as exc:
            exc.file = exc.file or where
            exc.path = exc.path or "workload.transforms"
            raise
    if spec.stagger is not None:
        ordered = sorted(workload.tasks, key=lambda t: t.arrival)
        workload = Workload(tuple(dataclasses.replace(t, arrival=i * spec.stagger) for i, t in enumerate(ordered)),
                            workload.provenance)
    if scenario.run.max_tasks is not None:
        tasks = sorted(workload.tasks, key=lambda t: t.arrival)[: scenario.run.max_tasks]
        workload = Workload(tuple(tasks), workload.provenance)
    if not workload.tasks:
        raise InputError("the workload has no tasks", file=where, path="workload")
    return workload


def _format_option(source: Optional[str]) -> str:
    """How the user of a scenario from `source` forces a trace format: its file's `workload.format`, or
    for a scenario made without a file (from command-line flags) the --format flag."""
    if source and Path(source).is_file():
        return f"workload.format in {source}"
    return "--format"


def _resolve(base: Path, path: str) -> Path:
    p = Path(os.path.expanduser(path))
    return p if p.is_absolute() else base / p


def _generate(scenario: Scenario, model_path: Path) -> Workload:
    """Generate tasks from a workload model file (simulator.model)."""
    try:
        from .model.generate import generate
        from .model.schema import load_model
    except ImportError:
        raise InputError("workload models are not available in this build", file=scenario.source,
                         path="workload.model") from None
    options = scenario.workload.generate or GenerateOptions()
    seed = options.seed if options.seed is not None else scenario.run.seed
    tasks, duration = options.tasks, options.duration
    if tasks is None and duration is None:
        tasks, duration = (None, scenario.run.duration) if scenario.run.duration else (scenario.run.max_tasks, None)
    if tasks is None and duration is None:
        raise InputError("say how much to generate: workload.generate.tasks or .duration (or run.duration)",
                         file=scenario.source, path="workload.generate")
    return generate(load_model(model_path), tasks=tasks, duration=duration, seed=seed, rate=options.rate,
                    burstiness=options.burstiness, source=str(model_path))


def synthetic_workload(spec: SyntheticSpec) -> Workload:
    """The fixed-shape workload of `spec`: one task per stream, all arriving at 0, the calls spread
    evenly over them back to back; calls carry no hash ids, so every prompt is unique."""
    from .workload import Call, Provenance, Task  # noqa: PLC0415 - only synthetic workloads need them

    call = Call(input_tokens=spec.input_tokens, output_tokens=spec.output_tokens)
    total = spec.calls if spec.calls is not None else 8 * spec.concurrency
    streams = min(spec.concurrency, total)
    per, extra = divmod(total, streams)
    tasks = tuple(Task(id=f"stream-{i}", calls=(call,) * (per + (1 if i < extra else 0))) for i in range(streams))
    note = Provenance(source="synthetic", format="synthetic", options=spec.model_dump())
    return Workload(tasks, (note,))
