"""Prefix caching on whole blocks of token ids, keyed by a hash chained over the blocks before each."""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence


def block_hash_ids(ids: Sequence[int], block_size: int) -> list[int]:
    """One id per full block of `block_size` token ids, chained over the blocks before it: two prompts
    get equal leading ids exactly as far as their token prefixes are equal (whole blocks)."""
    out: list[int] = []
    parent = 0
    for start in range(0, len(ids) - block_size + 1, block_size):
        parent = hash((parent, *ids[start:start + block_size]))
        out.append(parent)
    return out


class PrefixCache:
    """The emulator's own prefix cache (a server twin keeps its own): full token blocks by their
    `block_hash_ids`, at most `capacity` of them; least recently used go first."""

    def __init__(self, block_size: int, capacity: int) -> None:
        self.block_size = block_size
        self.capacity = capacity
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def lookup_and_insert(self, ids: Sequence[int]) -> int:
        """Tokens of `ids` found cached (whole leading blocks, leaving at least one token to compute);
        then cache all of its full blocks."""
        blocks = self._blocks
        hits = 0
        missed = False
        for key in block_hash_ids(ids, self.block_size):
            if not missed and key in blocks:
                hits += 1
                blocks.move_to_end(key)
            else:
                missed = True
                blocks[key] = None
        while len(blocks) > self.capacity:
            blocks.popitem(last=False)
        cached = hits * self.block_size
        if cached >= len(ids) and cached > 0:
            cached -= self.block_size
        return cached
