"""The emulator's settings: plain data, cheap to import (scenario loading checks names against it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


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
    api_key: Optional[str] = None
    """When set, requests must carry ``Authorization: Bearer <api_key>``."""
    stall_seconds: float = 3600.0
    """How long a stalled stream hangs (until the client goes away, at most this)."""
    profile: Optional[str] = None
    """A server profile (preset name or YAML path): the server twin of `simulator.sim` decides token
    times in real time (`simulator.emulator.twin_timing`), and its `max_model_len` and prefix cache
    apply; the batching and fixed-timing settings are then unused."""
