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

Eviction follows vLLM's rule: only unreferenced cached blocks are evicted, least recently freed first,
and a request frees its blocks tail first, so a conversation's newest turn goes before its shared
root. Here the unit is a leaf node, trimmed from its tail block by block as far as needed.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Optional, Sequence


class _Node:
    __slots__ = ("parent", "src", "n", "start", "ref", "children", "tb", "size")

    def __init__(self, parent: Optional[_Node], src: tuple, start: int, n: int, tb: int) -> None:
        self.parent = parent
        self.src = src
        """The hash ids of a prompt that holds this run: the run is ``src[start:start + n]``. Runs
        share their prompts' tuples rather than copy them, so growing, splitting or shortening a
        run (eviction) copies no ids."""
        self.n = n
        self.start = start
        """Position of its first trace block in the prompt."""
        self.ref = 0
        """Requests holding this node (a request holds every node on its path from the root)."""
        self.children: dict[int, _Node] = {}
        self.tb = tb
        self.size = 0
        """KV blocks this run fills (kept by the cache)."""

    @property
    def end(self) -> int:
        return self.start + self.n

    @property
    def ids(self) -> tuple:
        """The trace blocks of this run (hash ids)."""
        return self.src[self.start:self.start + self.n]


class Holding:
    """One request's blocks: the deepest tree node it holds, how far its keyed blocks reach, and its
    private blocks."""

    __slots__ = ("ids", "tb", "node", "keyed_tb", "private", "sealed", "blocks")

    def __init__(self, hash_ids: Sequence[int], trace_block: int, input_tokens: int) -> None:
        usable = min(len(hash_ids), input_tokens // trace_block) if trace_block > 0 else 0
        self.ids = tuple(hash_ids[:usable])
        """Hash ids of the prompt's full trace blocks."""
        self.tb = trace_block
        self.node: Optional[_Node] = None
        self.keyed_tb = 0
        """Trace blocks held through the tree."""
        self.private = 0
        self.sealed = False
        """True once its keyed growth stopped (someone else cached the continuation first)."""
        self.blocks = 0
        """Blocks held in all (keyed and private)."""


class KVCache:
    """Block accounting for the twin: capacity, references, the prefix cache and its LRU queue."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.roots: dict[int, _Node] = {}
        self.lru: OrderedDict[_Node, None] = OrderedDict()
        """Unreferenced nodes, least recently freed first (children always before their parent)."""
        self.cached = 0
        """Blocks in the tree (held or evictable)."""
        self.evictable = 0
        """Blocks of unreferenced nodes."""
        self.private = 0
        self.evictions = 0
        """Blocks evicted."""

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

    def lookup(self, h: Holding, limit_blocks: int) -> tuple[Optional[_Node], int]:
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
            if src is ids or ids[pos:pos + n] == src[pos:pos + n]:
                if n < child.n:
                    return child, pos + n
                node, pos = child, pos + n
                continue
            lo, hi = 1, n  # ids[pos:pos+lo] matches, ids[pos:pos+hi] does not
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if ids[pos:pos + mid] == src[pos:pos + mid]:
                    lo = mid
                else:
                    hi = mid
            return child, pos + lo
        return node, pos

    def cached_blocks(self, h: Holding, match: tuple[Optional[_Node], int]) -> int:
        """KV blocks a lookup's match covers."""
        return match[1] * h.tb // self.block_size

    def admit(self, h: Holding, match: tuple[Optional[_Node], int], tokens: int) -> bool:
        """Hold the matched prefix and grow the request to cover `tokens`; False (nothing changed)
        when the blocks do not fit."""
        node, pos = match
        if node is None or pos == 0:
            return self.grow(h, tokens)
        total = -(-tokens // self.block_size)
        matched = pos * h.tb // self.block_size
        revived = 0
        if node.ref == 0:
            # only a split node's head
            revived = pos * h.tb // self.block_size - node.start * h.tb // self.block_size
            walk = node.parent
            while walk.parent is not None and walk.ref == 0:  # held nodes have held ancestors
                revived += walk.size
                walk = walk.parent
        if total - matched > self.num_blocks - self.cached - self.private + self.evictable - revived:
            return False
        if node.start + node.n > pos:
            node = self._split(node, pos - node.start)
        walk = node
        while walk.parent is not None:
            if walk.ref == 0:
                del self.lru[walk]
                self.evictable -= walk.size
            walk.ref += 1
            walk = walk.parent
        h.node = node
        h.keyed_tb = pos
        h.blocks = matched
        return self.grow(h, tokens)

    def grow(self, h: Holding, tokens: int) -> bool:
        """Grow a held request to blocks covering `tokens` (its trace blocks become keyed once
        wholly inside them); False (nothing changed) when they do not fit."""
        total = -(-tokens // self.block_size)
        need = total - h.blocks
        if need <= 0:
            return True
        fresh = self.num_blocks - self.cached - self.private
        if need > fresh + self.evictable:
            return False
        if need > fresh:
            self._evict(need - fresh)
        keyed_tb = h.keyed_tb
        usable = len(h.ids)
        if keyed_tb == usable or h.sealed or not self.prefix_caching:  # only private blocks to add
            self.private += need
            h.private += need
            h.blocks = total
            return True
        target = tokens // h.tb  # h.ids is not empty here, so h.tb > 0
        if target > usable:
            target = usable
        if target > keyed_tb:
            keyed_tb = self._extend(h, target)
        keyed = keyed_tb * h.tb // self.block_size
        self.cached += keyed - h.keyed_tb * h.tb // self.block_size
        h.keyed_tb = keyed_tb
        private = total - keyed
        self.private += private - h.private
        h.private = private
        h.blocks = total
        return True

    def take(self, blocks: int) -> bool:
        """Allocate `blocks` private blocks held outside any `Holding` (the twin's decode group keeps
        its members' counts itself); False (nothing changed) when they do not fit. Evicts exactly as
        growing the holdings one by one would, whatever the split."""
        if blocks <= 0:
            return True
        fresh = self.num_blocks - self.cached - self.private
        if blocks > fresh + self.evictable:
            return False
        if blocks > fresh:
            self._evict(blocks - fresh)
        self.private += blocks
        return True

    def release(self, h: Holding) -> None:
        """Free a request's blocks, tail first; its keyed blocks stay cached until evicted."""
        node = h.node
        while node is not None and node.parent is not None:
            node.ref -= 1
            if node.ref == 0:
                self.lru[node] = None
                self.evictable += node.size
            node = node.parent
        self.private -= h.private
        h.node = None
        h.keyed_tb = h.private = h.blocks = 0
        h.sealed = False

    # ---- tree surgery -----------------------------------------------------------------------

    def _extend(self, h: Holding, target: int) -> int:
        """Add the request's trace blocks up to `target` to the tree; returns how far it got. A leaf
        only this request holds grows in place, so a conversation stays one node turn after turn."""
        node = h.node
        if node is not None and node.ref == 1 and not node.children:
            # it ends where the request's keyed blocks do, and its run agrees with the request's ids
            node.src = h.ids
            node.n = target - node.start
            node.size = target * node.tb // self.block_size - node.start * node.tb // self.block_size
            return target
        parent = h.node
        if parent is None:
            parent = self.roots.get(h.tb)
            if parent is None:
                parent = self.roots[h.tb] = _Node(None, (), 0, 0, h.tb)
        first = h.ids[h.keyed_tb]
        if first in parent.children:  # someone cached this continuation first: the rest stays private
            h.sealed = True
            return h.keyed_tb
        child = _Node(parent, h.ids, h.keyed_tb, target - h.keyed_tb, h.tb)
        child.ref = 1
        child.size = target * h.tb // self.block_size - h.keyed_tb * h.tb // self.block_size
        parent.children[first] = child
        h.node = child
        return target

    def _split(self, node: _Node, k: int) -> _Node:
        """Cut `node` after its first k trace blocks; returns the new head (the tail keeps its place
        in the LRU queue)."""
        head = _Node(node.parent, node.src, node.start, k, node.tb)
        head.ref = node.ref
        node.parent.children[node.src[node.start]] = head  # type: ignore[union-attr]
        node.n -= k
        node.start += k
        node.parent = head
        head.children[node.src[node.start]] = node
        head.size = (head.start + k) * head.tb // self.block_size - head.start * head.tb // self.block_size
        node.size -= head.size
        if node.ref == 0:  # unreferenced like the tail; the caller's hold walk takes it out
            self.lru[head] = None
        return head

    def _evict(self, blocks: int) -> None:
        """Free `blocks` blocks from unreferenced leaves, least recently freed first, tail first."""
        lru = self.lru
        while blocks > 0:
            node = next(iter(lru))
            if node.children:  # defensive: a parent never precedes its children
                lru.move_to_end(node)
                continue
            start_kv = node.start * node.tb // self.block_size
            size = node.size
            if size <= blocks:
                del lru[node]
                del node.parent.children[node.src[node.start]]  # type: ignore[union-attr]
                freed = size
            else:
                # the most trace blocks whose KV blocks stay within size - blocks (fewer than all)
                keep = ((start_kv + size - blocks + 1) * self.block_size - 1) // node.tb - node.start
                if keep > 0:
                    node.n = keep
                    node.size = (node.start + keep) * node.tb // self.block_size - start_kv
                    freed = size - node.size
                else:
                    del lru[node]
                    del node.parent.children[node.src[node.start]]  # type: ignore[union-attr]
                    freed = size
            self.cached -= freed
            self.evictable -= freed
            self.evictions += freed
            blocks -= freed
