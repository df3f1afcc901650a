"""Which agent task each recorded call belongs to, decided when the call arrives.

A task is a tree of sequential chains of calls: its main chain and the chains of the sub-agents it
spawned. A chain takes a new call only while none of its calls is in flight. `TaskGrouper.place` puts an
arriving call by the first rule that holds:

1. ``extends``: its prompt extends a waiting chain's last prompt: it holds all of that prompt's blocks
   but at most the last `tolerance` (a replay fills the end of a prompt after its last full trace block
   with fresh tokens; chat templates rewrite the last tokens of a turn). The longest such prompt wins; on
   a tie, the chain whose call ended last.
2. ``prefix``: its prompt shares a prefix with a chain's last prompt (the chain waiting, or in flight:
   calls sent in parallel). If the chain waits and the call came later than `spawn_window` after its
   last end, or holds little beyond that prefix, the call continues the chain (its context was cut back
   or rewritten); otherwise it starts a sub-task of the chain, after the chain's last ended call.
3. ``timing``: it arrives within `spawn_window` after a waiting chain's last call ended: a sub-agent of
   the chain whose call ended last. A guess, checked later (below).
4. ``new``: a new top-level task.

A prefix that prompts of two tasks share (a system prompt, tool definitions) is no evidence for rules 1
and 2: `simulator.recorder.prompt_tree` keeps, for every run of the live prompts, the task that laid it
down or that several did. Before a second task has come, such a prefix looks like the first task's own;
so a prompt that shares with a task less than that task's first prompt (less `tolerance`) forks a
sub-task there only once: the shared run is suspect from then on (a waiting chain may still be continued
from it: a context cut back again to the same point).

A sub-agent's parent waits for it (an agent reads a sub-agent's result before going on), so timing's
guess is wrong when the parent sends its next call while the sub-task still runs (a call in flight then,
or one more call after). The sub-task then moves to the next chain whose call ended within the window
before its first call and that has sent nothing since, else it becomes a task of its own. When the chain
it hangs under sends no more calls (it is forgotten, or the recording closes: `close`), it moves to a
candidate that sent its next call only after the sub-task's last one, else it becomes a task. Each move
is a revision: the sub-task's first call placed again (`revisions`).

With a grouping key (a session header's value, a W3C trace id), calls with the same key are one task:
the rules choose among its chains only, a call that none of them places starts a sub-task of the chain
that ended last (``key``), and nothing is revised. A call whose key is new starts a task.

Block ids must be chained (`simulator.recorder.block_hash`). Placing a call costs a walk down the prompt
tree (one step per point where live prompts branch off its path), `2 * tolerance + 2` dictionary
look-ups and a few binary searches, plus copying the ids (and, for a call that extends no live chain,
one look-up per id among the compacted chains): nothing grows with the number of live chains. A
chain that waits `compact_after` seconds leaves the prompt tree and keeps only its anchor id (rule 1
still finds a prompt extending it); after `idle_timeout` it is forgotten, with its task once that has no
chain left. Memory so follows the recently active chains (their last prompts: 44 bytes an id given as
Python ints, 8 given as a numpy array), not the recording's length.

Task ids: ``t12`` for a top-level task, ``t12/s3`` for the third sub-task put in task ``t12``. An id names
the task its chain was first put in and never changes (a sub-task that a revision makes a task keeps its
id, and its later sub-tasks are named after a new task number): the tree is given by the parents of the
sub-tasks' first calls, as revised, not by the ids.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np

from .prompt_tree import MIXED, PromptTree, agree

DEFAULT_SPAWN_WINDOW = 0.05
"""Seconds after a call's end within which a call that no prompt rule places is taken for a sub-agent
of it (rule 3). `benchmarks/recorder_grouping.py`: a replay's sub-agents come 2-10 ms after their
parent's call ended (the client's lag); 0.05 s finds 94-99% of them at 100-240 calls a second, 0.01 s
only 61% at a 10 ms lag, and wider windows make more wrong guesses to correct."""
DEFAULT_IDLE_TIMEOUT = 86400.0
"""Seconds a chain may wait for its next call before it is forgotten."""
DEFAULT_COMPACT_AFTER = 1800.0
"""Seconds a chain waits before its prompt leaves the prompt tree; only its anchor id stays."""
DEFAULT_TOLERANCE = 8
"""Blocks at the end of a chain's last prompt that a prompt extending it may differ in."""
MAX_CANDIDATES = 32
"""Most chains a timing guess keeps as other possible parents."""

EVIDENCE = ("key", "extends", "prefix", "timing", "new")
"""Every value `Placement.evidence` takes."""

Ids = Union[array, tuple]


def _compact_ids(hash_ids: Sequence[int]) -> Ids:
    """The ids as a chain keeps them: a numpy array's as 8 bytes each (cheap from its buffer), others as a
    tuple (cheap to make; with the ints it holds, 44 bytes an id)."""
    if isinstance(hash_ids, (tuple, array)):
        return hash_ids
    if isinstance(hash_ids, np.ndarray):
        return array("q", hash_ids.astype(np.int64, copy=False).tobytes())
    return tuple(hash_ids)


@dataclass(frozen=True)
class Placement:
    """Where a call goes."""

    task: str
    """The (sub-)task the call joins: ``t12`` (a top-level task) or ``t12/s3`` (a sub-task)."""
    index: int
    """The call's position in that (sub-)task, 0 for its first."""
    parent: Optional[str] = None
    """On a sub-task's first call: the (sub-)task that spawned it."""
    after_call: Optional[int] = None
    """On a sub-task's first call: the parent's call after whose end it started (-1: before any ended)."""
    evidence: str = "new"
    """Why it went there: one of `EVIDENCE`."""


class _Task:
    """A top-level task: the chains it holds."""

    __slots__ = ("id", "key", "chains", "subs")

    def __init__(self, task_id: str, key: Optional[str]) -> None:
        self.id = task_id
        self.key = key
        self.chains: set[_Chain] = set()
        self.subs = 0


_End = tuple  # (end time, chain, call index): a call's end, as rule 3 remembers it


class _Chain:
    """A sequential chain of calls: a task's main chain or a sub-task."""

    __slots__ = ("id", "task", "parent", "children", "calls", "in_flight", "ended", "last_end", "prompt", "anchor",
                 "anchor_id", "size", "compact", "base", "cut", "alive", "candidates", "went_on", "watchers")

    def __init__(self, chain_id: str, task: _Task, parent: Optional[_Chain], base: int) -> None:
        self.id = chain_id
        self.task = task
        self.parent = parent
        self.children: list[_Chain] = []
        self.calls = 0
        self.in_flight: Optional[int] = None
        """Index of its call in flight, if any."""
        self.ended = -1
        """Index of its last call that ended (not failed); -1 before any."""
        self.last_end = 0.0
        self.prompt: Ids = ()
        """Block ids of its last call's prompt."""
        self.anchor = -1
        """Position in its last prompt of the id a prompt extending it must hold (-1: none)."""
        self.anchor_id = 0
        """That id."""
        self.size = 0
        """Blocks of its last prompt."""
        self.compact = False
        """Whether it has waited so long that only its anchor is kept (`prompt` is empty then)."""
        self.base = base
        """Blocks of its task's first prompt (a sub-task's own, unless it shares its parent's): a prompt
        sharing fewer with it (less `tolerance`) may share no more than another task could."""
        self.cut = -1
        """Blocks it kept when its context was last cut back below its task's first prompt (-1: never)."""
        self.alive = True
        self.candidates: list[_End] = []
        """Placed by timing: the ends within the window before its first call, latest first (its
        parent's among them): where it may hang."""
        self.went_on: Optional[set[_End]] = None
        """Candidates whose chain sent its next call while this one waited between calls: right if
        this one sends no more."""
        self.watchers: list[_Chain] = []
        """Chains placed by timing that have this chain among their candidates."""


class TaskGrouper:
    """Puts recorded calls into tasks as they arrive (see the module docstring).

    `place` is called at a call's arrival, then `end` or `failed` with the task and index it returned;
    `revisions` after each call, and `close` when the recording ends. Times are seconds on one monotonic
    clock, arrivals in non-decreasing order."""

    def __init__(self, spawn_window: float = DEFAULT_SPAWN_WINDOW, idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
                 tolerance: int = DEFAULT_TOLERANCE, compact_after: float = DEFAULT_COMPACT_AFTER) -> None:
        if spawn_window < 0 or idle_timeout <= 0 or tolerance < 0 or compact_after <= 0:
            raise ValueError("spawn_window and tolerance must be >= 0, idle_timeout and compact_after > 0")
        self.spawn_window = spawn_window
        self.idle_timeout = idle_timeout
        self.tolerance = tolerance
        self.compact_after = min(compact_after, idle_timeout)
        self._tree = PromptTree()
        self._chains: dict[str, _Chain] = {}
        self._anchors: dict[int, list[_Chain]] = {}
        self._keys: dict[str, _Task] = {}
        self._waiting: OrderedDict[_Chain, None] = OrderedDict()
        """Chains with no call in flight and their prompt in the tree, in the order their last call ended."""
        self._compacted: OrderedDict[_Chain, None] = OrderedDict()
        """Chains kept by their anchor only, in the same order."""
        self._compact_anchors: dict[int, list[_Chain]] = {}
        self._ends: deque[tuple[float, _Chain, int]] = deque()
        """Recent ends (time, chain, call index), oldest first, for rule 3."""
        self._tasks = 0
        self._revised: list[Placement] = []

    @property
    def live_chains(self) -> int:
        """Chains held now (in flight or waiting, with their prompt or compacted)."""
        return len(self._chains)

    @property
    def held_prompts(self) -> int:
        """Chains whose last prompt is held in full."""
        return len(self._tree.prompts)

    # -- the calls' life -----------------------------------------------------------------------------

    def place(self, t: float, key: Optional[str], hash_ids: Sequence[int]) -> Placement:
        """The (sub-)task a call arriving at `t` joins, from its grouping `key` (None: none) and its
        prompt's chained block ids."""
        self._forget(t)
        prompt = _compact_ids(hash_ids)
        task = self._keys.get(key) if key is not None else None
        if key is not None and task is None:
            return self._start_task(prompt, key)
        depth, node = self._tree.walk(prompt)
        chain = self._extended(prompt, depth, task)
        if chain is None and self._compacted:
            chain = self._compacted_extended(prompt, depth, task)
        if chain is not None:
            return self._join(chain, prompt, "extends")
        parent = self._sharing(prompt, depth, node, task)
        if parent is not None:
            placement = self._branch(t, parent, prompt, depth, task, node.suspect)
            if placement is not None:
                return placement
        spawners = self._spawners(t, task)
        if spawners:
            placement = self._start_sub(spawners[0][1], prompt, "timing", len(prompt))
            if task is None:
                self._guess(self._chains[placement.task], spawners)
            return placement
        if task is not None:
            return self._start_sub(self._latest_of(task), prompt, "key", len(prompt))
        return self._start_task(prompt, None)

    def end(self, task: str, index: int, t_end: float, output_tokens: int = 0) -> None:
        """Call `index` of (sub-)task `task` ended at `t_end`. (`output_tokens` is not needed: the rules
        read the prompts' blocks and the times only.)"""
        chain = self._chains.get(task)
        if chain is None or chain.in_flight != index:
            return
        chain.ended = index
        self._free(chain, t_end)
        self._ends.append((t_end, chain, index))

    def failed(self, task: str, index: int, t_end: float) -> None:
        """Call `index` of `task` failed at `t_end`: its chain takes the next call (a retry extends it)."""
        chain = self._chains.get(task)
        if chain is not None and chain.in_flight == index:
            self._free(chain, t_end)

    def close(self) -> None:
        """The recording ends: every timing guess whose parent has sent no call since is settled (see the
        module docstring); `revisions` then says what changed."""
        for chain in list(self._chains.values()):
            self._settle_under(chain)

    def revisions(self) -> list[Placement]:
        """Placements corrected since the last call, each the new placement of a sub-task's first call
        (same task id): under another parent, or a top-level task (no parent). It holds for every call
        of that sub-task and of the sub-tasks under it, recorded or still to come."""
        revised, self._revised = self._revised, []
        return revised

    # -- the rules -------------------------------------------------------------------------------------

    def _extended(self, prompt: Ids, depth: int, task: Optional[_Task]) -> Optional[_Chain]:
        """Rule 1: the waiting chain whose last prompt `prompt` extends, longest first, then latest ended.

        A chain is registered under its anchor, the id `tolerance` blocks before its prompt's end; a
        prompt extends it only if it holds that id. The anchor lies within `2 * tolerance + 2` blocks
        below `depth` (the most blocks `prompt` shares with any live prompt), unless another live prompt
        shares far more with `prompt` than the chain does: then that one explains it better."""
        best: Optional[_Chain] = None
        for pos in range(depth - 1, max(0, depth - 2 * self.tolerance - 2) - 1, -1):
            for chain in self._anchors.get(prompt[pos], ()):
                if chain.anchor != pos or chain.in_flight is not None or (task is not None and chain.task is not task):
                    continue
                size = len(chain.prompt)
                if best is not None and (size, chain.last_end) <= (len(best.prompt), best.last_end):
                    continue
                shared = agree(prompt, chain.prompt, pos + 1, min(size, len(prompt)))
                if shared < size - self.tolerance:
                    continue
                if task is None and self._tree.owner_at(prompt, shared) is MIXED:
                    continue  # blocks that other tasks' prompts hold too: no evidence
                best = chain
        return best

    def _compacted_extended(self, prompt: Ids, depth: int, task: Optional[_Task]) -> Optional[_Chain]:
        """Rule 1 for chains kept by their anchor only: a look-up for each id of `prompt` (only for a call
        that extends no live chain: a task's or a sub-agent's first call, a call after a long wait, one
        whose context was rewritten)."""
        best: Optional[_Chain] = None
        anchors = self._compact_anchors
        if anchors.keys().isdisjoint(prompt):
            return None
        for anchor_id in anchors.keys() & frozenset(prompt):
            for chain in anchors[anchor_id]:
                pos = chain.anchor
                if pos >= len(prompt) or prompt[pos] != anchor_id or (task is not None and chain.task is not task):
                    continue
                if best is not None and (chain.size, chain.last_end) <= (best.size, best.last_end):
                    continue
                if task is None and depth > pos and self._tree.owner_at(prompt, pos + 1) is MIXED:
                    continue
                best = chain
        return best

    def _sharing(self, prompt: Ids, depth: int, node, task: Optional[_Task]) -> Optional[_Chain]:
        """Rule 2: a chain whose prompt shares `depth` blocks with `prompt`, if no other task's prompt holds
        them."""
        if depth == 0 or node.owner is MIXED or (task is not None and node.owner is not task):
            return None
        return self._tree.holder_through(node, prompt, depth)

    def _branch(self, t: float, parent: _Chain, prompt: Ids, depth: int, task: Optional[_Task],
                suspect: bool) -> Optional[Placement]:
        """Rule 2's placement: `prompt` continues `parent` (which waits, and the call came later than a
        sub-agent would, or holds little beyond the shared `depth` blocks), else starts a sub-task of it.
        Sharing less than the parent's task's first prompt makes the shared run suspect; a suspect run
        takes no sub-task, and continues only a chain cut back there before (None otherwise)."""
        shallow = depth < parent.base - self.tolerance
        if parent.in_flight is None and (t - parent.last_end > self.spawn_window
                                         or depth >= len(prompt) - self.tolerance):
            if suspect and depth > parent.cut + self.tolerance:
                return None
            placement = self._join(parent, prompt, "prefix")
            if shallow:
                parent.cut = depth
        elif suspect:
            return None
        else:
            placement = self._start_sub(parent, prompt, "prefix", parent.base)
        if shallow:
            self._tree.suspect(prompt, depth)
        return placement

    def _spawners(self, t: float, task: Optional[_Task]) -> list[_End]:
        """Rule 3: the ends of waiting chains' last calls within `spawn_window` before `t`, latest first."""
        ends = self._ends
        while ends and ends[0][0] < t - self.spawn_window:
            ends.popleft()
        found = []
        for entry in reversed(ends):
            t_end, chain, index = entry
            if (t_end <= t and chain.alive and chain.in_flight is None and chain.ended == index
                    and (task is None or chain.task is task)):
                found.append(entry)
                if len(found) == MAX_CANDIDATES:
                    break
        return found

    def _latest_of(self, task: _Task) -> _Chain:
        """The chain of `task` whose last call ended last, else one with a call in flight."""
        return max(task.chains, key=lambda chain: (chain.in_flight is None, chain.last_end))

    # -- placing -----------------------------------------------------------------------------------

    def _join(self, chain: _Chain, prompt: Ids, evidence: str) -> Placement:
        if chain.compact:
            self._expand(chain)
        if chain.went_on:
            self._sent_again(chain)
        if chain.watchers:
            self._went_on(chain)
        index = chain.calls
        self._send(chain, prompt, index)
        return Placement(chain.id, index, evidence=evidence)

    def _start_task(self, prompt: Ids, key: Optional[str]) -> Placement:
        task = self._new_task(key)
        chain = self._new_chain(task.id, task, None, len(prompt))
        self._send(chain, prompt, 0)
        return Placement(chain.id, 0)

    def _new_task(self, key: Optional[str]) -> _Task:
        self._tasks += 1
        task = _Task(f"t{self._tasks}", key)
        if key is not None:
            self._keys[key] = task
        return task

    def _start_sub(self, parent: _Chain, prompt: Ids, evidence: str, base: int) -> Placement:
        parent.task.subs += 1
        chain = self._new_chain(f"{parent.task.id}/s{parent.task.subs}", parent.task, parent, base)
        parent.children.append(chain)
        self._send(chain, prompt, 0)
        return Placement(chain.id, 0, parent=parent.id, after_call=parent.ended, evidence=evidence)

    def _new_chain(self, chain_id: str, task: _Task, parent: Optional[_Chain], base: int) -> _Chain:
        chain = _Chain(chain_id, task, parent, base)
        self._chains[chain_id] = chain
        task.chains.add(chain)
        return chain

    def _send(self, chain: _Chain, prompt: Ids, index: int) -> None:
        """`chain` takes call `index` with `prompt`: in flight, its last prompt now `prompt`."""
        chain.calls = index + 1
        chain.in_flight = index
        self._waiting.pop(chain, None)
        self._tree.put(chain, prompt, chain.task)
        self._unanchor(chain, self._anchors)
        chain.prompt = prompt
        chain.size = len(prompt)
        chain.anchor = -1
        if prompt:
            chain.anchor = max(len(prompt) - self.tolerance, 1) - 1
            chain.anchor_id = prompt[chain.anchor]
            self._anchors.setdefault(chain.anchor_id, []).append(chain)

    def _free(self, chain: _Chain, t_end: float) -> None:
        chain.in_flight = None
        chain.last_end = t_end
        self._waiting[chain] = None
        self._waiting.move_to_end(chain)

    # -- timing's guesses, checked ---------------------------------------------------------------------

    def _guess(self, chain: _Chain, spawners: list[_End]) -> None:
        chain.candidates = spawners
        for _, parent, _ in spawners:
            parent.watchers.append(chain)

    def _went_on(self, parent: _Chain) -> None:
        """`parent` sends its next call: a guessed sub-task that has a call in flight now was not waited
        for; one that waits between calls was, if it sends no more."""
        for chain in parent.watchers:
            if not chain.alive:
                continue
            for entry in chain.candidates:
                if entry[1] is parent and entry[2] == parent.calls - 1:
                    break
            else:
                continue
            if chain.in_flight is None:
                if chain.went_on is None:
                    chain.went_on = set()
                chain.went_on.add(entry)
            else:
                chain.candidates.remove(entry)
                if chain.parent is parent:
                    self._rehome(chain, running=True)
        parent.watchers = []

    def _sent_again(self, chain: _Chain) -> None:
        """A guessed sub-task sends another call: candidates that went on meanwhile were not its parent."""
        wrong, chain.went_on = chain.went_on, None
        chain.candidates = [entry for entry in chain.candidates if entry not in wrong]
        if any(entry[1] is chain.parent for entry in wrong):
            self._rehome(chain, running=True)

    def _settle_under(self, parent: _Chain) -> None:
        """`parent` will send no more calls: the guessed sub-tasks hanging under it, which it never went on
        from, move to a candidate that went on after them, else become tasks."""
        for chain in parent.watchers:
            if chain.alive and chain.parent is parent:
                chain.candidates = [entry for entry in chain.candidates if entry[1] is not parent]
                self._rehome(chain, running=False)
        parent.watchers = []

    def _rehome(self, chain: _Chain, running: bool) -> None:
        """`chain`'s guessed parent was wrong: hang it under the first candidate still possible (while it
        runs: one that has sent nothing since; once it is over: one that went on after it), else make it
        a task of its own. Either is a revision."""
        went_on = chain.went_on or ()
        for entry in chain.candidates:
            _, parent, index = entry
            possible = (parent.alive and parent.calls == index + 1 and parent.in_flight is None
                        if running else entry in went_on)
            if possible and not self._below(parent, chain):
                self._move(chain, parent, parent.task)
                self._revised.append(Placement(chain.id, 0, parent=parent.id, after_call=index, evidence="timing"))
                return
        chain.candidates = []
        chain.went_on = None
        self._move(chain, None, self._new_task(None))
        self._revised.append(Placement(chain.id, 0))

    @staticmethod
    def _below(chain: Optional[_Chain], top: _Chain) -> bool:
        """Whether `chain` is `top` or hangs under it."""
        while chain is not None:
            if chain is top:
                return True
            chain = chain.parent
        return False

    def _move(self, chain: _Chain, parent: Optional[_Chain], task: _Task) -> None:
        """Hang `chain`, with the chains under it, under `parent` in `task`."""
        if chain.parent is not None and chain in chain.parent.children:
            chain.parent.children.remove(chain)
        chain.parent = parent
        if parent is not None:
            parent.children.append(chain)
        old = chain.task
        if old is task:
            return
        moved, stack = [], [chain]
        while stack:
            below = stack.pop()
            moved.append(below)
            stack.extend(below.children)
        for below in moved:
            old.chains.discard(below)
            task.chains.add(below)
            below.task = task
        self._tree.reown(moved, old, task)

    # -- compacting and forgetting --------------------------------------------------------------------

    def _forget(self, now: float) -> None:
        """Compact the chains that have waited `compact_after`, forget those that have waited `idle_timeout`
        (and keyed tasks left without a chain)."""
        limit = now - self.compact_after
        while self._waiting:
            chain = next(iter(self._waiting))
            if chain.last_end >= limit:
                break
            del self._waiting[chain]
            self._tree.drop(chain)
            self._unanchor(chain, self._anchors)
            chain.prompt = ()
            chain.compact = True
            self._compacted[chain] = None
            if chain.anchor >= 0:
                self._compact_anchors.setdefault(chain.anchor_id, []).append(chain)
        limit = now - self.idle_timeout
        while self._compacted:
            chain = next(iter(self._compacted))
            if chain.last_end >= limit:
                break
            self._expand(chain)
            self._drop(chain)

    def _expand(self, chain: _Chain) -> None:
        """`chain` is no longer compacted (it takes a call, or is forgotten)."""
        del self._compacted[chain]
        self._unanchor(chain, self._compact_anchors)
        chain.compact = False

    def _drop(self, chain: _Chain) -> None:
        self._settle_under(chain)
        chain.alive = False
        del self._chains[chain.id]
        if chain.parent is not None and chain in chain.parent.children:
            chain.parent.children.remove(chain)
        chain.candidates = []
        chain.task.chains.discard(chain)
        if not chain.task.chains and chain.task.key is not None:
            self._keys.pop(chain.task.key, None)

    @staticmethod
    def _unanchor(chain: _Chain, anchors: dict[int, list[_Chain]]) -> None:
        if chain.anchor < 0:
            return
        anchored = anchors.get(chain.anchor_id)
        if anchored is not None and chain in anchored:
            anchored.remove(chain)
            if not anchored:
                del anchors[chain.anchor_id]
