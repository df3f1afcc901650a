"""Prefix block ids of a prompt's token ids, as `agentload record` writes them (hash scheme
``agentload-prefix-v1``).

A prompt of token ids t_0 .. t_{n-1} is cut into full blocks of `block_size` tokens (the trailing
partial block gets no id, as a prefix cache caches only full blocks). Block k's content hash is
``c_k = mix(sum_i t_{k*B+i} * K_i + k * GOLDEN)`` over 64-bit wrapping arithmetic, with fixed odd
constants K_i drawn once from a seeded generator, and its id is ``mix(c_0 + ... + c_k) mod 2**63``: the
id of block k depends on every token up to the block's end and on nothing after, so two prompts share
their first n ids exactly when their first n blocks are equal token for token (but for 64-bit hash
collisions), and "prompt B extends prompt A" reads ``B[len(A) - 1] == A[-1]``. `mix` is the SplitMix64
finaliser. Vectorised with numpy: a 100k-token prompt takes well under a millisecond.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

SCHEME = "agentload-prefix-v1"
"""The name a recording's header gives this scheme."""
DEFAULT_BLOCK_SIZE = 16
"""vLLM's default KV block size."""

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MASK63 = np.uint64((1 << 63) - 1)
_KEYS: dict[int, np.ndarray] = {}


def _weights(block_size: int) -> np.ndarray:
    keys = _KEYS.get(block_size)
    if keys is None:
        rng = np.random.default_rng(0x5EED0000 + block_size)
        keys = rng.integers(0, 1 << 63, size=block_size, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
        _KEYS[block_size] = keys
    return keys


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser, element-wise (wrapping)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def block_ids(tokens: Sequence[int] | np.ndarray, block_size: int = DEFAULT_BLOCK_SIZE) -> list[int]:
    """The prefix ids of the full blocks of `tokens` (see the module docstring), as Python ints in [0, 2**63)."""
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    arr = np.asarray(tokens, dtype=np.int64)
    blocks = len(arr) // block_size
    if blocks == 0:
        return []
    with np.errstate(over="ignore"):
        grid = arr[: blocks * block_size].astype(np.uint64).reshape(blocks, block_size)
        content = _mix((grid * _weights(block_size)).sum(axis=1, dtype=np.uint64)
                       + np.arange(blocks, dtype=np.uint64) * _GOLDEN)
        ids = _mix(np.cumsum(content, dtype=np.uint64)) & _MASK63
    return ids.tolist()
