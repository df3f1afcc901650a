"""The fleet twin: N replica twins in one SimPy environment behind a router policy (`FleetTwin`).

Each replica is the server twin of the profile (its own scheduler, KV cache and prefix cache, hybrid
models included), sharing the environment without losing its fast path (`simulator.fleet.replica`:
its records stay those of the twin alone). A call is routed when it is sent: the policy
(`simulator.fleet.policies`) picks a replica from the call's session key, its prompt's hash ids and
the requests the router has in flight to each replica (counted up when routed, down when the response
ends, as sglang-router counts a worker's load), and the call goes to that replica's twin. `FleetTwin`
has what `simulator.sim.driver.SimDriver` reads of a server: `submit_call_raw(call, key)` (the chosen
replica's event and its name), `max_model_len`, `stats` (summed over replicas), `scraper()`. A fleet of
one replica gives the records of the twin alone, each naming r0.

**Prefill/decode disaggregation** (``fleet.disaggregation``): the first ``prefill`` replicas prefill,
the others decode. As sglang-router's PD mode does, the router picks both replicas when the call is
sent (the prefill pool by ``router.policy``, the decode pool by ``decode_policy``, default the same).
The call is prefilled on its prefill replica as a request of one output token; its KV cache then moves
to the decode replica in ``kv_bytes_per_token * input_tokens * 8 / (link_gbps * 1e9)`` seconds; then
the decode replica serves the call with its prompt already computed but its last token (vLLM's decode
side computes that one again to start decoding), its blocks allocated there as the transfer's. Its
TTFT is so the prefill's end, plus the transfer, plus the decode replica's wait and first step. The
assumptions: the whole prompt's KV moves (blocks the decode replica already caches are not
subtracted), a transfer starts when the prefill ends and does not slow another one or either
replica's steps, and the decode replica reports only its own prefix-cache hits; a call's record
counts as cached the tokens the prefill replica's cache served. A decode request preempted on its
replica recomputes its prompt there. Hybrid (Mamba) profiles are not modelled disaggregated.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Callable, Iterable, Optional

import simpy

from ..errors import InputError
from ..sim.profile import ServerProfile
from ..sim.request import TwinRequest
from ..sim.scrape import TwinScraper
from ..sim.twin import Twin, TwinStats, exact_delay
from ..workload import Call
from .policies import Policy, ReplicaView, RouteRequest, make_policy
from .replica import make_replica
from ..scenario.fleet import FleetSpec

ReplicaSampleSink = Callable[[str, float, dict[str, float]], None]
"""Takes one replica's /metrics sample: (replica name, simulated seconds, values by the probe's names)."""

SHARE_KEYS = frozenset({"kv_cache_usage_perc"})
"""Sample values that are shares: the fleet's is the replicas' mean (their pools are equal), not their sum."""


class _Pool:
    """Replicas that one policy routes among (the whole fleet, or a pool of a disaggregated one)."""

    __slots__ = ("views", "policy", "offset", "told")

    def __init__(self, views: list[ReplicaView], policy: Policy, offset: int = 0) -> None:
        self.views = views
        self.policy = policy
        self.offset = offset
        """Index in the fleet of the pool's first replica."""
        self.told = type(policy).ended is not Policy.ended
        """Whether the policy wants to be told when a request ends (`Policy.ended` overridden)."""


class FleetTwin:
    """Replica twins of `profile` behind the router policy of `fleet` in `env` (see the module
    docstring). `seed` seeds the policies' draws; `on_replica_scrape`, when the fleet is scraped
    (`scraper`), gets each replica's sample."""

    def __init__(self, env: simpy.Environment, fleet: FleetSpec, profile: ServerProfile, *, keep_gaps: bool = False,
                 fast_decode: bool = True, seed: int = 0, on_replica_scrape: Optional[ReplicaSampleSink] = None,
                 source: Optional[str] = None) -> None:
        self.env = env
        self.fleet = fleet
        self.names = fleet.replica_names()
        self.sub_agents = fleet.session.sub_agents
        """Whose key a sub-agent's calls carry (`simulator.behaviour.CallRequest.session_key`)."""
        self.max_model_len = profile.scheduler.max_model_len
        self._on_replica_scrape = on_replica_scrape
        self._scrapers: Optional[list[TwinScraper]] = None
        pd = fleet.disaggregation
        router = fleet.router
        if pd is None:
            self.replicas: list[Twin] = [make_replica(env, profile, keep_gaps=keep_gaps, fast_decode=fast_decode)
                                         for _ in self.names]
            views = [ReplicaView(i, name, twin) for i, (name, twin) in enumerate(zip(self.names, self.replicas))]
            self.pool = _Pool(views, make_policy(router, views, seed, source=source))
            self.prefill: Optional[_Pool] = None
            self.transfer_s_per_token = 0.0
        else:
            if profile.kv_cache.hybrid is not None:
                raise InputError(f"profile {profile.name!r} is a hybrid model's: prefill/decode disaggregation is "
                                 f"not modelled for hybrid models on the twin", file=source, path="fleet.disaggregation")
            prefill = [make_replica(env, profile, keep_gaps=keep_gaps, fast_decode=fast_decode)
                       for _ in range(pd.prefill)]
            decode = [make_replica(env, profile, decode=True, keep_gaps=keep_gaps, fast_decode=fast_decode)
                      for _ in range(pd.decode)]
            self.replicas = [*prefill, *decode]
            p_views = [ReplicaView(i, self.names[i], twin) for i, twin in enumerate(prefill)]
            d_views = [ReplicaView(i, self.names[pd.prefill + i], twin) for i, twin in enumerate(decode)]
            self.prefill = _Pool(p_views, make_policy(router, p_views, seed, source=source))
            self.pool = _Pool(d_views, make_policy(router, d_views, seed + 1, name=pd.decode_policy, source=source,
                                                   path="fleet.disaggregation.decode_policy" if pd.decode_policy
                                                   else "fleet.router.policy"), offset=pd.prefill)
            self.transfer_s_per_token = pd.kv_bytes_per_token * 8 / (pd.link_gbps * 1e9)
            """Seconds the KV of one prompt token takes over the link."""

    @property
    def policy(self) -> Policy:
        """The router's policy (of the decode pool, when disaggregated)."""
        return self.pool.policy

    # ---- what the driver reads ----------------------------------------------------------------

    def submit_call_raw(self, call: Call, key: str) -> tuple[simpy.Event, str]:
        """Route `call` of session `key` and submit it: (the event its replica resolves with the
        replica twin's `TwinRequest` when the call ends, the replica's name). Disaggregated, the name
        is the decode replica's, which the call's response comes from."""
        request = RouteRequest(key, call, self.env.now)
        if self.prefill is not None:
            return self._disaggregated(request)
        pool = self.pool
        view = pool.views[pool.policy.choose(request)]
        view.in_flight += 1
        event = view.twin.submit_call_raw(call)
        event.callbacks.append(partial(self._resolved, pool, view, request))
        return event, view.name

    def _resolved(self, pool: _Pool, view: ReplicaView, request: RouteRequest, event: simpy.Event) -> None:
        """`_ended`, as the callback of the replica's event (written out: it runs for every call)."""
        view.in_flight -= 1
        if pool.told:
            pool.policy.ended(request, view.index)
        if self._scrapers is not None:
            self._scrapers[pool.offset + view.index].ended(event.value)

    def _ended(self, pool: _Pool, view: ReplicaView, request: RouteRequest, done: TwinRequest) -> None:
        """A routed request ended on `view`'s replica (before its client learns it)."""
        view.in_flight -= 1
        if pool.told:
            pool.policy.ended(request, view.index)
        if self._scrapers is not None:
            self._scrapers[pool.offset + view.index].ended(done)

    @property
    def stats(self) -> TwinStats:
        """The replicas' counters summed (`max_running`: the largest of one replica)."""
        return _summed(twin.stats for twin in self.replicas)

    def stats_now(self) -> TwinStats:
        """`stats` as of now, each replica's as stepping it one by one has them (`Twin.stats_now`)."""
        return _summed(twin.stats_now() for twin in self.replicas)

    @property
    def kv_evictions(self) -> int:
        """KV blocks evicted, summed over replicas."""
        return sum(twin.kv.evictions for twin in self.replicas)

    def scraper(self) -> "FleetScraper":
        """The fleet's /metrics as one server's (`FleetScraper`), each replica sampled on its own."""
        if self._scrapers is None:
            self._scrapers = [TwinScraper(twin) for twin in self.replicas]
        return FleetScraper(self)

    # ---- prefill/decode disaggregation ----------------------------------------------------------

    def _disaggregated(self, request: RouteRequest) -> tuple[simpy.Event, str]:
        prefill, decode = self.prefill, self.pool
        assert prefill is not None
        p_view = prefill.views[prefill.policy.choose(request)]
        d_view = decode.views[decode.policy.choose(request)]
        p_view.in_flight += 1
        d_view.in_flight += 1
        call = request.call
        done = simpy.Event(self.env)
        first = p_view.twin.submit_call_raw(dataclasses.replace(call, output_tokens=1))

        def prefilled(ev: simpy.Event) -> None:
            prefill_req: TwinRequest = ev.value
            self._ended(prefill, p_view, request, prefill_req)
            env = self.env
            moved = env.now + self.transfer_s_per_token * call.input_tokens
            env.timeout(exact_delay(env.now, moved)).callbacks.append(
                lambda _: self._decode(d_view, request, prefill_req, done))

        first.callbacks.append(prefilled)
        return done, d_view.name

    def _decode(self, view: ReplicaView, request: RouteRequest, prefill_req: TwinRequest, done: simpy.Event) -> None:
        """The call's KV has reached its decode replica: serve it there, then end the call."""
        event = view.twin.submit_call_raw(request.call)

        def decoded(ev: simpy.Event) -> None:
            decode_req: TwinRequest = ev.value
            self._ended(self.pool, view, request, decode_req)
            decode_req.cached_tokens = prefill_req.cached_tokens  # the call's record: the prefill's hits
            done.succeed(decode_req)

        event.callbacks.append(decoded)


class FleetScraper:
    """A scrape of the whole fleet as one server: each replica sampled (`simulator.sim.scrape.TwinScraper`,
    handed to the fleet's `on_replica_scrape`), the fleet's values their sums (shares: their mean)."""

    def __init__(self, fleet: FleetTwin) -> None:
        self.fleet = fleet
        assert fleet._scrapers is not None
        self.scrapers = fleet._scrapers

    def ended(self, req: TwinRequest) -> None:
        """Nothing: the fleet tells the replica's scraper itself when a request ends."""

    def sample(self) -> dict[str, float]:
        fleet = self.fleet
        sink = fleet._on_replica_scrape
        now = float(fleet.env.now)
        total: dict[str, float] = {}
        for name, scraper in zip(fleet.names, self.scrapers):
            values = scraper.sample()
            if sink is not None:
                sink(name, now, values)
            for key, value in values.items():
                total[key] = total.get(key, 0.0) + value
        count = len(self.scrapers)
        for key in SHARE_KEYS & total.keys():
            total[key] /= count
        return total


def _summed(each: Iterable[TwinStats]) -> TwinStats:
    total = TwinStats()
    for stats in each:
        for field in dataclasses.fields(TwinStats):
            name = field.name
            mine, theirs = getattr(total, name), getattr(stats, name)
            setattr(total, name, max(mine, theirs) if name == "max_running" else mine + theirs)
    return total
