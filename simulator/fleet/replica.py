"""One replica of the fleet twin: the server twin of the profile, made to share one SimPy environment
with other replicas without losing its fast path (`make_replica`).

A twin advances a run of pure-decode steps at once only up to the next event in its environment's
queue (`simulator.sim.twin`). In a fleet that queue also holds every other replica's steps and the
clients of N replicas, so a replica's runs would shrink to a step or two and the fleet would cost
several times a single server per call (4.4 times, measured on 8 replicas). A replica plans its runs
further ahead instead (`simulator.sim.ahead`), cutting a run short where work actually reaches it, so
its records are those of the twin stepped one by one (tests check it).
"""

from __future__ import annotations

from typing import Any, Optional

import simpy

from ..sim.ahead import AheadHybridTwin, AheadTwin, PlansAhead
from ..sim.profile import ServerProfile
from ..sim.request import TwinRequest
from ..sim.twin import Twin


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


class DecodeReplicaTwin(PlansAhead, DecodeTwin):
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
    kind = AheadTwin if profile.kv_cache.hybrid is None else AheadHybridTwin
    return kind(env, profile, keep_gaps=keep_gaps, fast_decode=fast_decode)
