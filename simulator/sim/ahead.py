"""A twin that plans its runs of decode steps ahead of the next event (`PlansAhead`), and the twins of
both kinds of model made so (`AheadTwin`, `AheadHybridTwin`).

A twin advances a run of pure-decode steps at once only up to the next event in its environment's
queue (`simulator.sim.twin`), since any event might bring it a request. Most events do not: the
driver's /metrics samples, other replicas' steps and clients in a fleet. A twin made with this mixin
plans its runs further ahead instead, through the twin's hook for it (`Twin._plans_ahead`,
`Twin._horizon_ahead`): the twin keeps the end times of a run planned ahead and cuts it short at its
first step boundary at or after the moment work actually reaches it (a request sent to it or reaching
its waiting queue), which is where stepping up to the next event would have ended it, and takes the
run's KV blocks only at its end or cut. A reader of its cache meanwhile (a router's lookup) first calls
`Twin.sync`, which cuts a run whose blocks will evict cached ones. So its records are those of the twin
stepped one by one (tests check it).

How far ahead it plans is only a matter of speed: four times the mean time between the requests it was
given lately, at most `AHEAD_STEPS` times the run's first step, or up to the next event if that is
further.
"""

from __future__ import annotations

import math
from typing import Optional

import simpy

from ..workload import Call
from .hybrid_twin import HybridTwin
from .profile import ServerProfile
from .twin import Twin

LOOKAHEAD_INTERVALS = 4.0
"""A twin plans runs of decode steps this many of its mean intervals between requests ahead."""
AHEAD_STEPS = 64
"""... and no more than this many times the run's first step (a run cut short is not planned again,
but the steps planned past the cut are work lost)."""
INTERVAL_WEIGHT = 0.2
"""Weight of the latest interval in that mean (an exponentially weighted one)."""


class PlansAhead:
    """The mixin that lets a twin plan its runs of decode steps ahead (see the module docstring); put it
    before the twin's class."""

    env: simpy.Environment
    _plans_ahead = True

    def _init_ahead(self) -> None:
        self._interval = 0.0
        """Mean seconds between the requests this twin was given (0: none yet)."""
        self._last_submit: Optional[float] = None

    def _horizon_ahead(self, step_s: float) -> float:
        interval = self._interval
        if not interval:
            return -math.inf
        ahead = LOOKAHEAD_INTERVALS * interval
        most = AHEAD_STEPS * step_s
        return self.env.now + (ahead if ahead < most else most)

    def submit_call_raw(self, call: Call) -> simpy.Event:
        """`Twin.submit_call_raw`, taking note of the time since the twin's previous request."""
        now = self.env.now
        last = self._last_submit
        if last is not None:
            gap = now - last
            self._interval = gap if not self._interval else self._interval + INTERVAL_WEIGHT * (gap - self._interval)
        self._last_submit = now
        return super().submit_call_raw(call)  # type: ignore[misc]


class AheadTwin(PlansAhead, Twin):
    """The twin of an attention-only model's profile, planning ahead."""

    def __init__(self, env: simpy.Environment, profile: ServerProfile, *, keep_gaps: bool = False,
                 fast_decode: bool = True) -> None:
        self._init_ahead()
        super().__init__(env, profile, keep_gaps=keep_gaps, fast_decode=fast_decode)


class AheadHybridTwin(PlansAhead, HybridTwin):
    """The twin of a hybrid (Mamba + attention) model's profile, planning ahead."""

    def __init__(self, env: simpy.Environment, profile: ServerProfile, *, keep_gaps: bool = False,
                 fast_decode: bool = True) -> None:
        self._init_ahead()
        super().__init__(env, profile, keep_gaps=keep_gaps, fast_decode=fast_decode)
