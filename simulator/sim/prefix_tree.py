"""The prefix cache's radix tree over hash-id sequences: its nodes, the queue's entries of dead blocks,
and how far two prompts' runs of ids agree.

A `Node` is a run of consecutive trace blocks (hash ids) that one path of the tree spells; its
children start where it ends, keyed by their first id. `simulator.sim.kv_cache.KVCache` keeps a tree
of these per trace block size, with their reference counts and their places in its LRU queue;
`simulator.sim.hybrid_cache.HybridKVCache` keys its Mamba state snapshots to them.
"""

from __future__ import annotations

from typing import Optional


class Node:
    """A run of trace blocks in the tree (a root has none), or, once it left the tree (`parent` None),
    a dead entry that only holds a place in the queue."""

    __slots__ = ("parent", "src", "n", "start", "ref", "children", "tb", "size", "spare", "snaps", "qseq")

    def __init__(self, parent: Optional[Node], src: tuple, start: int, n: int, tb: int) -> None:
        self.parent = parent
        """The node above (None: a root, or a dead node that only holds a place in the queue)."""
        self.src = src
        """The hash ids of a prompt that holds this run: the run is ``src[start:start + n]``. Runs
        share their prompts' tuples rather than copy them, so growing, splitting or shortening a
        run (eviction) copies no ids."""
        self.n = n
        self.start = start
        """Position of its first trace block in the prompt."""
        self.ref = 0
        """Requests holding this node (a request holds every node on its path from the root)."""
        self.children: dict[int, Node] = {}
        self.tb = tb
        self.size = 0
        """KV blocks this run fills (kept by the cache); of a dead node, its blocks."""
        self.spare = 0
        """Dead blocks behind this node at its place in the queue (old copies of a run a request took
        over), evicted after the node's own; only while the node is unreferenced."""
        self.snaps: Optional[dict] = None
        """Mamba state snapshots keyed to this run (hybrid models, `simulator.sim.hybrid_cache`)."""
        self.qseq = 0
        """Its place in the queue, against `KVCache.dead` (the order it joined the queue in)."""

    @property
    def end(self) -> int:
        """Position just past its last trace block."""
        return self.start + self.n

    @property
    def ids(self) -> tuple:
        """The trace blocks of this run (hash ids)."""
        return self.src[self.start:self.start + self.n]


class Dead:
    """Dead blocks as an entry of the queue itself (hybrid caches; a node that left the tree is one too)."""

    __slots__ = ("size",)
    parent = None
    spare = 0

    def __init__(self, size: int) -> None:
        self.size = size


def common_prefix_at(ids: tuple, src: tuple, pos: int, n: int) -> int:
    """How many of ``ids[pos:pos + n]`` equal ``src[pos:pos + n]`` from the start (the first is known
    to be equal)."""
    if src is ids or ids[pos:pos + n] == src[pos:pos + n]:
        return n
    lo, hi = 1, n  # ids[pos:pos+lo] matches, ids[pos:pos+hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ids[pos:pos + mid] == src[pos:pos + mid]:
            lo = mid
        else:
            hi = mid
    return lo
