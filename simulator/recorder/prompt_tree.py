"""The live prompts of the recorder's task grouping, as a radix tree over their chained block ids.

Each holder (a chain of calls in `simulator.recorder.grouping`) has one prompt in the tree: its last
call's block ids. A node is a run of ids that every prompt through it shares, ``src[start:start + n]``
of some prompt holding it; its children start where it ends, keyed by their first id. Prompts branch
where they differ, runs that no prompt passes any more are dropped, and a run left with one child and
no prompt ending at it is joined to that child, so a prompt's path has one node per point where live
prompts branch off it, however long it is and however many calls grew it.

Ids must be chained (id k stands for all tokens up to block k's end): two prompts agree on their first
n ids exactly when they agree on id n-1, so one comparison tells whether a run is shared and a binary
search where it stops being.

Each run remembers its owner, the group (a task) whose prompts laid it down, or `MIXED` once prompts of
two groups passed it: a prefix that two tasks share is no evidence that a prompt belongs to either. A
run can also be marked suspect: one group alone passed it, but it may be common all the same.
"""

from __future__ import annotations

from typing import Any, Hashable, Iterable, Optional, Sequence

MIXED = object()
"""The owner of a run that prompts of several groups passed."""


def agree(a: Sequence[int], b: Sequence[int], lo: int, hi: int) -> int:
    """How many leading ids chained sequences `a` and `b` share, knowing they share `lo` and at most `hi`."""
    if hi <= lo or a[hi - 1] == b[hi - 1]:
        return max(lo, hi)
    while hi - lo > 1:  # a[:lo] == b[:lo], a[hi - 1] != b[hi - 1]
        mid = (lo + hi) // 2
        if a[mid - 1] == b[mid - 1]:
            lo = mid
        else:
            hi = mid
    return lo


class Node:
    """A run of block ids that the live prompts through it share: ``src[start:start + n]``."""

    __slots__ = ("parent", "src", "start", "n", "children", "ends", "ref", "owner", "suspect", "hint")

    def __init__(self, parent: Optional[Node], src: Sequence[int], start: int, n: int, owner: Any) -> None:
        self.parent = parent
        self.src = src
        """A prompt that holds the run (a prompt through a node holds every run above it too)."""
        self.start = start
        self.n = n
        self.children: dict[int, Node] = {}
        self.ends: set = set()
        """Holders whose prompt ends here."""
        self.ref = 0
        """Holders whose prompt passes through here."""
        self.owner = owner
        """The group whose prompts laid the run down, or `MIXED`."""
        self.suspect = False
        """Whether a prompt branched off it below its group's first prompt (see `suspect`)."""
        self.hint: Any = None
        """The holder whose prompt came through last (it may have moved on since)."""

    @property
    def end(self) -> int:
        return self.start + self.n


class PromptTree:
    """One prompt per holder, in a radix tree (see the module docstring)."""

    def __init__(self) -> None:
        self.root = Node(None, (), 0, 0, MIXED)
        self.prompts: dict[Hashable, Sequence[int]] = {}
        """Each holder's prompt."""

    def walk(self, prompt: Sequence[int]) -> tuple[int, Node]:
        """(leading ids `prompt` shares with the live prompts, the node holding the last of them: the
        root when none)."""
        node, depth, size = self.root, 0, len(prompt)
        while depth < size:
            child = node.children.get(prompt[depth])
            if child is None:
                break
            reached = agree(prompt, child.src, depth + 1, min(child.end, size))
            node, depth = child, reached
            if reached < child.end:
                break
        return depth, node

    def owner_at(self, prompt: Sequence[int], depth: int) -> Any:
        """The owner of the run holding id `depth - 1` of `prompt` (which a live prompt holds)."""
        node = self.root
        while True:
            node = node.children[prompt[node.end]]
            if depth <= node.end:
                return node.owner

    def holder_through(self, node: Node, prompt: Sequence[int], depth: int) -> Any:
        """A holder whose prompt has `prompt`'s first `depth` ids, found from `node` (the node `walk`
        returned for them): the last one that came through, else any."""
        while True:
            hint = node.hint
            held = self.prompts.get(hint)
            if held is not None and len(held) >= depth and held[depth - 1] == prompt[depth - 1]:
                return hint
            if node.ends:
                return next(iter(node.ends))
            node = next(iter(node.children.values()))

    def path(self, prompt: Sequence[int]) -> list[Node]:
        """The runs a live prompt passes, from the top down."""
        nodes, node = [], self.root
        while node.end < len(prompt):
            node = node.children[prompt[node.end]]
            nodes.append(node)
        return nodes

    def put(self, holder: Hashable, prompt: Sequence[int], owner: Any) -> None:
        """`holder`'s prompt is now `prompt` (none when empty), laid down for group `owner`."""
        old = self.prompts.pop(holder, ())
        if prompt:
            self._insert(prompt, holder, owner)  # first, so that the runs both pass stay (and keep their marks)
            self.prompts[holder] = prompt
        if old:
            self._remove(old, holder, still_ends=len(old) == len(prompt) and old[-1] == prompt[-1])

    def drop(self, holder: Hashable) -> None:
        """`holder` and its prompt leave the tree."""
        old = self.prompts.pop(holder, ())
        if old:
            self._remove(old, holder)

    def reown(self, moved: Iterable[Hashable], old: Any, new: Any) -> None:
        """Holders `moved` left group `old` for `new`: the runs of theirs that `old` owned are `new`'s, or
        `MIXED` where a prompt of another holder passes too."""
        passes: dict[Node, int] = {}
        for holder in moved:
            for node in self.path(self.prompts.get(holder, ())):
                if node.owner is old:
                    passes[node] = passes.get(node, 0) + 1
        for node, count in passes.items():
            node.owner = new if count == node.ref else MIXED

    def suspect(self, prompt: Sequence[int], depth: int) -> None:
        """Mark the runs of live `prompt`'s first `depth` ids suspect: a prefix that may be common to
        groups (a system prompt) though one group alone has passed it yet."""
        node = self.root
        while node.end < depth:
            node = node.children[prompt[node.end]]
            if node.end > depth:
                node = self._split(node, depth)
            node.suspect = True

    def _insert(self, prompt: Sequence[int], holder: Hashable, owner: Any) -> None:
        node, depth, size = self.root, 0, len(prompt)
        node.ref += 1
        while depth < size:
            child = node.children.get(prompt[depth])
            if child is None:
                child = Node(node, prompt, depth, size - depth, owner)
                node.children[prompt[depth]] = child
                depth = size
            else:
                reached = agree(prompt, child.src, depth + 1, min(child.end, size))
                if reached < child.end:
                    child = self._split(child, reached)
                depth = reached
            node = child
            node.ref += 1
            node.hint = holder
            if node.owner is not owner:
                node.owner = MIXED
        node.ends.add(holder)

    @staticmethod
    def _split(node: Node, at: int) -> Node:
        """Cut `node` at depth `at`; returns the upper part (the lower part keeps its children and ends)."""
        upper = Node(node.parent, node.src, node.start, at - node.start, node.owner)
        upper.suspect = node.suspect
        upper.ref = node.ref
        upper.hint = node.hint
        node.parent.children[node.src[node.start]] = upper
        upper.children[node.src[at]] = node
        node.parent = upper
        node.n -= at - node.start
        node.start = at
        return upper

    def _remove(self, prompt: Sequence[int], holder: Hashable, still_ends: bool = False) -> None:
        node = self.root
        node.ref -= 1
        while node.end < len(prompt):
            node = node.children[prompt[node.end]]
            node.ref -= 1
            if node.ref == 0:  # no other prompt passes: the rest of the path goes with it
                del node.parent.children[node.src[node.start]]
                self._merge(node.parent)
                return
        if not still_ends:  # (its new prompt is the same)
            node.ends.discard(holder)
        self._merge(node)

    def _merge(self, node: Node) -> None:
        """Join `node` with its only child when no prompt ends at it and both are alike."""
        if node is self.root or node.ends or len(node.children) != 1:
            return
        first, child = node.children.popitem()  # (a dict that lost many children would be slow to iterate)
        if child.owner is not node.owner or child.suspect != node.suspect:
            node.children = {first: child}
            return
        node.src = child.src
        node.n += child.n
        node.children = child.children
        for grandchild in node.children.values():
            grandchild.parent = node
        node.ends = child.ends
        node.hint = child.hint
