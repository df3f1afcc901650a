"""One replica of the fleet twin: the server twin of the profile, made to share one SimPy environment
with other replicas without losing its fast path (`make_replica`).

A twin advances a run of pure-decode steps at once only up to the next event in its environment's
queue (`simulator.sim.twin`), since any event might bring it a request. In a fleet that queue also
holds every other replica's steps and the clients of N replicas, so a replica's runs would shrink to a
step or two and the fleet would cost several times a single server per call (4.4 times, measured on
8 replicas). A replica plans its runs further ahead instead, through the twin's hook for it
(`Twin._plans_ahead`, `Twin._horizon_ahead`): the twin keeps the end times of a run planned ahead and
cuts it short at its first step boundary at or after the moment work actually reaches it (a request
sent to it or reaching its waiting queue), which is where the twin alone would have ended it, and
takes the run's KV blocks only at its end or cut. A router that reads the replica's cache meanwhile
(`ReplicaView.cached_tokens`) first calls `Twin.sync`, which cuts a run whose blocks will evict cached
ones. So a replica's records are those of the twin stepped one by one (tests check it).

How far ahead a replica plans is only a matter of speed: four times the mean time between the requests
it was given lately, at most `AHEAD_STEPS` times the run's first step, or up to the next event if that
is further.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import simpy

from ..sim.hybrid_twin import HybridTwin
from ..sim.profile import ServerProfile
from ..sim.request import TwinRequest
from ..sim.twin import Twin
from ..workload import Call

LOOKAHEAD_INTERVALS = 4.0
"""A replica plans runs of decode steps this many of its mean intervals between requests ahead."""
AHEAD_STEPS = 64
"""... and no more than this many times the run's first step (a run cut short is not planned again,
but the steps planned past the cut are work lost)."""
INTERVAL_WEIGHT = 0.2
"""Weight of the latest interval in that mean (an exponentially weighted one)."""


class _Ahead:
    """The mixin that lets a twin plan its runs of decode steps ahead (see the module docstring)."""

    env: simpy.Environment
    _plans_ahead = True

    def _init_ahead(self) -> None:
        self._interval = 0.0
        """Mean seconds between the requests this replica was given (0: none yet)."""
        self._last_submit: Optional[float] = None

    def _horizon_ahead(self, step_s: float) -> float:
        interval = self._interval
        if not interval:
            return -math.inf
        ahead = LOOKAHEAD_INTERVALS * interval
        most = AHEAD_STEPS * step_s
        return self.env.now + (ahead if ahead < most else most)

    def submit_call_raw(self, call: Call) -> simpy.Event:
        """`Twin.submit_call_raw`, taking note of the time since the replica's previous request."""
        now = self.env.now
        last = self._last_submit
        if last is not None:
            gap = now - last
            self._interval = gap if not self._interval else self._interval + INTERVAL_WEIGHT * (gap - self._interval)
        self._last_submit = now
        return super().submit_call_raw(call)  # type: ignore[misc]


class ReplicaTwin(_Ahead, Twin):
    """A replica of an attention-only model's profile."""

    def __init__(self, env: simpy.Environment, profile: ServerProfile, *, keep_gaps: bool = False,
                 fast_decode: bool = True) -> None:
        self._init_ahead()
        super().__init__(env, profile, keep_gaps=keep_gaps, fast_decode=fast_decode)


class HybridReplicaTwin(_Ahead, HybridTwin):
    """A replica of a hybrid (Mamba + attention) model's profile."""

    def __init__(self, env: simpy.Environment, profile: ServerProfile, *, keep_gaps: bool = False,
                 fast_decode: bool = True) -> None:
        self._init_ahead()
        super().__init__(env, profile, keep_gaps=keep_gaps, fast_decode=fast_decode)


class DecodeTwin(Twin):
    """A replica of a disaggregated fleet's decode pool: a request arrives with its prompt's KV moved
    from a prefill replica, so at its first admission it computes only the prompt's last token (as
    vLLM's decode side does to start decoding); its blocks are allocated as the moved KV's (what the
    replica already caches is shared, the rest is new), and the prefix-cache counters count only the
    replica's own hits. A request readmitted after a preemption recomputes what it lost, as any."""

    def _hit(self, req: TwinRequest, tokens: int) -> Optional[tuple[Any, int]]:
        hit = super()._hit(req, tokens)
        if hit is None or req.cached_tokens is not None:
            return hit
        return hit[0], tokens - 1

    def _admit_blocks(self, req: TwinRequest, match: Any, tokens: int, computed: int, chunk: int) -> int:
        n = super()._admit_blocks(req, match, tokens, computed, chunk)
        if n and req.cached_tokens is None:
            # counted here with the replica's own hit (the twin would count the moved KV as one)
            local = self.kv.cached_blocks(req.hold, match) * self.block_size
            req.cached_tokens = local
            self.stats.cached_tokens += local
            self.stats.queried_tokens += tokens
        return n


class DecodeReplicaTwin(_Ahead, DecodeTwin):
    """A decode-pool replica sharing the fleet's environment."""

    def __init__(self, env: simpy.Environment, profile: ServerProfile, *, keep_gaps: bool = False,
                 fast_decode: bool = True) -> None:
        self._init_ahead()
        super().__init__(env, profile, keep_gaps=keep_gaps, fast_decode=fast_decode)


def make_replica(env: simpy.Environment, profile: ServerProfile, *, decode: bool = False, keep_gaps: bool = False,
                 fast_decode: bool = True) -> Twin[Any]:
    """A replica's twin of `profile` in the fleet's `env` (the kind `simulator.sim.make_twin.make_twin`
    builds, hybrid included); `decode`: a decode-pool replica of a disaggregated fleet (attention-only
    profiles)."""
    if decode:
        if profile.kv_cache.hybrid is not None:
            raise ValueError(f"profile {profile.name!r} is a hybrid model's: prefill/decode disaggregation is "
                             f"not modelled for hybrid models on the twin")
        return DecodeReplicaTwin(env, profile, keep_gaps=keep_gaps, fast_decode=fast_decode)
    kind = ReplicaTwin if profile.kv_cache.hybrid is None else HybridReplicaTwin
    return kind(env, profile, keep_gaps=keep_gaps, fast_decode=fast_decode)
