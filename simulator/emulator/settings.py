"""The emulator's settings: a typed, validated pydantic model, and a scenario's `emulator` section made of
it. Cheap to import, and nothing here imports `simulator.live` or `simulator.sim`, so that the scenario
package can use it without an import cycle."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Union

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, model_serializer, model_validator
from pydantic import PrivateAttr, SerializerFunctionWrapHandler, ValidatorFunctionWrapHandler

from .. import validation
from ..errors import InputError


DEFAULT_PREFILL_PER_TOKEN = 0.00005
"""Default batched timing: 50 µs a prompt token, prefill at 20,000 tokens/s (`DEFAULT_SERVER_CLASS`)."""
DEFAULT_DECODE_BASE = 0.008
"""Default batched timing: 8 ms of every step (reading the weights of an 8B model once a step)."""
DEFAULT_DECODE_PER_SEQ = 0.0001
"""Default batched timing: 0.1 ms a running sequence (its KV cache and sampling) in every step."""
DEFAULT_SERVER_CLASS = "~ one H100 serving an 8B model on vLLM"
"""The server the default batched timing stands for. Its steps: vLLM's CI latency benchmark runs
Llama-3.1-8B on one H200 in batches of 8 (32 tokens in, 128 out) in 833 ms, 6.5 ms a step; decoding is
bound by memory bandwidth, and an H100 SXM has 3.35 TB/s to the H200's 4.8, so ~9 ms a step at a batch
of 8 (the default: 8 + 8 x 0.1 = 8.8 ms). Its prefill: an 8B model computes ~16 GFLOP a token, ~25,000
tokens/s at 40% of an H100's 989 dense BF16 TFLOPS before attention; agent prompts of tens of thousands
of tokens add attention, hence 20,000 tokens/s. No context-length term and no KV-cache limit: a
calibrated profile (`profile`) models those."""

Seconds = Union[int, float]
"""A number of seconds, kept as given: a whole number stays one, so a run's record reads as the file did."""

_MAPPING = TypeAdapter(dict[str, Any])

REPLICA_HEADER = "x-agentload-replica"
"""Response header in which a fleet replica names itself (the emulator does, with its `replica` setting;
`simulator.scenario.fleet` takes the name from here, so that the emulator needs nothing of the fleet)."""


class EmulatorSettings(BaseModel):
    """How the emulator behaves. With `profile` set, the server twin of that profile decides token
    times; otherwise with `ttft` or `itl` set timing is fixed, and with neither it is batched, by
    default with the coefficients of `DEFAULT_SERVER_CLASS` (zero timing, `ttft: 0, itl: 0`, is a
    zero-latency server, and is said so). Every value is checked by `check` (a bad one is a
    `ValueError` naming the setting), however the settings are made."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = "agentload-emulator"
    max_model_len: int = 131072
    vocab_size: int = 32000
    ttft: Optional[Seconds] = None
    itl: Optional[Seconds] = None
    prefill_per_token: Seconds = DEFAULT_PREFILL_PER_TOKEN
    """Seconds of a step per uncached prompt token admitted in it (batched timing)."""
    decode_per_seq: Seconds = DEFAULT_DECODE_PER_SEQ
    """Seconds of a step per running sequence (batched timing)."""
    decode_base: Seconds = DEFAULT_DECODE_BASE
    """Fixed seconds of every step (batched timing)."""
    max_num_seqs: int = 1024
    block_size: int = 16
    cache_blocks: int = 1 << 20
    """Capacity of the prefix cache, in blocks (least recently used go first)."""
    faults: tuple[tuple[str, float], ...] = ()
    """(kind, rate) pairs (given as ``"KIND:RATE"`` strings too, read into pairs)."""
    seed: int = 0
    retry_after: Optional[Seconds] = None
    """Seconds an injected HTTP 429 or 503 fault asks the client to wait (a ``Retry-After`` header);
    None: no header."""
    api_key: Optional[str] = None
    """When set, requests must carry ``Authorization: Bearer <api_key>``."""
    stall_seconds: Seconds = 3600.0
    """How long a stalled stream hangs (until the client goes away, at most this)."""
    profile: Optional[str] = None
    """A server profile (preset name or YAML path): the server twin of `simulator.sim` decides token
    times in real time (`simulator.emulator.twin_timing`), and its `max_model_len` and prefix cache
    apply; the batching and fixed-timing settings are then unused."""
    replica: Optional[str] = None
    """A fleet replica's name: every response then says it in the header `REPLICA_HEADER`, so the client
    can record which replica served each call."""

    @model_validator(mode="wrap")
    @classmethod
    def _checked(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        if isinstance(value, cls):
            return handler(value)
        values = _MAPPING.validate_python(value)  # not a mapping, or a key not a string: pydantic's own words
        cls._check_names(values)
        return handler(check(values))

    @classmethod
    def _check_names(cls, values: dict[str, Any]) -> None:
        """Raise for a name that is no setting."""
        unknown = set(values) - set(cls.model_fields)
        if unknown:
            raise validation.unknown_keys(unknown, cls.model_fields, "emulator setting")


class EmulatorSection(EmulatorSettings):
    """A scenario's `emulator` section: the emulator's settings and where it listens (`host`, `port`).
    It is dumped as it was given (its settings records in run.json and saved scenarios): only the
    settings set, in the order they were written."""

    host: str = "127.0.0.1"
    port: int = 0

    _order: tuple[str, ...] = PrivateAttr(())

    @classmethod
    def _check_names(cls, values: dict[str, Any]) -> None:
        """Raise for a name that is no setting, and for a `profile` that names none (a file's ``profile:``
        left empty)."""
        super()._check_names(values)
        if "profile" in values and not isinstance(values["profile"], str):
            raise ValueError("emulator.profile must be a preset name or a YAML path")

    @model_validator(mode="wrap")
    @classmethod
    def _remember_order(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        section = handler(value)
        if isinstance(value, Mapping):
            section._order = tuple(value)
        return section

    @model_serializer(mode="wrap")
    def _as_given(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        given = [name for name in self._order if name in self.model_fields_set]
        given += [name for name in type(self).model_fields if name in self.model_fields_set and name not in given]
        return {name: data[name] for name in given if name in data}


def section_of(values: Mapping[str, Any], where: str) -> EmulatorSection:
    """`values` (an `emulator` section not read from a scenario file, e.g. a study's config) as the
    typed section; bad settings are an `InputError` naming each, `where` saying whose they are."""
    try:
        return EmulatorSection.model_validate(values)
    except ValidationError as exc:
        raise InputError.several([
            InputError(f"{where}: {problem.text()}", path=".".join(["emulator", *map(str, problem.loc)]),
                       field=problem.field) for problem in validation.problems(exc, EmulatorSection)]) from None


def from_values(values: Mapping[str, Any]) -> EmulatorSettings:
    """The settings of an `emulator` section given as a mapping (`host` and `port`, where it listens,
    left out), checked."""
    return EmulatorSettings.model_validate({name: value for name, value in values.items() if name not in ("host", "port")})


def timing_kind(settings: EmulatorSettings) -> str:
    """Which timing model the settings ask for: ``profile``, ``fixed`` or ``batched``."""
    if settings.profile is not None:
        return "profile"
    if settings.ttft is not None or settings.itl is not None:
        return "fixed"
    return "batched"


def is_default_timing(settings: EmulatorSettings) -> bool:
    """True when the settings run batched timing with the default coefficients (`DEFAULT_SERVER_CLASS`)."""
    return timing_kind(settings) == "batched" and (
        settings.prefill_per_token, settings.decode_per_seq, settings.decode_base) == (
        DEFAULT_PREFILL_PER_TOKEN, DEFAULT_DECODE_PER_SEQ, DEFAULT_DECODE_BASE)


def is_zero_latency(settings: EmulatorSettings) -> bool:
    """True when the emulator answers at once: fixed timing of zero, or batched timing with every
    coefficient zero. Its figures then measure agentload and the machine, not a server."""
    kind = timing_kind(settings)
    if kind == "fixed":
        return not settings.ttft and not settings.itl
    if kind == "batched":
        return not (settings.prefill_per_token or settings.decode_per_seq or settings.decode_base)
    return False


def _ms(seconds: float) -> str:
    """Milliseconds as plain digits (never scientific notation), up to the microsecond."""
    return f"{1000 * seconds:.3f}".rstrip("0").rstrip(".")


def describe_timing(settings: EmulatorSettings) -> str:
    """One line on what timing the emulator runs, for the run's banner, run.json and reports."""
    kind = timing_kind(settings)
    if kind == "profile":
        return f"profile {settings.profile} (its server twin in real time)"
    if kind == "fixed":
        text = f"fixed TTFT {_ms(settings.ttft or 0.0)} ms, ITL {_ms(settings.itl or 0.0)} ms"
        return text + ": a zero-latency server" if is_zero_latency(settings) else text
    if is_zero_latency(settings):
        return "batched timing with every coefficient 0: a zero-latency server"
    prefill = (f"prefill {1 / settings.prefill_per_token:,.0f} tokens/s" if settings.prefill_per_token
               else "prefill free")
    steps = (f"steps of {_ms(settings.decode_base)} ms + {_ms(settings.decode_per_seq)} ms a running sequence, "
             f"{prefill}")
    if is_default_timing(settings):
        return f"default timing, {DEFAULT_SERVER_CLASS}: {steps}"
    return f"batched timing: {steps}"


def timing_record(settings: EmulatorSettings) -> dict[str, Any]:
    """What timing the emulator ran, as run.json keeps it (`describe_timing`'s line under ``text``)."""
    kind = timing_kind(settings)
    record: dict[str, Any] = {"kind": kind, "text": describe_timing(settings)}
    if kind == "profile":
        record["profile"] = settings.profile
    elif kind == "fixed":
        record.update(ttft=settings.ttft or 0.0, itl=settings.itl or 0.0)
    else:
        record.update(prefill_per_token=settings.prefill_per_token, decode_per_seq=settings.decode_per_seq,
                      decode_base=settings.decode_base, default=is_default_timing(settings))
    record["zero_latency"] = is_zero_latency(settings)
    return record


_POSITIVE_INTS = ("max_model_len", "vocab_size", "max_num_seqs", "block_size", "cache_blocks")
_SECONDS = ("ttft", "itl", "prefill_per_token", "decode_per_seq", "decode_base", "stall_seconds", "retry_after")
_TEXTS = ("model", "api_key", "profile", "replica")
_MAX_SECONDS = 1e6  # no step, token or stall of an emulator lasts longer (11 days)


def check(values: dict[str, Any]) -> dict[str, Any]:
    """Check the values of emulator settings given by name (a scenario's `emulator` section, which may also
    name `host` and `port`): each of the right type and range, so a bad value is an error when the
    scenario loads, not a failure of every request. Returns the values, faults as (kind, rate) pairs;
    raises ValueError naming the setting."""
    out = dict(values)
    for name, value in values.items():
        if value is None and name in ("ttft", "itl", "retry_after", "api_key", "profile", "replica"):
            continue
        if name in _POSITIVE_INTS and not (type(value) is int and 0 < value <= 1 << 40):
            raise ValueError(f"emulator.{name} must be a positive whole number, not {value!r:.40}")
        if name in _SECONDS and not (type(value) in (int, float) and 0 <= value <= _MAX_SECONDS):
            raise ValueError(f"emulator.{name} must be a number of seconds from 0 to {_MAX_SECONDS:g}, not {value!r:.40}")
        if name in _TEXTS and not (isinstance(value, str) and value):
            raise ValueError(f"emulator.{name} must be a non-empty string")
        if name in ("seed", "port") and type(value) is not int:
            raise ValueError(f"emulator.{name} must be a whole number, not {value!r:.40}")
        if name == "port" and not 0 <= value <= 65535:
            raise ValueError(f"emulator.port must be from 0 to 65535, not {value}")
        if name == "host" and not (isinstance(value, str) and value):
            raise ValueError("emulator.host must be a host name or address")
    if values.get("vocab_size", 32) < 32:
        raise ValueError("emulator.vocab_size must be at least 32")
    if "faults" in values:
        out["faults"] = _faults(values["faults"])
    return out


def _faults(value: Any) -> tuple[tuple[str, float], ...]:
    from ..errors import InputError  # noqa: PLC0415
    from .faults import check_fault_kind, parse_fault  # noqa: PLC0415 - only scenarios that inject faults

    if not isinstance(value, (list, tuple)):
        raise ValueError("emulator.faults must be a list of KIND:RATE strings or [kind, rate] pairs")
    pairs = []
    for item in value:
        try:
            if isinstance(item, str):
                pairs.append(parse_fault(item, "emulator.faults"))
                continue
            if not (isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], str)):
                raise ValueError(f"emulator.faults: {item!r:.40} is not KIND:RATE nor a [kind, rate] pair")
            check_fault_kind(item[0], "emulator.faults")
        except InputError as exc:
            raise ValueError(f"emulator.faults: {exc.message}") from None
        rate = item[1]
        if type(rate) not in (int, float) or not 0 <= rate <= 1:
            raise ValueError(f"emulator.faults: the rate of {item[0]} must be a number from 0 to 1, not {rate!r:.40}")
        pairs.append((item[0], float(rate)))
    if sum(rate for _, rate in pairs) > 1:
        raise ValueError("emulator.faults: the rates add up to more than 1")
    return tuple(pairs)
