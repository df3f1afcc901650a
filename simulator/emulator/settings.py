"""The emulator's settings: plain data, cheap to import (scenario loading checks names against it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class EmulatorSettings:
    """How the emulator behaves. With `profile` set, the server twin of that profile decides token
    times; otherwise with `ttft` or `itl` set timing is fixed, and with neither it is batched."""

    model: str = "agentload-emulator"
    max_model_len: int = 131072
    vocab_size: int = 32000
    ttft: Optional[float] = None
    itl: Optional[float] = None
    prefill_per_token: float = 0.0
    """Seconds of a step per uncached prompt token admitted in it (batched timing)."""
    decode_per_seq: float = 0.0
    """Seconds of a step per running sequence (batched timing)."""
    decode_base: float = 0.0
    """Fixed seconds of every step (batched timing)."""
    max_num_seqs: int = 1024
    block_size: int = 16
    cache_blocks: int = 1 << 20
    """Capacity of the prefix cache, in blocks (least recently used go first)."""
    faults: tuple[tuple[str, float] | str, ...] = ()
    """(kind, rate) pairs or ``"KIND:RATE"`` strings."""
    seed: int = 0
    retry_after: Optional[float] = None
    """Seconds an injected HTTP 429 or 503 fault asks the client to wait (a ``Retry-After`` header);
    None: no header."""
    api_key: Optional[str] = None
    """When set, requests must carry ``Authorization: Bearer <api_key>``."""
    stall_seconds: float = 3600.0
    """How long a stalled stream hangs (until the client goes away, at most this)."""
    profile: Optional[str] = None
    """A server profile (preset name or YAML path): the server twin of `simulator.sim` decides token
    times in real time (`simulator.emulator.twin_timing`), and its `max_model_len` and prefix cache
    apply; the batching and fixed-timing settings are then unused."""


_POSITIVE_INTS = ("max_model_len", "vocab_size", "max_num_seqs", "block_size", "cache_blocks")
_SECONDS = ("ttft", "itl", "prefill_per_token", "decode_per_seq", "decode_base", "stall_seconds", "retry_after")
_TEXTS = ("model", "api_key", "profile")
_MAX_SECONDS = 1e6  # no step, token or stall of an emulator lasts longer (11 days)


def check(values: dict[str, Any]) -> dict[str, Any]:
    """Check the values of emulator settings given by name (a scenario's `emulator` section, which may also
    name `host` and `port`): each of the right type and range, so a bad value is an error when the
    scenario loads, not a failure of every request. Returns the values, faults as (kind, rate) pairs;
    raises ValueError naming the setting."""
    out = dict(values)
    for name, value in values.items():
        if value is None and name in ("ttft", "itl", "retry_after", "api_key", "profile"):
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
