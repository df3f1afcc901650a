"""Prefix hash ids shared between the calls of a task: `HashIds`, a read-only sequence of ints.

An agent's prompt grows turn by turn, so call k's hash ids are call k-1's plus a few new ones. Kept as
one tuple per call, a task of n calls holds n partial copies of its last prompt's ids: a million calls
of Claude Code traffic (about 1,800 ids a call) would need 15 GB. Here the calls of a task share one
append-only `_Chain` of ids and each call is a view of a window of it (`HashIds`); a call that does not
extend the previous one (compaction, a rewrite) starts a new chain from a copy of the part it keeps.

A chain stores its ids as runs of consecutive integers (first id, where the run ends): traces number new
blocks from counters, so a run is usually a whole turn and a call costs a few bytes however long its
prompt. Ids that are not consecutive (content digests) cost one run each, 16 bytes an id.

`HashIds` reads like a tuple: `len`, indexing, slicing (a slice with step 1 is another view, no copy),
iteration, ``==`` with tuples and other views, hashing as the equal tuple. Readers that take
``Sequence[int]`` need no change; `common_prefix` compares two sequences and is instant for two views
of one chain. Ids are integers in [0, 2**63): the range of a signed 64-bit integer.
"""

from __future__ import annotations

import itertools
from array import array
from collections import deque
from bisect import bisect_right
from typing import Any, Iterable, Iterator, Optional, Sequence, Union, overload

import numpy as np

ID_LIMIT = 1 << 63
"""Hash ids are below this (they fit a signed 64-bit integer)."""

_SHORT = 48  # below this many ids, grouping into runs in Python beats numpy's per-call overhead
TUPLE_CACHE = 1024
"""Chains whose ids `as_tuple` keeps as a tuple (the last made into one): a reader that goes through a
task's calls in order, as the twin does, then slices one tuple instead of building one a call."""


class _Chain:
    """Append-only ids as runs: run r holds positions [ends[r-1], ends[r]) with ids firsts[r], firsts[r]+1, ...

    Positions already handed out never change, so every view of the chain stays valid as it grows."""

    __slots__ = ("firsts", "ends", "whole")

    def __init__(self) -> None:
        self.firsts = array("q")
        self.ends = array("q")
        self.whole: Optional[tuple[int, ...]] = None
        """The ids as a tuple while `as_tuple` keeps it (for the `TUPLE_CACHE` chains made into one last)."""

    def __len__(self) -> int:
        return self.ends[-1] if self.ends else 0

    def __getstate__(self) -> tuple[array, array]:
        return self.firsts, self.ends  # not the cached tuple

    def __setstate__(self, state: tuple[array, array]) -> None:
        self.firsts, self.ends = state
        self.whole = None

    def add_run(self, first: int, count: int) -> None:
        """Append ids first, first+1, ..., first+count-1 (joined to the last run when they continue it)."""
        if count <= 0:
            return
        ends = self.ends
        if ends:
            last = len(ends) - 1
            start = ends[last - 1] if last else 0
            if self.firsts[last] + ends[last] - start == first:
                ends[last] += count
                return
            ends.append(ends[last] + count)
        else:
            ends.append(count)
        self.firsts.append(first)

    def add_runs(self, firsts: Iterable[int], lengths: Iterable[int]) -> None:
        """Append whole runs, in order."""
        for first, count in zip(firsts, lengths):
            self.add_run(first, count)

    def add_ids(self, ids: array) -> None:
        """Append checked ids (an ``array('q')`` of values in [0, ID_LIMIT))."""
        n = len(ids)
        if n == 0:
            return
        first = ids[0]
        if ids[-1] - first == n - 1 and (n <= 2 or ids == array("q", range(first, first + n))):
            self.add_run(first, n)
        elif n < _SHORT:
            run_first = previous = first
            count = 1
            for value in itertools.islice(ids, 1, None):
                if value == previous + 1:
                    count += 1
                else:
                    self.add_run(run_first, count)
                    run_first, count = value, 1
                previous = value
            self.add_run(run_first, count)
        else:
            values = np.frombuffer(ids, dtype=np.int64)
            starts = np.flatnonzero(np.diff(values) != 1) + 1
            bounds = np.concatenate(([0], starts, [n]))
            self.add_runs(values[bounds[:-1]].tolist(), np.diff(bounds).tolist())

    def runs(self, lo: int, hi: int) -> Iterator[tuple[int, int]]:
        """(first id, count) of the runs covering positions [lo, hi), cut to that window."""
        if lo >= hi:
            return
        ends, firsts = self.ends, self.firsts
        r = bisect_right(ends, lo)
        start = ends[r - 1] if r else 0
        while start < hi:
            end = ends[r]
            a, b = max(lo, start), min(hi, end)
            yield firsts[r] + a - start, b - a
            start = end
            r += 1

    def at(self, position: int) -> int:
        r = bisect_right(self.ends, position)
        return self.firsts[r] + position - (self.ends[r - 1] if r else 0)


class HashIds(Sequence[int]):
    """The ids at positions [lo, hi) of a shared chain: read-only and tuple-like (see the module doc)."""

    __slots__ = ("_chain", "_lo", "_hi")

    def __init__(self, chain: _Chain, lo: int, hi: int) -> None:
        self._chain = chain
        self._lo = lo
        self._hi = hi

    # ---- making ---------------------------------------------------------------------------------

    @classmethod
    def of(cls, ids: Union[Sequence[int], "HashIds"]) -> HashIds:
        """A view of a new chain holding `ids` (ints in [0, 2**63), bools refused); `BadHashId` otherwise."""
        if isinstance(ids, HashIds):
            return ids
        chain = _Chain()
        chain.add_ids(checked(ids))
        return cls(chain, 0, len(chain))

    @classmethod
    def run(cls, first: int, count: int) -> HashIds:
        """The `count` consecutive ids from `first`."""
        chain = _Chain()
        chain.add_run(first, count)
        return cls(chain, 0, count)

    def extend(self, keep: int, ids: Union[Sequence[int], HashIds, range] = ()) -> HashIds:
        """The ids of a prompt that starts with this one's first `keep` ids and goes on with `ids`.

        It shares this view's chain when it continues it where the chain ends; else it starts a new chain
        from a copy of the kept runs (a few entries when ids are consecutive)."""
        keep = max(0, min(keep, len(self)))
        chain = self._chain
        if not (self._lo == 0 and keep == self._hi == len(chain)):
            new = _Chain()
            for first, count in chain.runs(self._lo, self._lo + keep):
                new.add_run(first, count)
            chain = new
        if isinstance(ids, range) and ids.step == 1:
            chain.add_run(ids.start, len(ids))
        elif isinstance(ids, HashIds):
            for first, count in ids.runs():
                chain.add_run(first, count)
        else:
            chain.add_ids(checked(ids))
        return HashIds(chain, 0, len(chain))

    # ---- reading --------------------------------------------------------------------------------

    def runs(self) -> Iterator[tuple[int, int]]:
        """(first id, count) of each run of consecutive ids, in order."""
        return self._chain.runs(self._lo, self._hi)

    def __len__(self) -> int:
        return self._hi - self._lo

    def __bool__(self) -> bool:
        return self._hi > self._lo

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> Union[HashIds, tuple[int, ...]]: ...

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._hi - self._lo)
            if step != 1:
                return tuple(self)[index]
            stop = max(start, stop)
            return HashIds(self._chain, self._lo + start, self._lo + stop)
        n = self._hi - self._lo
        i = index.__index__()
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("hash id index out of range")
        return self._chain.at(self._lo + i)

    def __iter__(self) -> Iterator[int]:
        runs = list(self._chain.runs(self._lo, self._hi))
        if len(runs) == 1:
            first, count = runs[0]
            return iter(range(first, first + count))
        return itertools.chain.from_iterable(range(first, first + count) for first, count in runs)

    def __reversed__(self) -> Iterator[int]:
        return reversed(tuple(self))

    def __contains__(self, value: object) -> bool:
        if type(value) is not int:
            return any(value == x for x in self)
        return any(first <= value < first + count for first, count in self.runs())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, HashIds):
            if len(other) != len(self):
                return False
            if other._chain is self._chain and other._lo == self._lo:
                return True
            return _common_runs(self.runs(), other.runs(), len(self)) == len(self)  # runs may be cut differently
        if isinstance(other, tuple):
            return len(other) == len(self) and tuple(self) == other
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __lt__(self, other: object) -> bool:
        return tuple(self) < _as_tuple(other)

    def __le__(self, other: object) -> bool:
        return tuple(self) <= _as_tuple(other)

    def __gt__(self, other: object) -> bool:
        return tuple(self) > _as_tuple(other)

    def __ge__(self, other: object) -> bool:
        return tuple(self) >= _as_tuple(other)

    def __add__(self, other: object) -> tuple[int, ...]:
        if isinstance(other, (tuple, HashIds)):
            return tuple(self) + tuple(other)
        return NotImplemented

    def __radd__(self, other: object) -> tuple[int, ...]:
        if isinstance(other, tuple):
            return other + tuple(self)
        return NotImplemented

    def __repr__(self) -> str:
        return f"HashIds({tuple(self)!r})" if len(self) <= 16 else f"HashIds(<{len(self)} ids, {self[0]}...>)"

    def __getstate__(self) -> tuple[_Chain, int, int]:
        return self._chain, self._lo, self._hi  # pickled with its chain: one copy for all the views of it

    def __setstate__(self, state: tuple[_Chain, int, int]) -> None:
        self._chain, self._lo, self._hi = state

    @classmethod
    def from_runs(cls, runs: Iterable[tuple[int, int]]) -> HashIds:
        """A view of a new chain made of (first id, count) runs (ids must be in [0, 2**63): not checked)."""
        chain = _Chain()
        for first, count in runs:
            chain.add_run(first, count)
        return cls(chain, 0, len(chain))

    def max(self) -> int:
        """The largest id (ValueError when empty), from the runs: no id is visited."""
        return max(first + count - 1 for first, count in self.runs())

    def shifted(self, offset: int, cache: dict) -> HashIds:
        """These ids plus `offset`, modulo 2**63 (a run that wraps is cut in two). Views of one chain map to
        views of one shifted chain, kept in `cache` (a dict the caller holds while it shifts a workload)."""
        key = (id(self._chain), offset)
        found = cache.get(key)
        if found is None or found[0] is not self._chain:
            new = _Chain()
            for first, count in self._chain.runs(0, len(self._chain)):
                start = (first + offset) % ID_LIMIT
                head = min(count, ID_LIMIT - start)
                new.add_run(start, head)
                new.add_run(0, count - head)
            found = cache[key] = (self._chain, new)
        return HashIds(found[1], self._lo, self._hi)

    def as_tuple(self, count: Optional[int] = None) -> tuple[int, ...]:
        """The ids (the first `count` of them, if given) as a tuple. The tuple of the whole chain is built once
        and kept for the `TUPLE_CACHE` chains made into one last, so the calls of a task cost a slice each
        (pointers copied) rather than ints made: the twin reads a task's calls one after the other."""
        chain = self._chain
        hi = self._hi if count is None else min(self._hi, self._lo + max(0, count))
        whole = chain.whole
        if whole is None or hi > len(whole):
            whole = chain.whole = tuple(itertools.chain.from_iterable(
                range(first, first + n) for first, n in chain.runs(0, len(chain))))
            _MADE.append(chain)
            if len(_MADE) > TUPLE_CACHE:
                _MADE.popleft().whole = None
        return whole if self._lo == 0 and hi == len(whole) else whole[self._lo:hi]

    def to_list(self) -> list[int]:
        """The ids as a list (what a file writes)."""
        return list(self)


_MADE: deque[_Chain] = deque()  # chains holding their tuple, oldest first


def as_tuple(ids: Sequence[int], count: Optional[int] = None) -> tuple[int, ...]:
    """Any sequence of ids (its first `count`, if given) as a tuple: a tuple as it is (or its slice), a view
    through `HashIds.as_tuple` (one tuple per chain, kept for the chains used last)."""
    if type(ids) is tuple:
        return ids if count is None or count >= len(ids) else ids[:max(0, count)]
    if isinstance(ids, HashIds):
        return ids.as_tuple(count)
    return tuple(ids if count is None else ids[:max(0, count)])


def json_default(value: Any) -> Any:
    """For ``orjson.dumps(..., default=json_default)``: a view is written as the list of its ids (as a tuple
    would be), so a workload's JSON is the same whichever form its calls' ids have."""
    if isinstance(value, HashIds):
        return value.as_tuple()  # the chain's tuple, built once: a slice of it rather than ints made
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _as_tuple(other: object) -> tuple:
    if isinstance(other, (tuple, HashIds)):
        return tuple(other)
    raise TypeError(f"cannot order hash ids and {type(other).__name__}")


class BadHashId(ValueError):
    """A value that is not a hash id; `index` is its position in the list checked (None: unknown)."""

    def __init__(self, message: str, index: Optional[int] = None) -> None:
        super().__init__(message)
        self.index = index


def checked(ids: Iterable[Any]) -> array:
    """`ids` as an ``array('q')`` after checking each is an int (not a bool) in [0, 2**63); `BadHashId` naming
    the first bad one otherwise."""
    if isinstance(ids, array) and ids.typecode == "q":
        values = ids
    else:
        if not isinstance(ids, (list, tuple)):
            ids = list(ids)
        try:
            values = array("q", ids)
        except (TypeError, OverflowError):
            raise _first_bad(ids) from None
    n = len(values)
    if n:
        small = n < _SHORT
        lowest = min(values) if small else int(np.frombuffer(values, dtype=np.int64).min())
        if lowest < 0:
            raise _first_bad(ids)
        # array('q') took bools as 0 and 1: look at the items equal to 0 or 1, if any
        if lowest <= 1 and values is not ids:
            where = [i for i, x in enumerate(values) if x <= 1] if small else \
                np.flatnonzero(np.frombuffer(values, dtype=np.int64) <= 1).tolist()
            if any(type(ids[i]) is bool for i in where):
                raise _first_bad(ids)
    return values


def _first_bad(ids: Sequence[Any]) -> BadHashId:
    for i, value in enumerate(ids):
        if type(value) is not int or not 0 <= value < ID_LIMIT:
            return BadHashId(f"hash ids must be integers in [0, 2**63), item {i} is {value!r:.40}", i)
    return BadHashId("hash ids must be integers in [0, 2**63)")


def share_calls(keeps: Sequence[int], lists: Sequence[list]) -> list[Union[HashIds, tuple[()]]]:
    """Views of the hash ids of a task's calls as a file gives them: call i starts with the first
    ``keeps[i]`` ids of call i-1 (``keeps[0]`` is 0; each at most the previous call's length, which the
    caller checked) and goes on with ``lists[i]``. Calls that extend the previous call whole share its
    chain. The ids of the whole task are checked and cut into runs at once, in numpy (a few calls a task,
    not a call). A bad id raises `BadHashId` whose `index` is (call, position in its list)."""
    values = array("q")
    try:
        for ids in lists:
            values.fromlist(ids)  # C speed; a value that is no int, or is beyond 64 bits, raises
    except (TypeError, OverflowError):
        values = None
    lengths = [len(ids) for ids in lists]
    starts = list(itertools.accumulate(lengths, initial=0))
    total = starts[-1]
    if not total:
        return [()] * len(lists)
    v = None if values is None else np.frombuffer(values, dtype=np.int64)
    # refused: a negative id, or a bool (fromlist took it as 0 or 1)
    if v is None or v.min() < 0 or (v.min() <= 1 and any(
            type(lists[call][position]) is bool for call, position in _positions(np.flatnonzero(v <= 1), starts))):
        flat = list(itertools.chain.from_iterable(lists))
        bad = _first_bad(flat)
        call, position = next(iter(_positions([bad.index or 0], starts)))
        raise BadHashId(str(bad).replace(f"item {bad.index}", f"item {position}"), (call, position))
    # segments: runs of calls each extending the previous call whole, so sharing one chain
    view_ends: list[int] = []
    segments: list[int] = []  # first call of each segment
    offsets: list[int] = []  # where each segment's own ids start in `flat`
    length = -1
    for i, keep in enumerate(keeps):
        if keep != length:
            segments.append(i)
            offsets.append(starts[i])
        length = starts[i + 1] - starts[i] + keep
        view_ends.append(length)
    breaks = np.flatnonzero(v[1:] - v[:-1] != 1)
    breaks += 1
    cuts = np.union1d(breaks, offsets + [total]) if len(segments) > 1 or len(breaks) else np.asarray([0, total])
    run_firsts = v[cuts[:-1]]
    run_ends = cuts[1:]
    bounds = np.searchsorted(cuts, offsets).tolist() + [len(cuts) - 1]
    segments.append(len(keeps))
    out: list[Union[HashIds, tuple[()]]] = []
    chain: Optional[_Chain] = None
    for k, offset in enumerate(offsets):
        new = _Chain()
        keep = keeps[segments[k]]
        if chain is not None and keep:
            for first, count in chain.runs(0, keep):
                new.add_run(first, count)
        lo, hi = bounds[k], bounds[k + 1]
        if hi > lo:
            new.firsts.frombytes(run_firsts[lo:hi].tobytes())
            new.ends.frombytes((run_ends[lo:hi] - (offset - len(new))).tobytes())
        chain = new
        out.extend([HashIds(chain, 0, end) if end else () for end in view_ends[segments[k]:segments[k + 1]]])
    return out


def _positions(flat_indexes: Iterable[int], starts: list[int]) -> Iterator[tuple[int, int]]:
    """(call, position in its list) of indexes into the calls' lists laid end to end."""
    for index in flat_indexes:
        call = bisect_right(starts, int(index)) - 1
        yield call, int(index) - starts[call]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids `a` and `b` share. Two views of one chain from the same start share the shorter
    one whole; views compare run by run; tuples compare in C (one slice when one extends the other, else a
    binary search over the window still in doubt)."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    if isinstance(a, HashIds) and isinstance(b, HashIds):
        if a._chain is b._chain and a._lo == b._lo:
            return n
        return _common_runs(a.runs(), b.runs(), n)
    if isinstance(a, HashIds) or isinstance(b, HashIds):
        a, b = tuple(a[:n]), tuple(b[:n])
    if (a if len(a) == n else a[:n]) == (b if len(b) == n else b[:n]):
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _common_runs(a: Iterator[tuple[int, int]], b: Iterator[tuple[int, int]], limit: int) -> int:
    shared = 0
    ra: Optional[tuple[int, int]] = next(a, None)
    rb: Optional[tuple[int, int]] = next(b, None)
    while ra is not None and rb is not None and shared < limit:
        if ra[0] != rb[0]:
            return shared
        step = min(ra[1], rb[1])
        shared += step
        ra = (ra[0] + step, ra[1] - step) if ra[1] > step else next(a, None)
        rb = (rb[0] + step, rb[1] - step) if rb[1] > step else next(b, None)
    return min(shared, limit)
