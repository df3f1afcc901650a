"""The scenario file's schema: what to replay (`workload`), against what (`target`, or the built-in
`emulator`), how (`run`), judged by (`slo`); pydantic models with unknown keys forbidden, and the JSON
Schema made from them (docs/scenario.schema.json)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union
from urllib.parse import urlsplit

from pydantic import (BaseModel, ConfigDict, Field, PlainValidator, WithJsonSchema, field_validator,
                      model_validator)

from .. import validation
from ..emulator.settings import EmulatorSection
from .fleet import FleetSpec, SessionSpec
from ..metrics.slo import Slo
from ..transforms import TransformSpec
from ..workload import MAX_SECONDS, MAX_TOKENS
from .yaml_io import FileModel


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
            from ..traces import formats  # noqa: PLC0415 - the importers load only for a scenario that names one
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

    base_url: Optional[str] = Field(
        None, description="e.g. http://localhost:8000 (the /v1/... paths are added). Required, except with a `fleet`, "
        "whose router is the target.")
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
    session: Optional[SessionSpec] = Field(
        None, description="Send each call's session key (its top-level task's id, or with sub_agents: own its own "
        "task's) in a header and/or the OpenAI `user` field, as agents that name their sessions do (a recorder or "
        "router groups calls by it). Default: no key sent.")

    def client_fields(self) -> dict[str, Any]:
        """The HTTP client's `Target` settings this section gives (without the API key, read apart)."""
        fields = self.model_dump(exclude={"api_key_env", "metrics", "gpu_metrics", "session"})
        if self.session is not None:
            fields.update(session_header=self.session.header, session_user=self.session.user_field,
                          session_sub_agents=self.session.sub_agents)
        return fields

    # The checks below never echo the value: a URL or a header may hold a credential.
    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, value: Optional[str]) -> Optional[str]:
        if value is None:
            return value
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


class Scenario(_Strict, FileModel):
    """A replay scenario: workload + target + run settings + SLO."""

    name: Optional[str] = Field(None, description="Name used for the result folder (default: the file name).")
    description: Optional[str] = None
    workload: WorkloadSpec
    target: Optional[TargetSpec] = Field(None, description="Server under test (default: the built-in emulator).")
    emulator: Annotated[EmulatorSection, WithJsonSchema({"type": "object", "additionalProperties": True})] = Field(
        default_factory=EmulatorSection,
        description="Settings of the built-in emulator, used when `target` is absent (simulator.emulator.settings."
        "EmulatorSettings). `profile: NAME|PATH` (a server-profile preset or YAML file, relative to the scenario "
        "file) makes it run the server twin of that profile in real time, as `agentload simulate -p` does; "
        "otherwise `ttft`/`itl` (fixed timing) or `prefill_per_token`/`decode_per_seq`/`decode_base` (batching).",
        json_schema_extra={"title": "Emulator", "properties": {"profile": {
            "type": "string", "description": "Server profile (preset name or YAML path) whose twin serves the requests."}}},
    )
    fleet: Optional[FleetSpec] = Field(
        None, description="Replicas behind a router instead of one server (simulator.scenario.fleet.FleetSpec); "
        "`target` then holds only the call settings (model, api, headers, timeouts), and its base_url is the router's.")
    run: RunSpec = Field(default_factory=RunSpec)
    slo: Slo = Field(default_factory=Slo)

    @field_validator("emulator", mode="before")
    @classmethod
    def _no_emulator(cls, value: Any) -> Any:
        return {} if value is None else value  # `emulator: null` (or --set emulator=null): no settings

    @model_validator(mode="after")
    def _target_or_emulator(self) -> "Scenario":
        if self.fleet is not None:
            if self.emulator.model_fields_set:
                raise ValueError("with a `fleet`, the emulator's settings go in `fleet.emulator`")
            if self.target is not None and self.target.base_url is not None:
                raise ValueError("with a `fleet`, the target is its router: give an existing router as "
                                 "`fleet.router.url`, not `target.base_url`")
            return self
        if self.target is not None and self.emulator.model_fields_set:
            raise ValueError("`emulator` settings apply only without a `target` (the run would not start the "
                             "emulator): remove one of them (--set emulator=null drops the emulator settings)")
        return self

    def display_name(self) -> str:
        """The scenario's name: `name`, else the file's stem."""
        if self.name:
            return self.name
        return Path(self.source).stem if self.source else "scenario"


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
