"""Prefix hash ids for traces that record how much of a prompt was reused, not which blocks.

The workload schema carries prefix reuse as hash ids: one id per `block_size` tokens of a prompt,
equal ids meaning equal token blocks (see `simulator.workload.Call`). Traces such as TraceLab only
say "this prompt has N tokens, of which R were already in the previous prompt". `extend_prefix`
turns that into ids: the first ``R // block_size`` ids are copied from the previous call, the rest
are new ids drawn from a counter, so a prefix cache replaying the workload sees exactly the
recorded reuse, rounded down to whole blocks.

The ids come back as a `HashIds` view that shares the previous call's chain when it extends it, and
new ids are handed out as ranges (`FreshIds.take`), so a call costs a few bytes however long its
prompt: a row claiming a prompt of millions of tokens takes no more memory than a short one.

Like the Claude Code traces, a prompt of ``N`` tokens gets ``N // block_size`` ids: a trailing
partial block has no id (it cannot be a cache hit in a block-granular cache anyway).

Ids from different sources must not collide by accident, and must not depend on the order files
are loaded in. `namespace(name)` gives each source (a file, a session) its own range of 2**32 ids,
derived from a CRC-32 of its name; all ids stay below 2**63 so they fit a signed 64-bit integer.
"""

from __future__ import annotations

import itertools
import zlib
from typing import Iterator, Sequence, Union

from ..hash_ids import HashIds

LOCAL_ID_LIMIT = 1 << 32
"""Ids local to one namespace must be below this."""


def namespace(name: str) -> int:
    """The base id of a namespace: 31 bits of the name's CRC-32, shifted above the local ids."""
    return (zlib.crc32(name.encode("utf-8")) & 0x7FFFFFFF) << 32


class FreshIds:
    """An endless counter of new ids that hands them out one (`next`) or a range at a time (`take`)."""

    __slots__ = ("next_id",)

    def __init__(self, first: int) -> None:
        self.next_id = first

    def __iter__(self) -> Iterator[int]:
        return self

    def __next__(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def take(self, count: int) -> range:
        """The next `count` ids."""
        first = self.next_id
        self.next_id += max(0, count)
        return range(first, self.next_id)


def fresh_ids(name: str) -> FreshIds:
    """An endless counter of new ids in the namespace of `name` (1, 2, ... above its base)."""
    return FreshIds(namespace(name) + 1)


def extend_prefix(
    previous: Sequence[int],
    reused_tokens: int,
    total_tokens: int,
    block_size: int,
    fresh: Union[FreshIds, Iterator[int]],
) -> HashIds:
    """Hash ids of a prompt of `total_tokens` whose first `reused_tokens` repeat the previous prompt.

    The result has ``total_tokens // block_size`` ids. Its first ``reused_tokens // block_size`` ids
    (never more than `previous` has, nor than the result has) are those of `previous`; every
    other id is taken from `fresh`. With no previous call pass ``()``: all ids are fresh.
    """
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    if reused_tokens < 0 or total_tokens < 0:
        raise ValueError("token counts must be non-negative")
    count = total_tokens // block_size
    keep = min(reused_tokens // block_size, len(previous), count)
    new = fresh.take(count - keep) if isinstance(fresh, FreshIds) else tuple(itertools.islice(fresh, count - keep))
    base = previous if isinstance(previous, HashIds) else HashIds.of(tuple(previous[:keep]))
    return base.extend(keep, new)
