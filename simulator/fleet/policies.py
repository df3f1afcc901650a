"""Router policies of the fleet twin: one small interface (`Policy`), the policies behind it, and a
registry by name, so a user adds a policy without touching the twin::

    from simulator.fleet.policies import Policy, register

    class Shortest(Policy):
        def choose(self, request):
            return min(range(len(self.replicas)), key=lambda i: self.replicas[i].in_flight)

    register("shortest", Shortest)     # then `fleet.router.policy: shortest` in a scenario

A policy sees each call as a `RouteRequest` (its session key, the call's hash ids, block size and
prompt tokens, the simulated time) and the replicas as `ReplicaView`s (the requests in flight as the
router counts them: routed and not yet answered; for exact scorers the replica twin's prefix cache,
read through `ReplicaView.cached_tokens`, which changes nothing the records show). It returns a replica's index, and is
told when a request it routed ends (`Policy.ended`). It gets the scenario's `RouterSpec` for its
settings and a seeded `random.Random` for its draws, so a run is reproducible.

The policies (`POLICIES`): ``random``, ``round_robin``, ``least_outstanding``, ``power_of_two``,
``manual`` (sticky session keys), ``cache_aware`` (SGLang's router) and ``prefix_score`` (llm-d style,
on the replicas' real cached blocks). Where sglang-router breaks a tie by its maps' iteration order
(which a process's hash seed makes arbitrary), the twin draws among the tied replicas.
"""

from __future__ import annotations

import heapq
import random
from typing import Any, Optional, Sequence

from ..errors import InputError
from ..hash_ids import as_tuple
from ..scenario.fleet import RouterSpec
from ..sim.hybrid_cache import HybridKVCache
from ..sim.prefix_tree import common_prefix_at
from ..workload import Call


class RouteRequest:
    """One call as the router sees it."""

    __slots__ = ("key", "call", "now", "_blocks", "_holding")

    def __init__(self, key: str, call: Call, now: float) -> None:
        self.key = key
        """The session key (`simulator.behaviour.CallRequest.session_key`)."""
        self.call = call
        self.now = now
        """Simulated seconds when it is routed."""
        self._blocks: Optional[tuple[int, ...]] = None
        self._holding: Any = None

    @property
    def input_tokens(self) -> int:
        return self.call.input_tokens

    @property
    def block_size(self) -> int:
        """Tokens per hash id (0: the call has no hash ids)."""
        return self.call.block_size

    def blocks(self) -> tuple[int, ...]:
        """The hash ids of the prompt's full blocks (those within `input_tokens`), as a tuple."""
        if self._blocks is None:
            call = self.call
            tb = call.block_size
            usable = min(len(call.hash_ids), call.input_tokens // tb) if tb > 0 else 0
            self._blocks = as_tuple(call.hash_ids, usable) if usable else ()
        return self._blocks


class ReplicaView:
    """What a policy may read of one replica: its index and name, the requests the router has in
    flight to it, and its twin (for exact scorers)."""

    __slots__ = ("index", "name", "in_flight", "twin", "_sync")

    def __init__(self, index: int, name: str, twin: Any) -> None:
        self.index = index
        self.name = name
        self.in_flight = 0
        """Requests routed to it and not answered yet (what sglang-router calls a worker's load)."""
        self.twin = twin
        """The replica's `simulator.sim.twin.Twin` (or `HybridTwin`); policies only read it."""
        self._sync = getattr(twin, "sync", None)
        """The twin's call bringing its cache up to now (`simulator.sim.twin.Twin.sync`: a replica
        planning runs ahead, `simulator.fleet.replica`); None for a twin without one."""

    def cached_tokens(self, request: RouteRequest) -> int:
        """Prompt tokens of `request` the replica's prefix cache would serve if it were admitted now
        (the twin's own lookup): whole KV blocks, at most the prompt less one token; on a hybrid model's
        replica, up to its furthest kept Mamba state. A replica planning ahead is brought up to now
        first (`simulator.fleet.replica`)."""
        twin = self.twin
        if self._sync is not None:
            self._sync()
        kv = twin.kv
        call = request.call
        holding = request._holding
        if holding is None or type(holding) is not twin._holding_class:
            holding = request._holding = twin._holding_class(call.hash_ids, call.block_size, call.input_tokens)
        if isinstance(kv, HybridKVCache):
            return kv.lookup_hybrid(holding, call.input_tokens)[4]
        match = kv.lookup(holding, (call.input_tokens - 1) // kv.block_size)
        return kv.cached_blocks(holding, match) * kv.block_size


class Policy:
    """A router policy: `choose` a replica for each request; `ended` is called when a request it routed
    ends (after the router's in-flight count is lowered). Subclasses set their settings from `router`
    in `__init__` and draw only from `rng`."""

    def __init__(self, router: RouterSpec, replicas: Sequence[ReplicaView], rng: random.Random) -> None:
        self.router = router
        self.replicas = replicas
        self.rng = rng

    def choose(self, request: RouteRequest) -> int:
        """The index of the replica that serves `request`."""
        raise NotImplementedError

    def ended(self, request: RouteRequest, replica: int) -> None:
        """`request`, routed to `replica`, has ended (answered, or failed)."""

    def _least_loaded(self) -> int:
        """A replica with the fewest requests in flight, drawn among the tied."""
        views = self.replicas
        low = min(v.in_flight for v in views)
        tied = [v.index for v in views if v.in_flight == low]
        return tied[0] if len(tied) == 1 else self.rng.choice(tied)


class RandomPolicy(Policy):
    """A replica drawn uniformly."""

    def choose(self, request: RouteRequest) -> int:
        return self.rng.randrange(len(self.replicas))


class RoundRobinPolicy(Policy):
    """The replicas in turn: r0, r1, ..., r0, ..."""

    def __init__(self, router: RouterSpec, replicas: Sequence[ReplicaView], rng: random.Random) -> None:
        super().__init__(router, replicas, rng)
        self._next = 0

    def choose(self, request: RouteRequest) -> int:
        index = self._next
        self._next = (index + 1) % len(self.replicas)
        return index


class LeastOutstandingPolicy(Policy):
    """The replica with the fewest requests in flight (ties drawn)."""

    def choose(self, request: RouteRequest) -> int:
        return self._least_loaded()


class PowerOfTwoPolicy(Policy):
    """Two distinct replicas drawn, the one with fewer requests in flight taken (the first drawn on a
    tie), as sglang-router's ``power_of_two`` does with its in-flight counts."""

    def choose(self, request: RouteRequest) -> int:
        n = len(self.replicas)
        if n == 1:
            return 0
        rng = self.rng
        a = rng.randrange(n)
        b = rng.randrange(n - 1)
        if b >= a:
            b += 1
        views = self.replicas
        return a if views[a].in_flight <= views[b].in_flight else b


class ManualPolicy(Policy):
    """Session affinity, as sglang-router's ``manual`` policy: a key seen before goes where it went the
    first time; a new key goes where `RouterSpec.assignment_mode` says: ``random``, ``min_load`` (fewest
    requests in flight) or ``min_group`` (fewest session keys with a request in flight), ties drawn.
    Not modelled: forgetting keys idle for longer than sglang-router's ``--max-idle-secs`` (4 hours by
    default), and moving a key off a replica that died (the twin's replicas do not fail)."""

    def __init__(self, router: RouterSpec, replicas: Sequence[ReplicaView], rng: random.Random) -> None:
        super().__init__(router, replicas, rng)
        self.mode = router.assignment_mode
        self.assigned: dict[str, int] = {}
        """Session key -> its replica."""
        self._active: list[dict[str, int]] = [{} for _ in replicas]
        """Per replica: requests in flight by session key (its keys in flight, for ``min_group``)."""

    def choose(self, request: RouteRequest) -> int:
        key = request.key
        index = self.assigned.get(key)
        if index is None:
            index = self.assigned[key] = self._new_key()
        active = self._active[index]
        active[key] = active.get(key, 0) + 1
        return index

    def _new_key(self) -> int:
        if self.mode == "min_load":
            return self._least_loaded()
        if self.mode == "min_group":
            groups = [len(active) for active in self._active]
            low = min(groups)
            tied = [i for i, g in enumerate(groups) if g == low]
            return tied[0] if len(tied) == 1 else self.rng.choice(tied)
        return self.rng.randrange(len(self.replicas))

    def ended(self, request: RouteRequest, replica: int) -> None:
        active = self._active[replica]
        left = active[request.key] - 1
        if left:
            active[request.key] = left
        else:
            del active[request.key]


class _TreeNode:
    """A run of hash ids in the cache-aware router's tree, with the replicas that sent it and when
    each last touched it."""

    __slots__ = ("parent", "src", "start", "n", "tb", "children", "tenants")

    def __init__(self, parent: Optional[_TreeNode], src: tuple, start: int, n: int, tb: int) -> None:
        self.parent = parent
        self.src = src
        """The ids of a prompt holding the run: ``src[start:start + n]`` (shared, not copied)."""
        self.start = start
        self.n = n
        self.tb = tb
        """Tokens per id."""
        self.children: dict[int, _TreeNode] = {}
        self.tenants: dict[int, float] = {}
        """Replica index -> simulated time it last inserted or matched through this run."""


class CacheAwarePolicy(Policy):
    """SGLang router's ``cache_aware`` policy (sgl-router ``policies/cache_aware.rs`` and ``tree.rs``).

    The router keeps an approximate radix tree of the prompts it routed, each run of the tree tagged
    with the replicas ("tenants") it sent it to and when; no replica is asked what it caches. Each
    request: with the replicas' loads (requests in flight, counted by the router itself: +1 when it
    routes a request, -1 when the response ends), if ``max - min > balance_abs_threshold`` and
    ``max > min * balance_rel_threshold`` (both), it goes to the least loaded replica (the first on a
    tie). Otherwise the tree is searched for the prompt's longest prefix; if the matched share of the
    prompt exceeds ``cache_threshold`` the request goes to a replica holding that prefix, else (with
    ``below_threshold: least_load``, as sglang-router 0.3 does when measured: docs/fleet.md) to the
    least loaded replica, the first on a tie, or (``smallest_tree``, as the router's documentation and
    older source say) to the replica whose tree is smallest. Either way its prompt is then inserted under the chosen replica.
    Every ``eviction_interval`` seconds, each replica whose tree exceeds ``max_tree_size`` loses its least
    recently used leaves until it fits.

    What the twin assumes where it differs from the live router:

    - **Tokens, not characters.** Live, the tree holds the request's text (characters; a completions
      request's token ids, depending on the router's version, as rendered text or not at all); here it
      holds the call's prompt as its hash ids, each worth `block_size` tokens, so match lengths, the
      matched share (matched tokens over `input_tokens`) and the tree sizes (and so `max_tree_size`)
      are in tokens. The part of a prompt past its last full hash block is neither inserted nor
      matched: it is the turn's new text, which no earlier prompt holds.
    - **A replica's own runs grow in place.** Live, a request that extends a prompt adds a child node;
      here a leaf run that only its replica holds is lengthened instead, which matches the same
      prefixes but is evicted as one piece (the live router evicts it node by node).
    - **Clock and ties.** Access times are simulated seconds; eviction runs at the first request at or
      after each multiple of the interval (the live router's thread runs on the wall clock). Where the
      live router takes the first entry of a hash map (the tenant of the matched node, the smallest
      tree), the twin draws among the tied replicas.
    """

    def __init__(self, router: RouterSpec, replicas: Sequence[ReplicaView], rng: random.Random) -> None:
        super().__init__(router, replicas, rng)
        self.cache_threshold = router.cache_threshold
        self.abs_threshold = router.balance_abs_threshold
        self.rel_threshold = router.balance_rel_threshold
        self.interval = router.eviction_interval
        self.max_size = router.max_tree_size
        self.by_load = router.below_threshold == "least_load"
        self.roots: dict[int, _TreeNode] = {}
        """A tree per block size (hash ids of different block sizes are different prompts)."""
        self.sizes = [0] * len(replicas)
        """Tokens each replica's tree holds (sglang's ``tenant_char_count``)."""
        self._next_eviction = self.interval
        self.evictions = 0
        """Runs (node, replica) evicted so far."""

    # ---- routing ----------------------------------------------------------------------------

    def choose(self, request: RouteRequest) -> int:
        now = request.now
        if now >= self._next_eviction:
            self.evict(self.max_size)
            self._next_eviction = (now // self.interval + 1) * self.interval
        views = self.replicas
        high = low = views[0].in_flight
        for v in views:
            load = v.in_flight
            if load > high:
                high = load
            elif load < low:
                low = load
        ids = request.blocks()
        tb = request.block_size
        path, matched = self._walk(ids, tb)
        if high - low > self.abs_threshold and high > low * self.rel_threshold:
            choice = next(v.index for v in views if v.in_flight == low)
        else:
            choice = -1
            if path:
                tenants = path[-1].tenants
                tenant = next(iter(tenants)) if len(tenants) == 1 else self.rng.choice(list(tenants))
                for node in path:  # the live router's match touches the matched tenant's path
                    node.tenants[tenant] = now
                if matched * tb / request.input_tokens > self.cache_threshold:
                    choice = tenant
            if choice < 0:
                choice = next(v.index for v in views if v.in_flight == low) if self.by_load else self._smallest()
        if ids:
            self._insert(ids, tb, choice, now, path, matched)
        return choice

    def _smallest(self) -> int:
        sizes = self.sizes
        low = min(sizes)
        tied = [i for i, s in enumerate(sizes) if s == low]
        return tied[0] if len(tied) == 1 else self.rng.choice(tied)

    def _walk(self, ids: tuple, tb: int) -> tuple[list[_TreeNode], int]:
        """The nodes the longest match of `ids` passes through (the last possibly partly) and how many
        ids it matches."""
        # A node's prompt (`src`) spells the whole path from the root to it, so the path that the
        # children's first ids lead to is checked at once, against its last node's prompt (one
        # comparison, of tuples that are mostly not copied); only when that fails is the match walked
        # node by node.
        path: list[_TreeNode] = []
        node = self.roots.get(tb) if ids else None
        pos = 0
        total = len(ids)
        while node is not None and pos < total:
            child = node.children.get(ids[pos])
            if child is None:
                break
            path.append(child)
            if child.n > total - pos:
                pos = total
                break
            pos += child.n
            node = child
        if not path:
            return path, 0
        src = path[-1].src
        if src is ids or ids[:pos] == src[:pos]:
            return path, pos
        return self._walk_nodes(ids, tb)

    def _walk_nodes(self, ids: tuple, tb: int) -> tuple[list[_TreeNode], int]:
        """`_walk`, comparing the prompt with each node's run in turn."""
        path: list[_TreeNode] = []
        node = self.roots.get(tb)
        pos = 0
        total = len(ids)
        while node is not None and pos < total:
            child = node.children.get(ids[pos])
            if child is None:
                break
            n = child.n if child.n < total - pos else total - pos
            src = child.src
            k = n if src is ids or ids[pos:pos + n] == src[pos:pos + n] else common_prefix_at(ids, src, pos, n)
            path.append(child)
            pos += k
            if k < child.n:
                break
            node = child
        return path, pos

    def _insert(self, ids: tuple, tb: int, tenant: int, now: float, path: list[_TreeNode], matched: int) -> None:
        """Add the prompt `ids` under `tenant`, along the `path` its match took (`matched` ids)."""
        sizes = self.sizes
        pos = 0
        parent = self.roots.get(tb)
        if parent is None:
            parent = self.roots[tb] = _TreeNode(None, (), 0, 0, tb)
        for node in path:
            if pos + node.n > matched:  # the match ends inside this run: split it there
                node = self._split(node, matched - pos)
            tenants = node.tenants
            if tenant not in tenants:
                sizes[tenant] += node.n * tb
            tenants[tenant] = now
            pos += node.n
            parent = node
        rest = len(ids) - pos
        if rest <= 0:
            return
        sizes[tenant] += rest * tb
        if parent.parent is not None and not parent.children and len(parent.tenants) == 1:
            # a leaf only this replica holds, which the prompt extends: lengthen it
            parent.src = ids
            parent.n += rest
            return
        child = _TreeNode(parent, ids, pos, rest, tb)
        child.tenants[tenant] = now
        parent.children[ids[pos]] = child

    @staticmethod
    def _split(node: _TreeNode, k: int) -> _TreeNode:
        """Cut `node` after its first `k` ids; returns the new head (same tenants and times)."""
        parent = node.parent
        assert parent is not None
        head = _TreeNode(parent, node.src, node.start, k, node.tb)
        head.tenants = dict(node.tenants)
        parent.children[node.src[node.start]] = head
        node.start += k
        node.n -= k
        node.parent = head
        head.children[node.src[node.start]] = node
        return head

    # ---- eviction ---------------------------------------------------------------------------

    def evict(self, max_size: int) -> None:
        """Each replica whose tree holds more than `max_size` tokens loses its least recently used
        leaves (runs no child of which it holds) until it fits, as sglang's ``evict_tenant_by_size``."""
        over = {i for i, size in enumerate(self.sizes) if size > max_size}
        if not over:
            return
        heap: list[tuple[float, int, int, _TreeNode]] = []
        order = 0
        for root in self.roots.values():
            stack = list(root.children.values())
            while stack:
                node = stack.pop()
                stack.extend(node.children.values())
                for tenant in self._leaf_tenants(node):
                    if tenant in over:
                        heap.append((node.tenants[tenant], order, tenant, node))
                        order += 1
        heapq.heapify(heap)
        sizes = self.sizes
        while heap:
            _, _, tenant, node = heapq.heappop(heap)
            if sizes[tenant] <= max_size or tenant not in node.tenants:
                continue
            del node.tenants[tenant]
            sizes[tenant] -= node.n * node.tb
            self.evictions += 1
            parent = node.parent
            assert parent is not None
            if not node.tenants and not node.children:
                del parent.children[node.src[node.start]]
            if parent.parent is not None and tenant in parent.tenants and tenant in self._leaf_tenants(parent):
                heapq.heappush(heap, (parent.tenants[tenant], order, tenant, parent))
                order += 1

    @staticmethod
    def _leaf_tenants(node: _TreeNode) -> list[int]:
        """The replicas for which `node` is a leaf: they hold it and none of its children."""
        below: set[int] = set()
        for child in node.children.values():
            below.update(child.tenants)
        return [t for t in node.tenants if t not in below]


class PrefixScorePolicy(Policy):
    """An exact prefix-aware scorer in the manner of llm-d's: each replica scores the KV blocks of the
    prompt its prefix cache holds now (the twin's own lookup) less `RouterSpec.load_penalty` times its
    requests in flight; the best score wins, ties to the least loaded, then the first. A live router
    would learn the cached blocks from the replicas' KV events; the twin reads them directly."""

    def __init__(self, router: RouterSpec, replicas: Sequence[ReplicaView], rng: random.Random) -> None:
        super().__init__(router, replicas, rng)
        self.penalty = router.load_penalty

    def choose(self, request: RouteRequest) -> int:
        best = 0
        best_score = best_load = None
        penalty = self.penalty
        for v in self.replicas:
            load = v.in_flight
            score = v.cached_tokens(request) // v.twin.block_size - penalty * load
            if best_score is None or score > best_score or (score == best_score and load < best_load):
                best, best_score, best_load = v.index, score, load
        return best


POLICIES: dict[str, type[Policy]] = {}
"""Router policies by name (`register` adds one)."""


def register(name: str, cls: type[Policy]) -> None:
    """Make `cls` the policy that `fleet.router.policy: <name>` selects on the twin."""
    if not (isinstance(cls, type) and issubclass(cls, Policy)):
        raise TypeError(f"a router policy is a subclass of simulator.fleet.policies.Policy, not {cls!r}")
    POLICIES[name] = cls


for _name, _cls in (("random", RandomPolicy), ("round_robin", RoundRobinPolicy),
                    ("least_outstanding", LeastOutstandingPolicy), ("power_of_two", PowerOfTwoPolicy),
                    ("manual", ManualPolicy), ("cache_aware", CacheAwarePolicy),
                    ("prefix_score", PrefixScorePolicy)):
    register(_name, _cls)


def policy_class(name: str, *, source: Optional[str] = None, path: str = "fleet.router.policy") -> type[Policy]:
    """The policy registered as `name`; an `InputError` naming `path` (in `source`) when none is."""
    cls = POLICIES.get(name)
    if cls is None:
        raise InputError(f"unknown router policy {name!r} on the twin (known: {', '.join(sorted(POLICIES))}; "
                         f"add one with simulator.fleet.policies.register)", file=source, path=path)
    return cls


def make_policy(router: RouterSpec, replicas: Sequence[ReplicaView], seed: int, *, name: Optional[str] = None,
                source: Optional[str] = None, path: str = "fleet.router.policy") -> Policy:
    """The policy `router.policy` (or `name`, set at `path` of the file `source`) over `replicas`, its
    draws seeded by `seed`."""
    return policy_class(name or router.policy, source=source, path=path)(router, replicas, random.Random(seed))

