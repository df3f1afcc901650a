"""The twin's decoding requests advanced as one group, so that a step costs the same whatever the batch.

Every member of the group decodes in every step the group takes part in, so the group keeps shared
counters and each member only its offsets from them, fixed when it joins:

- tokens: the group counts the tokens each member emitted since the group began (`tokens`); a member
  has computed ``a + tokens`` and generated ``b + tokens`` of them, until it reaches its target at the
  finish point ``target - b``. Finish points sit in a heap, so finding who ends in a step, or how many
  steps are left before the first end, does not look at the others.
- KV blocks: every member holds the blocks covering ``a + horizon`` tokens, the horizon moving with
  the group. Members are counted by the residue of `a` modulo the block size, so the blocks a move of
  the horizon needs are a sum over at most `block_size` residues.
- inter-token gaps: a member sees every step gap after its first step. The group records its steps in
  *units* (one step, or a run of decode steps planned at once) and keeps the largest gap of each unit
  on a decreasing stack, so a member's largest gap since it joined is one binary search. When gaps are
  kept, the step gaps go into one shared list that a member's own list is sliced from when it leaves.

A member's exact per-request fields (tokens, blocks, gap counts and maxima) are written back by
`settle`, when it finishes or when the twin needs to step it on its own (see `simulator.sim.twin`).
The group is arithmetic only: it does not touch the KV cache nor time; the twin does both.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right, insort
from collections import deque
from typing import Optional, Sequence

from .request import TwinRequest

_TRIM_AT = 64
"""Shortest gap stack or shared gap list worth trimming."""


class DecodeGroup:
    """Shared counters of the requests decoding together (see the module docstring)."""

    def __init__(self, block_size: int, keep_gaps: bool, track_room: bool = False) -> None:
        self.block_size = block_size
        self.keep_gaps = keep_gaps
        self.tokens = 0
        """Tokens each member emitted since the group's counters began."""
        self.horizon = 0
        """Members hold the blocks covering ``a + horizon`` tokens."""
        self.steps = 0
        """Steps the group took part in."""
        self.units = 0
        self.size = 0
        self.offset_sum = 0
        """Sum of the members' `a`: their computed tokens are ``offset_sum + size * tokens``."""
        self.residues = [0] * block_size
        self.occupied: Optional[list[int]] = [] if track_room else None
        """The residues some member has, sorted (kept for `room` only)."""
        self.heap: list[tuple[int, int, TwinRequest]] = []
        """(finish point, seq, member), the finish point being the group's `tokens` when the member
        reaches its target."""
        self.last_end = 0.0
        """End of the group's last step."""
        self._order: deque[tuple[int, TwinRequest, int]] = deque()
        """(the group's `steps` at the join, member, the join's number), in running order."""
        self.joins = 0
        """Joins so far (a member that left and came back counts again)."""
        self.b_sum = 0
        """Sum of the members' `b`: their generated tokens are ``b_sum + size * tokens``."""
        """(steps at join, member) in join order, which is the running order; left members linger."""
        self._joined: list[TwinRequest] = []
        """Members that joined since the last unit (their first gap is their own)."""
        self._stack_units: list[int] = []
        self._stack_max: list[float] = []
        self._trim_at = _TRIM_AT
        self._stale = 0
        """Members in `_order` who left."""
        self._gaps: list[float] = []
        self._gaps_base = 0
        """Step index of `_gaps[0]`."""

    # ---- membership -------------------------------------------------------------------------

    def join(self, req: TwinRequest) -> None:
        """Add a decoding request that holds the blocks for ``computed + horizon - tokens`` tokens."""
        tokens = self.tokens
        a = req.computed - tokens
        req.a = a
        req.b = req.generated - tokens
        req.t_join = self.steps
        req.u_join = self.units
        req.keyed = req.hold.blocks - req.hold.private
        req.in_group = True
        self.size += 1
        self.offset_sum += a
        r = a % self.block_size
        self.residues[r] += 1
        if self.occupied is not None and self.residues[r] == 1:
            insort(self.occupied, r)
        heapq.heappush(self.heap, (req.target - req.b, req.seq, req))
        self.joins += 1
        self.b_sum += req.b
        self._order.append((self.steps, req, self.joins))
        self._joined.append(req)

    def settle(self, req: TwinRequest) -> None:
        """Write a member's exact fields back at the end of a unit and take it out of the group (its
        heap entry must be gone already)."""
        tokens = self.tokens
        finish = req.target - req.b
        reached = tokens if tokens < finish else finish
        req.generated = req.b + reached
        req.computed = req.a + reached
        req.itl_count += self.steps - req.t_join
        top = self.largest_gap_after(req.u_join)
        if top > req.itl_max:
            req.itl_max = top
        req.last_token = self.last_end
        gaps = req.gaps
        if gaps is not None:  # kept
            base = self._gaps_base
            gaps.extend(self._gaps[req.t_join + 1 - base:self.steps - base])
        bs = self.block_size
        blocks = -(-(req.a + self.horizon) // bs)
        req.hold.private = blocks - req.keyed
        req.hold.blocks = blocks
        req.in_group = False
        self._stale += 1
        self.size -= 1
        self.offset_sum -= req.a
        self.b_sum -= req.b
        r = req.a % bs
        self.residues[r] -= 1
        if self.occupied is not None and not self.residues[r]:
            del self.occupied[bisect_left(self.occupied, r)]
        if not self.size:
            self._reset()

    def members(self) -> list[TwinRequest]:
        """The members, in running order."""
        return [req for t, req, _ in self._order if req.in_group and req.t_join == t]

    def joined_after(self, joins: int) -> list[TwinRequest]:
        """The members whose join came after the first `joins` (newest first)."""
        out = []
        for t, req, n in reversed(self._order):
            if n <= joins:
                break
            if req.in_group and req.t_join == t:
                out.append(req)
        return out

    def settle_all(self) -> list[TwinRequest]:
        """Settle every member; returns them in running order."""
        members = self.members()
        self.heap.clear()
        for req in members:
            self.settle(req)
        return members

    def _reset(self) -> None:
        self._order.clear()
        self._stale = 0
        self._joined.clear()
        self._stack_units.clear()
        self._stack_max.clear()
        self._gaps.clear()
        self._gaps_base = self.steps

    # ---- blocks -----------------------------------------------------------------------------

    def blocks_needed(self, horizon: int) -> int:
        """Blocks the members need on top of theirs for the horizon to move to `horizon`."""
        h = self.horizon
        moved = horizon - h
        if moved <= 0 or not self.size:
            return 0
        bs = self.block_size
        if moved == 1:
            return self.residues[-h % bs]
        full, part = divmod(moved, bs)
        need = full * self.size
        if part:
            # a member's blocks grow by one for each multiple of bs in [a + h, a + horizon): those
            # of residues (-h - j) % bs for j < part, a window of `residues` read downwards from top
            residues = self.residues
            top = -h % bs
            low = top - part + 1
            if low >= 0:
                need += sum(residues[low:top + 1])
            else:
                need += sum(residues[:top + 1]) + sum(residues[bs + low:])
        return need

    def room(self) -> int:
        """How far the horizon may move before some member needs a block (the group tracks its
        residues' order when made with `track_room`)."""
        occupied = self.occupied
        if not occupied:
            return 1 << 62
        bs = self.block_size
        t = -self.horizon % bs
        i = bisect_right(occupied, t)
        # a member of residue r has (t - r) mod bs tokens of room in its last block
        return t - occupied[i - 1] if i else t - occupied[-1] + bs

    # ---- steps ------------------------------------------------------------------------------

    def remaining(self) -> int:
        """Tokens until the first member reaches its target."""
        return self.heap[0][0] - self.tokens

    def emitted_tokens(self, before: int, emit: int) -> int:
        """Tokens the members emit together in a step that moves the group's `tokens` from `before`
        (no member's target reached yet) to ``before + emit``: `emit` each, or what a member lacks of
        its target (only with speculative decoding, where `emit` may exceed 1)."""
        tokens = self.size * emit
        if emit == 1:
            return tokens
        limit = before + emit
        heap = self.heap
        # the members reaching their target are the heap's entries below `limit`: a subtree's root is
        # its smallest entry, so the walk stops at the first entry at or past it
        stack = [0] if heap else []
        while stack:
            i = stack.pop()
            finish = heap[i][0]
            if finish < limit:
                tokens -= limit - finish
                j = 2 * i + 1
                if j < len(heap):
                    stack.append(j)
                if j + 1 < len(heap):
                    stack.append(j + 1)
        return tokens

    def context(self, per_decode: int) -> int:
        """Context the members attend in the next step: computed tokens plus the scheduled ones."""
        return self.size * (per_decode + self.tokens) + self.offset_sum

    def advance(self, steps: int, first: float, end: float, inner_max: float, inner: Sequence[float],
                emitted: int) -> list[TwinRequest]:
        """Record a unit of `steps` steps ending at `first` (the first) and `end` (the last), whose
        gaps after the first step are `inner` (kept only with gaps kept; `inner_max` their largest);
        each member emitted `emitted` tokens (or fewer, reaching its target). Returns the members who
        reached their target, settled, in running order."""
        largest = inner_max
        joined = self._joined
        if self.size > len(joined):  # members from the unit before see this first gap
            gap = first - self.last_end
            if gap > largest:
                largest = gap
        else:
            gap = 0.0  # nobody reads it
        units, maxima = self._stack_units, self._stack_max
        while maxima and maxima[-1] <= largest:
            maxima.pop()
            units.pop()
        units.append(self.units)
        maxima.append(largest)
        if self.keep_gaps:
            self._gaps.append(gap)
            self._gaps.extend(inner)
        if joined:
            for req in joined:
                own = first - req.last_token
                if own > req.itl_max:
                    req.itl_max = own
                if inner_max > req.itl_max:
                    req.itl_max = inner_max
                if req.gaps is not None:
                    req.gaps.append(own)
            joined.clear()
        self.steps += steps
        self.units += 1
        tokens = self.tokens = self.tokens + emitted
        self.last_end = end
        heap = self.heap
        if not heap or heap[0][0] > tokens:
            if len(units) > self._trim_at:
                self._trim()
            return []
        done = []
        while heap and heap[0][0] <= tokens:
            done.append(heapq.heappop(heap)[2])
        if len(done) > 1:
            done.sort(key=_seq)
        for req in done:
            self.settle(req)
        if len(units) > self._trim_at or self._stale > 2 * self.size + 4 * _TRIM_AT:
            self._trim()
        return done

    def largest_gap_after(self, unit: int) -> float:
        """The largest step gap in the units after `unit` (0.0 if none)."""
        i = bisect_right(self._stack_units, unit)
        return self._stack_max[i] if i < len(self._stack_max) else 0.0

    def _trim(self) -> None:
        """Forget members who left, and stack entries and shared gaps no member can ask for any more."""
        order = self._order = deque(e for e in self._order if e[1].in_group and e[1].t_join == e[0])
        self._stale = 0
        if order:
            oldest = order[0][1]
            k = bisect_right(self._stack_units, oldest.u_join)
            if k:
                del self._stack_units[:k]
                del self._stack_max[:k]
            if self.keep_gaps:
                k = oldest.t_join + 1 - self._gaps_base
                if k > len(self._gaps) // 2:
                    del self._gaps[:k]
                    self._gaps_base += k
        self._trim_at = max(_TRIM_AT, 2 * len(self._stack_units))


def _seq(req: TwinRequest) -> int:
    return req.seq
