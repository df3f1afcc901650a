"""The energy of a run on the twin: the profile's power model (`simulator.sim.profile.PowerSettings`) over
what the engine did, read from the twin's own counters (`simulator.sim.twin.TwinStats`: busy time,
steps, tokens), never from inside its step loop.

The counters are cumulative, so the driver's /metrics samples (every `run.scrape_interval` of simulated
time, and at the run's end) give them on a timeline (`EngineTimeline`); the work between two instants is
the difference of the counters interpolated linearly at both. A sample reads the counters as stepping
one by one has them (`Twin.stats_now`: the steps of a run of decode steps that ended before it count),
so a counter lags at most the step in flight.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .profile import PowerSettings
from .twin import TwinStats

SOURCE = "twin power model"
"""How a twin's energy section names where its joules come from."""


def energy_j(power: PowerSettings, *, wall_s: float, busy_s: float, tokens: float = 0.0, steps: float = 0.0,
             servers: int = 1) -> float:
    """Joules of `servers` servers of `power` over `wall_s` seconds in which their engines stepped for
    `busy_s` seconds (summed over the servers), computing `tokens` tokens in `steps` steps: every GPU draws
    `idle_w` throughout and `busy_w - idle_w` more while its engine steps, plus the work's terms."""
    return (power.gpus * (power.idle_w * wall_s * servers + (power.busy_w - power.idle_w) * busy_s)
            + power.per_token_j * tokens + power.per_step_j * steps)


@dataclass
class EngineTimeline:
    """The engine's cumulative counters at instants of a run, in time order: seconds stepping, tokens
    computed (prefill without the prefix cache's hits, and output), steps. Starts at 0 with nothing done."""

    times: list[float] = field(default_factory=lambda: [0.0])
    busy_s: list[float] = field(default_factory=lambda: [0.0])
    tokens: list[float] = field(default_factory=lambda: [0.0])
    steps: list[float] = field(default_factory=lambda: [0.0])

    def add(self, t: float, stats: TwinStats, output_tokens: Optional[float] = None) -> None:
        """The counters of `stats` at simulated time `t` (later than the last; the same `t` replaces it).
        `output_tokens`: the tokens emitted so far, those of requests still running included (a scrape's
        ``generation_tokens``); None: the finished requests' (`stats.output_tokens`, all of them once
        the run is over)."""
        if t < self.times[-1]:
            raise ValueError(f"timeline sample at {t} s after one at {self.times[-1]} s")
        emitted = stats.output_tokens if output_tokens is None else output_tokens
        # a counter never goes down: the tokens of requests cut off at a drain deadline were computed,
        # though no finished request counts them
        tokens = max(float(stats.prefill_tokens + emitted), self.tokens[-1])
        if t == self.times[-1]:
            for series in (self.times, self.busy_s, self.tokens, self.steps):
                series.pop()
        self.times.append(t)
        self.busy_s.append(stats.busy_time)
        self.tokens.append(tokens)
        self.steps.append(float(stats.steps))

    def between(self, start: float, end: float) -> tuple[float, float, float]:
        """(busy seconds, tokens, steps) from `start` to `end`, each counter interpolated at both ends
        (held at its last value past the last instant)."""
        at = np.array([start, end], dtype=float)
        times = np.asarray(self.times)
        busy, tokens, steps = (np.interp(at, times, np.asarray(series))
                               for series in (self.busy_s, self.tokens, self.steps))
        return float(busy[1] - busy[0]), float(tokens[1] - tokens[0]), float(steps[1] - steps[0])


@dataclass
class TwinEnergy:
    """The energy meter of a twin run (`simulator.metrics.energy.EnergyMeter`): `servers` servers of the
    profile's `power` (a fleet's replicas), over their engines' summed counters."""

    power: PowerSettings
    timeline: EngineTimeline
    servers: int = 1
    source: str = SOURCE

    @property
    def assumptions(self) -> str:
        """Where the power model's figures come from (the profile's `power.source`)."""
        return self.power.source

    def joules(self, start: float, end: float) -> Optional[float]:
        """Joules from `start` to `end` (simulated seconds)."""
        if end < start:
            return None
        busy, tokens, steps = self.timeline.between(start, end)
        return energy_j(self.power, wall_s=end - start, busy_s=busy, tokens=tokens, steps=steps, servers=self.servers)
