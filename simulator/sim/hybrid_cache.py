"""The prefix cache of a hybrid (Mamba + attention) model, as vLLM 0.32.0 keeps it.

Attention blocks are cached as in `simulator.sim.kv_cache` (the block size is the aligned one of
`simulator.sim.hybrid`). A Mamba layer keeps no per-token state, only the state after the tokens so
far, so a prefix hit needs a *snapshot*: the Mamba state after exactly those tokens, kept in a block
of each Mamba group. vLLM (``MambaManager`` in ``vllm/v1/core/single_type_kv_cache_manager.py`` with
``--mamba-cache-mode align``, the ``HybridKVCacheCoordinator`` in ``kv_cache_coordinator.py``):

- **Hits land on the block grid, at a snapshot.** The attention layers match whole blocks (at most
  the prompt less one token); the hit is then the furthest snapshot at or below that, and the attention
  blocks beyond it are computed again. With EAGLE/MTP the attention match gives back one block first.
- **Which states are kept** (``MambaManager.reachable_block_mask``, ``--prefix-cache-retention-interval``
  R, default 0): a state written at a block-aligned chunk end is cached when it is a prompt's replay
  boundary (the block boundary below its last token), a shared-prefix junction, a multiple of R (R > 0),
  or always (R null, dense). A request whose attention match ran past its Mamba hit records the match
  as its *junction* (``shared_prefix_boundary``): its prefill stops there and keeps that state, so
  the next request over the same shared prefix hits it.
- **Snapshots take pool blocks.** One snapshot is one block in each Mamba group, held while a request
  uses it (the running state, a hit, the prompt's checkpoint) and then freed into the LRU queue like
  cached attention blocks; they are evicted in the order vLLM frees them, block by block, and a
  snapshot that lost a block is gone (``get_cached_block`` needs every group). The running state and
  its draft copies are private blocks; when a step crosses a block boundary the old state is kept
  until the sequence's next step (``remove_skipped_blocks``), cached if its position is kept.
- **Same step**: a snapshot cached in the current step cannot be hit before the next one (vLLM refuses
  the allocation: ``cached_blocks_this_step``), which stops admission for that step.

Snapshots are keyed to the tree node holding the trace block at their position, so they share the
tree's notion of equal prefixes. Not modelled: ``--prefix-match-unit`` finer than the block (hits
inside a block, partial-tail checkpoints, the shared-prefix checkpoint of
``--enable-mamba-shared-prefix-checkpoint``, which needs it); a snapshot of a run whose attention
blocks were evicted is dropped (vLLM keeps it and could hit it again once the blocks are recomputed);
of two live snapshots at one position only the first can be hit; decode-group members crossing a
block boundary free their old state as fresh blocks (vLLM caches it only with dense retention, and
generated tokens never key a hit here).
"""

from __future__ import annotations

from typing import Optional, Sequence

from .hybrid import checkpoint_inside, checkpoint_position, replay_boundaries
from .kv_cache import Holding, KVCache
from .prefix_tree import Dead, Node, common_prefix_at


class _Snap:
    """One Mamba state snapshot: a block in each Mamba group, hashed at position ``k`` blocks."""

    __slots__ = ("node", "k", "ref", "alive", "blocks", "step")

    def __init__(self, k: int, blocks: int, step: int) -> None:
        self.node: Optional[Node] = None
        """The tree node it is keyed to (None: it cannot be hit)."""
        self.k = k
        self.ref = 1
        self.alive = False
        """Whether a request can hit it (keyed, and none of its blocks evicted)."""
        self.blocks = blocks
        """Its blocks still cached."""
        self.step = step
        """The cache's step when it was cached."""


class HybridHolding(Holding):
    """A request's blocks in a hybrid cache: attention as in `Holding`, plus its Mamba states."""

    __slots__ = ("prompt", "state", "run", "trans", "started", "junction", "marks")

    def __init__(self, hash_ids: Sequence[int], trace_block: int, input_tokens: int) -> None:
        super().__init__(hash_ids, trace_block, input_tokens)
        self.prompt = input_tokens
        self.state = 0
        """Private Mamba state blocks held (the running state unless cached, its draft copies, old
        states awaiting the next step)."""
        self.run: Optional[_Snap] = None
        """The snapshot the running state is, while it is cached (a hit, or a kept chunk end)."""
        self.trans: list[Optional[_Snap]] = []
        """States kept until the request's next step, lowest position first (None: a private one)."""
        self.started = False
        """Whether its running state and draft copies are allocated."""
        self.junction = 0
        """Its shared-prefix junction (tokens; 0: none)."""
        self.marks: tuple[int, ...] = ()
        """Its prompt's replay boundaries (tokens)."""


class HybridKVCache(KVCache):
    """`KVCache` with Mamba state snapshots, for a hybrid model's pool (see the module docstring).

    A request's steps go through `advance` (every step it is scheduled outside the twin's decode
    group), which frees the states kept since its last step, grows its attention blocks, allocates a
    new state when the step crosses a block boundary, exports the prompt's checkpoint and caches the
    states that are kept."""

    _dead_in_queue = True  # snapshot blocks are entries of the queue too

    def __init__(self, num_blocks: int, block_size: int, mamba_groups: int, *, prefix_caching: bool = True,
                 spec_blocks: int = 0, retention: Optional[int] = 0, eagle: bool = False,
                 internal_checkpoint: bool = True) -> None:
        super().__init__(num_blocks, block_size, prefix_caching)
        self.groups = mamba_groups
        self.spec_blocks = spec_blocks
        """Draft-token state copies per Mamba group a running sequence keeps."""
        self.retention = retention
        self.eagle = eagle
        self.internal_checkpoint = internal_checkpoint
        self.step = 0
        """Counts the engine's steps (`new_step`), for the same-step rule."""
        self.snapshots = 0
        """Snapshots cached so far."""

    @property
    def running_blocks(self) -> int:
        """State blocks a running sequence holds between boundary crossings."""
        return self.groups * (1 + self.spec_blocks)

    def new_step(self) -> None:
        """A new engine step begins (snapshots cached before it may now be hit)."""
        self.step += 1

    # ---- lookup and admission ---------------------------------------------------------------

    def lookup_hybrid(self, h: HybridHolding, num_tokens: int) -> tuple:
        """The hit for a request of `num_tokens` tokens: (node, trace blocks, snapshot, junction
        tokens, hit tokens). (node, trace blocks) is the attention prefix the hit keeps; no side
        effect."""
        bs = self.block_size
        if not self.prefix_caching or not h.ids:
            return None, 0, None, 0, 0
        limit = num_tokens // bs if self.eagle else (num_tokens - 1) // bs
        node, pos = self.lookup(h, limit)
        attn = pos * h.tb // bs
        if self.eagle and attn:
            attn -= 1
        snap = None
        walk = node
        while walk is not None and walk.parent is not None and snap is None:
            snaps = walk.snaps
            if snaps:
                for k, candidate in snaps.items():
                    if k <= attn and (snap is None or k > snap.k):
                        snap = candidate
            walk = walk.parent
        k = snap.k if snap is not None else 0
        junction = attn * bs if attn > k else 0
        if not k:
            return None, 0, None, junction, 0
        x = -(-k * bs // h.tb)  # the trace blocks covering the hit
        while node.start >= x:
            node = node.parent  # type: ignore[assignment]
        return node, x, snap, junction, k * bs

    def admit_hybrid(self, h: HybridHolding, match: tuple, prefill_end: int, tokens: int) -> bool:
        """Hold a `lookup_hybrid` match and take the request's first step up to `tokens`; False
        (nothing changed) when its blocks do not fit."""
        node, pos, snap, junction, hit = match
        h.junction = junction
        h.marks = replay_boundaries(h.prompt, self.block_size, self.eagle)
        revive = self.revived((node, pos)) if node is not None else 0
        if snap is not None and snap.ref == 0:
            revive += self.groups
        need = -(-tokens // self.block_size) - pos * h.tb // self.block_size + revive
        need += self._state_need(h, hit, tokens, prefill_end)
        if need > self.available:
            return False
        if node is not None:
            self.hold(h, (node, pos))
        if snap is not None:
            self._touch(snap)
            h.run = snap
        self._step(h, hit, tokens, prefill_end)
        return True

    def advance(self, h: HybridHolding, start: int, tokens: int, prefill_end: int) -> bool:
        """A step of a running request from `start` to `tokens` computed tokens (its prefill ends at
        `prefill_end`): frees the states kept since its last step, then grows it; False (only those
        freed) when the blocks do not fit."""
        if h.trans:
            self.settle(h)
        bs = self.block_size
        blocks = -(-tokens // bs)
        need = blocks - h.blocks
        if need < 0:
            need = 0
        if tokens - start > bs or not h.started or (self.prefix_caching and blocks > -(-start // bs)):
            need += self._state_need(h, start, tokens, prefill_end)
        # else none: a step within one block, of a started request, exports no checkpoint
        # (`checkpoint_inside` needs a chunk longer than a block)
        if not need:
            if self.prefix_caching:
                if h.keyed_tb < len(h.ids) and tokens // h.tb > h.keyed_tb:
                    self._grow(h, tokens)  # blocks full since its last growth become keyed
                if tokens % self.block_size == 0:
                    self._cache_state(h, tokens, prefill_end)
            return True
        if need > self.available:
            return False
        self._step(h, start, tokens, prefill_end)
        return True

    def settle(self, h: HybridHolding) -> None:
        """Free the states a request kept since its last step (vLLM: at its next allocation)."""
        freed = []
        for unit in h.trans:
            if unit is None:
                h.state -= self.groups
                self.private -= self.groups
            else:
                unit.ref -= 1
                if unit.ref == 0:
                    freed.append(unit)
        h.trans.clear()
        if freed:
            freed.reverse()  # each group frees its blocks highest position first
            self._queue(freed)

    def release(self, h: Holding, computed: int = 0) -> None:
        """Free a request: its Mamba states first (vLLM's groups put the Mamba ones first), then its
        attention blocks (`KVCache.release`)."""
        if isinstance(h, HybridHolding):
            freed = []
            if h.run is not None:
                h.run.ref -= 1
                if h.run.ref == 0:
                    freed.append(h.run)
            for unit in reversed(h.trans):
                if unit is not None:
                    unit.ref -= 1
                    if unit.ref == 0:
                        freed.append(unit)
            self.private -= h.state
            h.state = 0
            h.run = None
            h.trans.clear()
            h.started = False
            if freed:
                self._queue(freed)
        super().release(h, computed)

    # ---- one step ---------------------------------------------------------------------------

    def _state_need(self, h: HybridHolding, start: int, tokens: int, prefill_end: int) -> int:
        """State blocks a step from `start` to `tokens` allocates."""
        groups, bs = self.groups, self.block_size
        need = 0
        if not h.started:
            need = groups * (1 + self.spec_blocks)
        elif self.prefix_caching and -(-tokens // bs) > -(-start // bs):
            need = groups  # a new block for the state past the boundary (one block per state without caching)
        if self._checkpoint(start, tokens, prefill_end):
            need += groups
        return need

    def _checkpoint(self, start: int, tokens: int, prefill_end: int) -> int:
        """The checkpoint a step exports from inside its chunk (0: none): the prompt's, in the chunk
        that ends the prefill; with a retention interval other than 0 any chunk's (vLLM's coordinator
        then passes no prefill end: every chunk publishes a state)."""
        if not (self.prefix_caching and self.internal_checkpoint):
            return 0
        if tokens < prefill_end and self.retention == 0:
            return 0
        position = checkpoint_position(tokens, self.block_size, self.eagle)
        return position if checkpoint_inside(start, tokens, position, self.block_size) else 0

    def _step(self, h: HybridHolding, start: int, tokens: int, prefill_end: int) -> None:
        """Apply a step whose blocks are known to fit."""
        groups, bs = self.groups, self.block_size
        attn = -(-tokens // bs) - h.blocks
        state = 0
        if not h.started:
            state = groups * (1 + self.spec_blocks)
            if h.run is not None:  # a hit: that state is the start, the new running state is private
                h.trans.append(h.run)
                h.run = None
        elif self.prefix_caching and -(-tokens // bs) > -(-start // bs):
            state = groups
            h.trans.append(h.run)  # None: the old running state was private
            h.run = None
        checkpoint = self._checkpoint(start, tokens, prefill_end)
        if checkpoint:
            state += groups
        need = attn + state if attn > 0 else state
        fresh = self.num_blocks - self.cached - self.private
        if need > fresh:
            self._evict(need - fresh)
        if attn > 0 or (self.prefix_caching and h.keyed_tb < len(h.ids) and tokens // h.tb > h.keyed_tb):
            self._grow(h, tokens)
        if state:
            h.started = True
            h.state += state
            self.private += state
        if checkpoint:
            unit = self._cache(h, checkpoint) if self._kept(h, checkpoint, prefill_end, True) else None
            if unit is not None:  # hashed: no longer a private block
                h.state -= groups
                self.private -= groups
            h.trans.append(unit)
        if tokens % bs == 0 and self.prefix_caching:
            self._cache_state(h, tokens, prefill_end)

    def _cache_state(self, h: HybridHolding, tokens: int, prefill_end: int) -> None:
        """Cache the running state at a block-aligned chunk end when its position is kept."""
        if h.run is None and self._kept(h, tokens, prefill_end, False):
            unit = self._cache(h, tokens)
            h.state -= self.groups
            self.private -= self.groups
            h.run = unit

    def _kept(self, h: HybridHolding, position: int, prefill_end: int, checkpoint: bool) -> bool:
        """Whether the state at `position` is cached (``reachable_block_mask``; a checkpoint of the
        prompt itself always is)."""
        retention = self.retention
        if retention is None:
            return True
        if retention > 0 and position % retention == 0:
            return True
        if position in h.marks or position == h.junction:
            return True
        return checkpoint and position == checkpoint_position(h.prompt, self.block_size, self.eagle)

    def _cache(self, h: HybridHolding, position: int) -> _Snap:
        """A new snapshot at `position` held by `h`, keyed to its path when it can be."""
        unit = _Snap(position // self.block_size, self.groups, self.step)
        self.cached += self.groups
        self.snapshots += 1
        x = position // h.tb if h.tb else 0
        node = self._path_node(h, x) if x >= 1 else None
        if node is None:
            return unit
        snaps = node.snaps
        if snaps is None:
            snaps = node.snaps = {}
        if unit.k not in snaps:
            snaps[unit.k] = unit
            unit.node = node
            unit.alive = True
        return unit

    def _path_node(self, h: HybridHolding, x: int) -> Optional[Node]:
        """The tree node holding trace block x - 1 of the request's prompt: on its held path, or on a
        run it computed again that agrees with its ids so far (not yet keyed by it); None if none."""
        if x > len(h.ids):
            return None
        if x <= h.keyed_tb:
            node = h.node
            while node is not None and node.start >= x:
                node = node.parent
            return node if node is not None and node.parent is not None else None
        node = h.node if h.node is not None else self.roots.get(h.tb)
        pos = h.keyed_tb
        ids = h.ids
        while node is not None:
            child = node.children.get(ids[pos])
            if child is None:
                return None
            n = min(child.n, x - pos)
            if common_prefix_at(ids, child.src, pos, n) < n:
                return None
            if child.start + child.n >= x:
                return child
            node, pos = child, pos + child.n
        return None

    # ---- the queue --------------------------------------------------------------------------

    def _add_dead(self, blocks: int) -> None:
        # in the queue itself: snapshot blocks are entries of it too
        self.lru[Dead(blocks)] = None
        self.cached += blocks
        self.evictable += blocks

    def _touch(self, unit: _Snap) -> None:
        """A request holds a snapshot: out of the queue when it was unreferenced."""
        if unit.ref == 0:
            lru = self.lru
            for g in range(self.groups):
                del lru[(unit, g)]
            self.evictable -= self.groups
        unit.ref += 1

    def _queue(self, units: list[_Snap]) -> None:
        """Unreferenced snapshots join the queue, group by group, in the given order."""
        lru = self.lru
        for g in range(self.groups):
            for unit in units:
                lru[(unit, g)] = None
        self.evictable += self.groups * len(units)

    def _evict(self, blocks: int) -> None:
        lru = self.lru
        while blocks > 0:
            key = next(iter(lru))
            if key.__class__ is tuple:
                del lru[key]
                unit = key[0]
                unit.blocks -= 1
                if unit.alive:
                    self._forget(unit)
                self.cached -= 1
                self.evictable -= 1
                self.evictions += 1
                blocks -= 1
            else:
                blocks -= self._evict_entry(key, blocks)

    def _forget(self, unit: _Snap) -> None:
        """A snapshot can no longer be hit."""
        unit.alive = False
        node = unit.node
        if node is not None and node.snaps is not None and node.snaps.get(unit.k) is unit:
            del node.snaps[unit.k]
        unit.node = None

    def _move_snaps(self, tail: Node, head: Node) -> None:
        snaps = tail.snaps
        assert snaps is not None
        end = head.start + head.n
        moved = {k: s for k, s in snaps.items() if k * self.block_size // tail.tb <= end}
        if moved:
            for k, unit in moved.items():
                del snaps[k]
                unit.node = head
            head.snaps = moved

    def _drop_snaps(self, node: Node, upto: int) -> None:
        snaps = node.snaps
        assert snaps is not None
        for unit in [s for k, s in snaps.items() if k * self.block_size // node.tb > upto]:
            self._forget(unit)
