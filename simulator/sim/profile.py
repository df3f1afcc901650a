"""Server profiles: the twin's settings and step-time coefficients, read from YAML.

A profile file is a mapping with the sections below (every field optional except where noted, unknown
fields rejected). A file may name a ``base`` profile (a preset name or a path relative to the file) and
override only what differs: sections are merged key by key, so a tuning step ("turn on async
scheduling") is a few lines on top of the profile it changes. Errors name the file and the YAML path
of the bad field.

.. code-block:: yaml

    name: my-server
    base: gb300-nemotron-super-default   # optional
    calibrated: true
    calibration: {rms_relative_error: 0.08, points: 41, terms: {fixed: 0.04, ...}}
    scheduler: {max_num_seqs: 256, max_num_batched_tokens: 8192, chunked_prefill: true,
                max_model_len: 32768, async_scheduling: false}
    kv_cache: {block_size: 16, num_blocks: 20000, enable_prefix_caching: true}
    # a hybrid Mamba + attention model: kv_cache.hybrid (see HybridSettings and docs/server-twin.md)
    spec_decode: {num_tokens: 0, acceptance: 0.0}
    step_time: {fixed: 0.008, per_token: 5.0e-6, per_decode_seq: 1.0e-4, ...}
    power: {gpus: 1, idle_w: 200, busy_w: 1400, per_token_j: 0.0}   # optional: energy per task

Presets ship as YAML in ``simulator/sim/presets/``; `load_profile` takes a preset name or a path.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .. import validation
from ..errors import InputError
from .hybrid import HybridGeometry
from .hybrid import geometry as hybrid_geometry

PRESET_PACKAGE = "simulator.sim.presets"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SchedulerSettings(_Section):
    """How the engine batches: vLLM's scheduler options."""

    max_num_seqs: int = Field(256, ge=1)
    """Most requests in the running set."""
    max_num_batched_tokens: int = Field(8192, ge=1)
    """Token budget of one step, shared by decodes and prefill chunks."""
    chunked_prefill: bool = True
    """Split a prompt over several steps when it exceeds the remaining budget."""
    max_model_len: int = Field(32768, ge=1)
    """Longest prompt plus output accepted; longer calls fail with HTTP 400."""
    async_scheduling: bool = False
    """Overlap scheduling of the next step with the current one (its overhead hides behind the step)."""


class HybridSettings(_Section):
    """A hybrid Mamba + attention model (Nemotron-H, Jamba, ...): the shape vLLM derives its block pool
    from (`simulator.sim.hybrid`) and its Mamba prefix-caching options. With it, `kv_cache.block_size`
    is the requested ``--block-size``: the twin raises it as vLLM does, and `bytes_per_token` is the
    attention KV of one token over all attention layers."""

    attention_layers: int = Field(ge=1)
    """Attention layers (a speculative drafter's attention layers included: they share the group)."""
    mamba_layers: int = Field(ge=1)
    mamba_state_bytes: float = Field(gt=0)
    """One Mamba layer's state for one sequence, bytes (convolution plus SSM state: vLLM's MambaSpec
    page before padding; the convolution state grows by one row per draft token)."""
    kernel_block_size: int = Field(16, ge=1)
    """The attention kernel's smallest block (tokens): the aligned block size is a multiple of it."""
    retention_interval: Optional[int] = Field(0, ge=0)
    """vLLM's ``--prefix-cache-retention-interval``: 0 (its default) keeps a Mamba state only at each
    prompt's replay boundary and at shared-prefix junctions, N > 0 also every N tokens (a multiple of
    the aligned block size), null at every block-aligned chunk end."""
    prefill_checkpoint: bool = True
    """The Mamba kernel exports the prompt's checkpoint state from inside a prefill chunk (Mamba2 in
    vLLM 0.32.0), so the last chunk need not stop at it."""
    speculative_state: bool = True
    """A running sequence keeps a Mamba state per draft token (vLLM's default; false with
    ``--use-replayssm``)."""
    eagle_block_drop: Optional[bool] = None
    """Prefix hits give back one block for the MTP/EAGLE drafter (vLLM's EAGLE block drop); default:
    on with speculative decoding."""


class KVCacheSettings(_Section):
    """The paged KV cache: its block size and capacity, and prefix caching."""

    block_size: int = Field(16, ge=1)
    num_blocks: Optional[int] = Field(None, ge=1)
    """Capacity in blocks; or give `memory_bytes` and `bytes_per_token`."""
    memory_bytes: Optional[float] = Field(None, gt=0)
    bytes_per_token: Optional[float] = Field(None, gt=0)
    enable_prefix_caching: bool = True
    hybrid: Optional[HybridSettings] = None
    """A hybrid Mamba + attention model's pool (None: attention only)."""

    @model_validator(mode="after")
    def _capacity(self) -> KVCacheSettings:
        if self.num_blocks is None and (self.memory_bytes is None or self.bytes_per_token is None):
            raise ValueError("give num_blocks, or both memory_bytes and bytes_per_token")
        if self.hybrid is not None:
            if self.bytes_per_token is None:
                raise ValueError("a hybrid model needs bytes_per_token (attention KV per token, all attention layers)")
            try:
                geometry = self.geometry
            except ValueError as exc:
                raise ValueError(str(exc)) from None
            interval = self.hybrid.retention_interval
            if interval and interval % geometry.block_size:  # type: ignore[union-attr]
                raise ValueError(f"retention_interval {interval} must be a multiple of the aligned block size "
                                 f"{geometry.block_size}")  # type: ignore[union-attr]
        return self

    @property
    def geometry(self) -> Optional[HybridGeometry]:
        """A hybrid model's block pool layout (None without `hybrid`)."""
        h = self.hybrid
        if h is None:
            return None
        return hybrid_geometry(h.attention_layers, h.mamba_layers, self.bytes_per_token,  # type: ignore[arg-type]
                               h.mamba_state_bytes, h.kernel_block_size, self.block_size)

    @property
    def kv_block_size(self) -> int:
        """Tokens per KV block as the server runs it (`block_size`, raised for a hybrid model)."""
        geometry = self.geometry
        return self.block_size if geometry is None else geometry.block_size

    @property
    def capacity_blocks(self) -> int:
        """Number of KV blocks, given directly or derived from memory and bytes per token (a hybrid
        model's blocks hold a page of each layer of a group, Mamba states included)."""
        if self.num_blocks is not None:
            return self.num_blocks
        geometry = self.geometry
        if geometry is not None:
            return int(self.memory_bytes // geometry.block_bytes)  # type: ignore[operator]
        return int(self.memory_bytes // (self.bytes_per_token * self.block_size))  # type: ignore[operator]


class SpecDecodeSettings(_Section):
    """Speculative decoding (draft model or MTP heads): k draft tokens per step, each accepted with a
    probability `acceptance` given the previous one was."""

    num_tokens: int = Field(0, ge=0)
    acceptance: float = Field(0.0, ge=0.0, le=1.0)

    @property
    def expected_tokens(self) -> float:
        """Expected tokens emitted per decode step: (1 - a^(k+1)) / (1 - a)."""
        k, a = self.num_tokens, self.acceptance
        if a >= 1.0:
            return float(k + 1)
        return (1.0 - a ** (k + 1)) / (1.0 - a)


class StepTimeCoefficients(_Section):
    """One step's duration in seconds (see `simulator.sim.step_time`)."""

    fixed: float = Field(0.0, ge=0)
    """Per step: weight reads, kernel launches."""
    per_token: float = Field(0.0, ge=0)
    """Per scheduled token (prefill, decode and draft tokens alike): the model's compute."""
    per_prefill_token: float = Field(0.0, ge=0)
    """Extra per prefill token on top of `per_token`."""
    per_decode_seq: float = Field(0.0, ge=0)
    """Per sequence decoding: per-sequence state (SSM state read/write, sampling)."""
    per_context_token: float = Field(0.0, ge=0)
    """Per token of attended context, summed over the batch: KV reads of attention."""
    per_prefill_attention: float = Field(0.0, ge=0)
    """Per query-key pair of a prefill chunk (each prompt token attends to the context up to itself):
    the attention of prefill, which grows with the square of the prompt where decode's grows linearly."""
    per_mixed_context_token: float = Field(0.0, ge=0)
    """Extra per token of a decoding sequence's context in a step that also computes a prefill chunk, on
    top of `per_context_token`: attention kernels built for mixed batches (one launch over prefill and
    decode queries alike) read a decode's KV less efficiently than a pure-decode step's kernel does."""
    per_spec_token: float = Field(0.0, ge=0)
    """Extra per draft token: drafting it and keeping its verification state."""
    per_draft_pass: float = Field(0.0, ge=0)
    """Per drafting pass (k passes per step with speculative decoding)."""
    schedule_fixed: float = Field(0.0, ge=0)
    """CPU scheduling and input preparation per step."""
    schedule_per_seq: float = Field(0.0, ge=0)
    """CPU scheduling, input preparation and output processing per scheduled sequence."""
    request_overhead: float = Field(0.0, ge=0)
    """Not a step term: seconds a request spends outside the engine (HTTP handling, tokenisation,
    detokenisation and streaming in the API server), added before it reaches the waiting queue. It
    delays the request's first token and its end by this much without occupying the engine."""
    frontend_per_request: float = Field(0.0, ge=0)
    """Not a step term: seconds of the API server's own work per request (HTTP parsing, validation,
    handing the request to the engine), done one request at a time: a burst of requests queues for it,
    so the engine sees them one after another, not all at once. A single request waits it out
    beside `request_overhead`."""
    frontend_per_prompt_token: float = Field(0.0, ge=0)
    """Not a step term: seconds of that one-at-a-time work per prompt token (decoding and validating
    the prompt, hashing its prefix blocks), which every prompt token costs whether the prefix cache
    then holds it or not: a cache hit skips the prefill, not the request's handling."""
    frontend_per_output_token: float = Field(0.0, ge=0)
    """Not a step term: seconds of the API server's work per token it streams back (detokenising the
    token, building and serialising the response chunk, writing it to the connection). vLLM's API
    server is one asyncio loop that handles every engine step's outputs and new requests alike, so it
    is the same one-at-a-time worker as `frontend_per_request`: a step's tokens occupy it for their
    count times this, a token reaches its client when the work queued before it and its step's tokens
    are done, and a request arriving meanwhile waits its turn. Under many streams this delays new
    requests' first tokens; where the worker saturates it also slows every stream's delivery."""
    frontend_contention: float = Field(0.0, ge=0)
    """A factor, not a term: engine time lost per second of the API server's work on new requests
    (`frontend_per_request`, `frontend_per_prompt_token`) done while the engine steps. Where the engine,
    the API server and a load client beside them have more busy threads than the host has cores, the
    operating system takes the engine's core in turns, and a step lasts its own work plus the time it
    waited. A step is stretched by this factor times the intake work done inside it; work that begins
    after the step was planned stretches the next one; intake while the engine is idle costs nothing.
    Measured on the CPU test server, one engine thread on 2 cores with the load client
    (`benchmarks/engine_steps.py`): during bursts of arrivals the engine thread was off its core 1.6 ms
    of a typical prefill step, its own CPU time what the step model says. A setting, not fitted: tried
    as a fitted term, the sweep gave 0.27 ±11% on that server, but on the twin's own exact measurements
    the search stalled far from a known value (0.78 for 1 without per-token work, 0.1 for 0), pulling the
    per-step terms with it. A GPU server's engine thread has a core to itself: 0 there."""
    batch_join: float = Field(0.0, ge=0)
    """Seconds added to the step after one in which requests completed their prompts and go on to
    decode: the engine rebuilding its batch state around requests that change from prefill to decode.
    Measured on the CPU test server (`benchmarks/engine_steps.py`, azure-bursty): a decode step holding
    a request's first decode took 1.0 ms more than one of the same batch without (0.7 to 1.0 ms of it
    the engine thread's own CPU time), 1.2 ms with two such requests. A setting, not fitted: in a
    sweep's calls it is one more millisecond per call beside the API server's; `benchmarks/engine_steps.py`
    measures it from the engine's steps. A GPU build pays it too, as CPU time in the scheduler and
    model runner, but hides most of it behind the GPU with asynchronous scheduling."""
    batch_leave: float = Field(0.0, ge=0)
    """Seconds added to the step after one in which requests ended: the engine removing them from its
    batch state. Measured as above: 0.4 ms on a decode step after one or two requests left. A setting,
    not fitted, as `batch_join`."""
    idle_wake: float = Field(0.0, ge=0)
    """Not a step term: seconds added to the first step after the engine sat idle for longer than
    `idle_after` (its threads asleep, their caches gone cold; the slower steps after it are
    `wake_slowdown`). Agent traffic meets an idle server after every tool call at low load;
    back-to-back benchmarks never do."""
    idle_after: float = Field(0.05, ge=0)
    """Idle time (s) beyond which the next step pays `idle_wake` and the steps after it `wake_slowdown`;
    a setting, not fitted."""
    wake_slowdown: float = Field(0.0, ge=0)
    """A factor, not a term: the fraction by which every step that starts within `wake_period` of the
    engine waking from an idle longer than `idle_after` is slower. `idle_wake` is the first step's
    wake-up; this is the hardware coming back to speed (a CPU's clocks and caches, a GPU's clocks).
    Measured on the CPU test server (`benchmarks/wake_probe.py`): a lone request's first 23 decode
    steps took 6% longer after 0.3 s of quiet than back to back, its first 95 steps 9% longer.
    Agent traffic at low load wakes the server after most tool calls; back-to-back requests never do."""
    wake_period: float = Field(0.15, ge=0)
    """Seconds after a wake during which steps pay `wake_slowdown`; a setting, not fitted."""
    per_new_shape: float = Field(0.0, ge=0)
    """Seconds added to a step whose count of scheduled tokens is not among the last `shape_cache`
    distinct counts: building the kernels for a new shape. vLLM's CPU build runs each linear layer
    through a oneDNN matmul primitive made for the exact row count (the step's tokens): it keeps the
    last 32 per layer (vLLM 0.32.0: ``create_onednn_mm(weight, 32)`` in
    model_executor/layers/utils.py, an LRU keyed on the row count in csrc/cpu/dnnl_helper.cpp), and
    oneDNN's own primitive cache (1,024 primitives unless ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` says
    otherwise) gives one back cheaply after that, so a size costs anew once 1,024 / (matmuls per step)
    other sizes ran since (128 for a model of 8 matmul layers). Decode steps repeat a few sizes; steps with a prefill chunk
    rarely repeat one. A GPU build captures graphs for fixed sizes and pays no such cost: 0 there."""
    shape_cache: int = Field(32, ge=1)
    """Distinct step sizes whose kernels the engine keeps (`per_new_shape`); a setting, not fitted.
    On the CPU test server a step of a size last run 32 to 127 sizes ago cost what one of a recent
    size does, one never run 1.9 ms more CPU time (`benchmarks/engine_steps.py`)."""


class PowerSettings(_Section):
    """What the server's GPUs draw, for the energy of a run on the twin (`simulator.sim.power`): the
    engine is either stepping or idle, and the power follows it. Over a run of wall time T in which the
    engine stepped for B seconds, computing N tokens in S steps::

        joules = gpus x (idle_w x T + (busy_w - idle_w) x B) + per_token_j x N + per_step_j x S

    The watts are each GPU's board power as NVML reports it (the CPU, host memory, network and cooling
    are outside it), so a twin's joules compare with a live run's measured ones. `agentload calibrate
    --power-from` fits them to a live run's NVML samples (docs/server-twin.md)."""

    gpus: int = Field(1, ge=1)
    """GPUs the server runs on (tensor or pipeline parallel): `idle_w` and `busy_w` are each one's."""
    idle_w: float = Field(ge=0)
    """Watts of one GPU while the engine is idle: the model loaded, no step running."""
    busy_w: float = Field(ge=0)
    """Watts of one GPU while the engine steps without pause (full engine load), before `per_token_j`."""
    per_token_j: float = Field(0.0, ge=0)
    """Joules of the whole server per token computed (prompt tokens prefilled, the prefix cache's hits
    left out, and output tokens), on top of `busy_w`: a step of a large batch draws more than a step of
    a small one."""
    per_step_j: float = Field(0.0, ge=0)
    """Joules of the whole server per engine step, on top of `busy_w`."""
    source: str = ""
    """Where the figures come from (a datasheet, a calibration)."""

    @model_validator(mode="after")
    def _busy_above_idle(self) -> PowerSettings:
        if self.busy_w < self.idle_w:
            raise ValueError(f"busy_w {self.busy_w:g} is below idle_w {self.idle_w:g}")
        return self


STEP_SETTINGS = frozenset({"idle_after", "wake_period", "shape_cache", "batch_join", "batch_leave",
                           "frontend_contention"})
"""`StepTimeCoefficients` fields that are settings, not coefficients: calibration keeps them as the
profile has them, and they are no measurement a prediction could lack."""


_Count = Annotated[int, Field(ge=1)]
_Share = Annotated[float, Field(ge=0.0, le=1.0)]

BURST_WINDOW = 0.010
"""Seconds: calls sent within this long of the first call of a run of sends arrive together, as one
burst (`CalibratedRegion.burst_calls`); the next call sent after it begins the next burst."""


class CalibratedRegion(_Section):
    """The call shapes a calibration measured: for each dimension the closed range [low, high] that the
    sweep's measured calls covered (`simulator.calibration.region` computes it from the points measured;
    `simulator.sim.coverage` holds a simulation's calls against it). Only the calls timed count: a
    prefill or decode point's burst, a loaded point's calls sent under its streams (whose own prompts
    and outputs are the load, not a measurement). Outside the region the twin extrapolates its fitted
    terms."""

    prompt_tokens: tuple[_Count, _Count]
    """Prompt tokens of a call (a point's nominal length: a live sweep moves an uncached prompt by up to
    16 tokens either way)."""
    cached_share: tuple[_Share, _Share]
    """Share of a call's prompt served from the prefix cache: prefix-cache hit tokens over prompt tokens
    (a cached point's prompt hits the cache up to the block that holds its last token, which a prefill
    computes; an uncached point's share is 0)."""
    running_calls: tuple[_Count, _Count]
    """Calls in the engine at once, seen by a call when it is sent: the calls in flight then (sent and
    not ended, itself and those sent at the same instant included), at most the server's
    `max_num_seqs` (those beyond it wait outside the batch). A burst of B calls sent at once reaches
    B; a loaded point's call, its streams and itself (each call finds the one before it done)."""
    burst_calls: tuple[_Count, _Count]
    """Calls sent together: the calls of a call's burst, a run of sends within `BURST_WINDOW` of its
    first. A sweep's burst of B calls sent at once is a burst of B; a loaded point's calls, sent alone
    83 ms and more apart (its streams went out before them), bursts of one."""
    output_tokens: tuple[_Count, _Count]
    """Output tokens of a call."""

    @field_validator("prompt_tokens", "cached_share", "running_calls", "burst_calls", "output_tokens")
    @classmethod
    def _ordered(cls, value: tuple[float, float]) -> tuple[float, float]:
        low, high = value
        if low > high:
            raise ValueError(f"low {low} is above high {high}: a range is [low, high]")
        return value


class CalibrationRecord(_Section):
    """How well a calibrated profile's step-time coefficients reproduce the measurements they were
    fitted to (`agentload calibrate` writes it)."""

    rms_relative_error: float = Field(ge=0)
    """Root mean square of predicted / measured - 1 over the sweep's points."""
    points: int = Field(ge=1)
    """Sweep points fitted."""
    worst_relative_error: float = Field(0.0, ge=0)
    """The largest |predicted / measured - 1| of a point."""
    terms: dict[str, float] = {}
    """Each fitted term's relative standard error (0: fitted at its bound of 0)."""
    covariance: dict[str, dict[str, float]] = {}
    """The covariance of the fitted terms, in the coefficients' own units (seconds squared for a time),
    of the free terms only (those fitted above 0): what the band on a prediction draws coefficients
    from (`simulator.sim.band`). Empty: not recorded (calibrated before it was), or no term free."""
    residuals: list[float] = []
    """Each sweep point's predicted / measured - 1, to 4 decimals: what a prediction missed by on the
    points it was fitted to, which the band draws the server's speed from. Empty: not recorded."""
    drift: Optional[float] = None
    """The trend of the sweep's rounds' times from the first round to the last (+0.05: the server ran 5%
    slower by the end): the host's speed moving under the measurement. None: fewer than 3 rounds, or
    measured on the twin."""
    note: str = ""
    """Anything else known about its accuracy (held-out checks)."""
    region: Optional[CalibratedRegion] = None
    """The call shapes the sweep measured (None: not recorded, calibrated before it was)."""


class ServerProfile(_Section):
    """Everything the twin needs to behave like one server configuration."""

    name: str = "unnamed"
    description: str = ""
    calibrated: bool = False
    """False until the step-time coefficients have been fitted against the real server."""
    source: str = ""
    """Where the coefficients come from (calibration run, published figures)."""
    calibration: Optional[CalibrationRecord] = None
    """The fit's error, when calibrated."""
    scheduler: SchedulerSettings = SchedulerSettings()
    kv_cache: KVCacheSettings
    spec_decode: SpecDecodeSettings = SpecDecodeSettings()
    step_time: StepTimeCoefficients = StepTimeCoefficients()
    power: Optional[PowerSettings] = Field(None, exclude_if=lambda power: power is None)
    """The GPUs' power draw (None: not stated, and a run on this profile reports no energy); left out of
    the profile's dump when not stated."""

    @model_validator(mode="after")
    def _consistent(self) -> ServerProfile:
        s, kv = self.scheduler, self.kv_cache
        blocks = kv.capacity_blocks - self.state_blocks
        if s.max_model_len > blocks * kv.kv_block_size:
            raise ValueError(
                f"max_model_len {s.max_model_len} exceeds the KV cache "
                f"({blocks} blocks of {kv.kv_block_size} tokens"
                + (f" beside one sequence's {self.state_blocks} Mamba state blocks)" if self.state_blocks else ")")
            )
        if not s.chunked_prefill and s.max_num_batched_tokens < s.max_model_len:
            raise ValueError("without chunked_prefill, max_num_batched_tokens must be >= max_model_len")
        if kv.hybrid is not None and kv.enable_prefix_caching and not s.chunked_prefill:
            raise ValueError("a hybrid model with prefix caching needs chunked_prefill (vLLM's Mamba align mode)")
        return self

    @property
    def spec_state_blocks(self) -> int:
        """Draft-token Mamba state copies per Mamba group a running sequence keeps (0 without a hybrid
        model or speculative decoding)."""
        h = self.kv_cache.hybrid
        return self.spec_decode.num_tokens if h is not None and h.speculative_state else 0

    @property
    def state_blocks(self) -> int:
        """Pool blocks one running sequence's Mamba state takes (0 without a hybrid model)."""
        geometry = self.kv_cache.geometry
        return 0 if geometry is None else geometry.mamba_groups * (1 + self.spec_state_blocks)

    @property
    def eagle_block_drop(self) -> bool:
        """Whether prefix hits give back a block for an MTP/EAGLE drafter (hybrid models only)."""
        h = self.kv_cache.hybrid
        if h is None:
            return False
        return h.eagle_block_drop if h.eagle_block_drop is not None else self.spec_decode.num_tokens > 0


def preset_names() -> list[str]:
    """Names of the shipped presets."""
    return sorted(p.name[:-5] for p in resources.files(PRESET_PACKAGE).iterdir() if p.name.endswith(".yaml"))


def load_profile(source: Union[str, Path], overrides: Optional[dict[str, Any]] = None) -> ServerProfile:
    """A profile from a preset name or a YAML path, with its `base` chain merged and `overrides`
    (a mapping shaped like the file) applied last."""
    data, origin = _resolve(source, seen=())
    if overrides:
        data = merge(data, overrides)
    return _validate(data, origin)


def profile_from_dict(data: dict[str, Any], origin: str = "<profile>") -> ServerProfile:
    """A profile from an already-parsed mapping (no `base` lookup)."""
    return _validate(data, origin)


def merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """`top` over `base`, merging nested mappings key by key."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def _resolve(source: Union[str, Path], seen: tuple[str, ...], relative_to: Optional[Path] = None) -> tuple[dict, str]:
    text, origin, folder = _read(source, relative_to)
    if origin in seen:
        raise InputError(f"profile base chain loops: {' -> '.join(seen + (origin,))}", file=origin, field="base")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        raise InputError(f"not valid YAML: {exc}", file=origin, line=None if line is None else line + 1) from None
    if not isinstance(data, dict):
        raise InputError("a profile must be a YAML mapping", file=origin)
    base = data.pop("base", None)
    if base is None:
        return data, origin
    if not isinstance(base, str):
        raise InputError("must be a preset name or a path", file=origin, path="base", field="base")
    parent, _ = _resolve(base, seen + (origin,), folder)
    parent.pop("name", None)
    parent.pop("description", None)
    return merge(parent, data), origin


def _read(source: Union[str, Path], relative_to: Optional[Path]) -> tuple[str, str, Optional[Path]]:
    path = Path(source)
    candidates = [path] if path.is_absolute() or relative_to is None else [relative_to / path, path]
    for candidate in candidates:
        if candidate.suffix in (".yaml", ".yml") and candidate.is_file():
            return candidate.read_text(), str(candidate), candidate.parent
    name = str(source)
    preset = resources.files(PRESET_PACKAGE) / f"{name}.yaml"
    if preset.is_file():
        return preset.read_text(), f"preset:{name}", None
    raise InputError(f"no profile file or preset named '{name}' (presets: {', '.join(preset_names())})",
                     file=name)


def _validate(data: dict[str, Any], origin: str) -> ServerProfile:
    try:
        return ServerProfile.model_validate(data)
    except ValidationError as exc:
        # every problem at once, with the key or choice a misspelt one was likely meant as
        raise InputError.several([
            InputError(problem.text(), file=origin, path=problem.dotted or None, field=problem.field)
            for problem in validation.problems(exc, ServerProfile)
        ] or [InputError(str(exc), file=origin)]) from None
