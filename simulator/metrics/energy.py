"""The energy of a run: summary.json's ``energy`` section, per completed task and per output token.

Its joules come from a meter (`EnergyMeter`): on the twin, the profile's power model over what the
engine did (`simulator.sim.power.TwinEnergy`); live, the GPUs' power as NVML sampled it beside the
server's /metrics (`SampledPower`). Either way the section covers the window every per-task rate of the
summary covers: from the measurement window's start to the last counted end (`Summary.duration`). Its
joules are all the GPUs used in that time, whichever task they worked for (warm-up tasks still running,
idle stretches included), divided by the window's completed top-level tasks and by its calls' output
tokens: ``joules_per_task`` is the mean power over the throughput, as $ per task is the GPU's price over
it. A profile without a power model, or a live run whose GPUs were not sampled, has no section: no
energy, not zero.
"""

from __future__ import annotations

import math
from typing import Optional, Protocol, Sequence

import numpy as np

from .figures import Figures
from .server import GPU_PREFIX, SampleLike

POWER_SUFFIX = "_power_w"
"""A GPU's power in a /metrics sample: ``gpu{i}_power_w``, watts (NVML), beside its utilisation."""
SAMPLED_SOURCE = "NVML power samples"


class EnergyFigures(Figures):
    """The GPUs' energy over the measurement window, and per completed task and output token."""

    joules: float = 0.0
    """Joules the server's GPUs used from the window's start to the last counted end."""
    window_s: float = 0.0
    """Seconds those joules cover (the summary's `duration`)."""
    mean_power_w: Optional[float] = None
    """`joules` over `window_s` (None: a window of no length)."""
    joules_per_task: Optional[float] = None
    """`joules` over the window's completed top-level tasks (None: none completed)."""
    joules_per_output_token: Optional[float] = None
    """`joules` over the output tokens of the window's completed calls (None: none)."""
    source: str = ""
    """Where the joules come from: 'twin power model' (the profile's `power`) or 'NVML power samples'."""
    assumptions: Optional[str] = None
    """The power model's own source (the profile's `power.source`; None: live, or not stated)."""


class EnergyMeter(Protocol):
    """Joules between two instants of a run (seconds since its start), and where they come from."""

    source: str

    @property
    def assumptions(self) -> Optional[str]: ...

    def joules(self, start: float, end: float) -> Optional[float]: ...


def energy_figures(meter: EnergyMeter, *, start: float, duration: float, tasks_completed: int,
                   output_tokens: int) -> Optional[EnergyFigures]:
    """The section of a run measured from `start` for `duration` seconds, in which `tasks_completed`
    top-level tasks completed and its calls emitted `output_tokens` (None: the meter has no figure)."""
    joules = meter.joules(start, start + duration)
    if joules is None or not math.isfinite(joules):
        return None
    return EnergyFigures(
        joules=joules, window_s=duration,
        mean_power_w=joules / duration if duration > 0 else None,
        joules_per_task=joules / tasks_completed if tasks_completed else None,
        joules_per_output_token=joules / output_tokens if output_tokens else None,
        source=meter.source, assumptions=meter.assumptions or None)


class SampledPower:
    """The energy meter of a live run: the GPUs' power samples (watts, summed over the GPUs) integrated
    over time. NVML gives a board's power averaged over a short period before the reading, so a sample
    stands for the time since the one before it; the first holds before it, the last after it."""

    source = SAMPLED_SOURCE
    assumptions = None

    def __init__(self, times: Sequence[float], watts: Sequence[float]) -> None:
        self.times = np.asarray(times, dtype=float)
        self.watts = np.asarray(watts, dtype=float)

    def joules(self, start: float, end: float) -> Optional[float]:
        """Joules from `start` to `end` (None: no samples, or an empty span)."""
        if not len(self.times) or end < start:
            return None
        low = np.concatenate(([-np.inf], self.times))
        high = np.concatenate((self.times, [np.inf]))
        watts = np.concatenate((self.watts, self.watts[-1:]))
        overlap = np.clip(np.minimum(end, high) - np.maximum(start, low), 0.0, None)
        return float(np.sum(overlap * watts))


def gpu_power(values: dict[str, float]) -> Optional[float]:
    """The GPUs' power in one sample, summed (None: no GPU power in it)."""
    watts = [v for k, v in values.items() if k.startswith(GPU_PREFIX) and k.endswith(POWER_SUFFIX)]
    return sum(watts) if watts else None


def sampled_power(samples: Sequence[SampleLike]) -> Optional[SampledPower]:
    """The meter of a run's /metrics samples with the GPUs' power (None: none holds any)."""
    points = [(s.t, w) for s in samples if (w := gpu_power(dict(s.values))) is not None]
    if not points:
        return None
    times, watts = zip(*points)
    return SampledPower(times, watts)
