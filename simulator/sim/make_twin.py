"""Building the server twin a profile needs: `make_twin`."""

from __future__ import annotations

from typing import Any

import simpy

from .ahead import AheadHybridTwin, AheadTwin
from .hybrid_twin import HybridTwin
from .profile import ServerProfile
from .twin import Twin


def make_twin(env: simpy.Environment, profile: ServerProfile, *, keep_gaps: bool = False,
              fast_decode: bool = True, plan_ahead: bool = False) -> Twin[Any]:
    """The twin of `profile`'s server in `env`: a `HybridTwin` when the profile has hybrid (Mamba)
    layers (``kv_cache.hybrid``), else a `Twin`. `keep_gaps` keeps every inter-token gap; `fast_decode`
    advances decode steps in bulk (see `simulator.sim.twin`); `plan_ahead` plans those runs past events
    that bring it no work (`simulator.sim.ahead`: the same records, fewer runs planned)."""
    hybrid = profile.kv_cache.hybrid is not None
    if plan_ahead:
        kind: type = AheadHybridTwin if hybrid else AheadTwin
    else:
        kind = HybridTwin if hybrid else Twin
    return kind(env, profile, keep_gaps=keep_gaps, fast_decode=fast_decode)
