"""A profile's power model (`simulator.sim.profile.PowerSettings`) fitted to what NVML measured during live
runs: `agentload calibrate --power-from FOLDER...` reads each result folder's server_metrics.jsonl, whose
samples hold the GPUs' board power (``gpu{i}_power_w``) and utilisation (``gpu{i}_util_perc``) beside
vLLM's token counters, when the scenario's target has ``gpu_metrics: true``.

NVML gives a board's power and utilisation as averages over a short period before the reading, so each
sample stands for the interval since the one before it: its power (summed over the GPUs) is the
interval's, its utilisation (the share of the period in which a kernel ran, averaged over the GPUs) the
engine's busy share; the tokens computed in the interval are the counters' increase, prompt tokens less
the prefix cache's hits plus output tokens, per second. The power model says, per interval::

    watts = gpus x idle_w + gpus x (busy_w - idle_w) x busy share + per_token_j x tokens per second

which is linear in (idle_w, busy_w - idle_w, per_token_j): non-negative least squares
(`scipy.optimize.lsq_linear`) gives them, and their standard errors come from the residuals. A
calibration needs both idle and busy intervals (a run whose load comes and goes: agent traffic has tool
time), and tokens at more than one rate for the per-token term; otherwise it says which is missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

import numpy as np
from scipy.optimize import lsq_linear

from ..errors import InputError
from ..metrics.energy import POWER_SUFFIX
from ..metrics.server import GPU_PREFIX, SERVER_METRICS_FILE, read_samples
from ..sim.profile import PowerSettings

UTIL_SUFFIX = "_util_perc"
MIN_INTERVALS = 10
"""Intervals (pairs of samples in a row) a fit needs at the least."""
MIN_SPREAD = 0.2
"""The busy share must range at least this far over the intervals (idle and busy both seen)."""


@dataclass(frozen=True)
class PowerIntervals:
    """The intervals between consecutive samples: their length, the GPUs' mean power (summed), the busy
    share and the tokens computed per second (None: the samples hold no token counters)."""

    gpus: int
    seconds: np.ndarray
    watts: np.ndarray
    busy: np.ndarray
    token_rate: Optional[np.ndarray]


@dataclass(frozen=True)
class PowerFit:
    """The fitted power model, with how well it reproduces the intervals."""

    power: PowerSettings
    stderr: dict[str, float]
    """Standard error of `idle_w`, `busy_w` and `per_token_j` (0: fitted at the bound of 0, or not fitted)."""
    intervals: int
    rms_w: float
    """Root mean square of the predicted minus measured power over the intervals, watts."""
    mean_w: float
    """The measured power's mean over the intervals, watts."""

    def report(self) -> str:
        """The fit in a few lines, for the terminal."""
        p, err = self.power, self.stderr
        lines = [f"power model fitted to {self.intervals:,} intervals of NVML samples, {p.gpus} GPU(s):",
                 f"  idle_w       {p.idle_w:10.1f} W  ± {err['idle_w']:.1f} (per GPU)",
                 f"  busy_w       {p.busy_w:10.1f} W  ± {err['busy_w']:.1f} (per GPU)",
                 f"  per_token_j  {p.per_token_j:10.4f} J  ± {err['per_token_j']:.4f} (whole server)",
                 f"  rms error {self.rms_w:.1f} W over a mean of {self.mean_w:.1f} W "
                 f"({self.rms_w / self.mean_w:.1%})" if self.mean_w > 0 else f"  rms error {self.rms_w:.1f} W"]
        return "\n".join(lines)


def _gpu_keys(values: Mapping[str, float], suffix: str) -> list[str]:
    return sorted(k for k in values if k.startswith(GPU_PREFIX) and k.endswith(suffix))


def _computed_tokens(values: Mapping[str, float]) -> Optional[float]:
    """Tokens computed so far: prompt tokens less the prefix cache's hits, plus output tokens."""
    if "generation_tokens" not in values or "prompt_tokens" not in values:
        return None
    cached = values.get("prompt_tokens_cached", values.get("prefix_cache_hits", 0.0))
    return values["prompt_tokens"] - cached + values["generation_tokens"]


def intervals_of(samples: Sequence[Mapping[str, float]], source: str = "<samples>") -> PowerIntervals:
    """The intervals of one run's samples (each a mapping with its time ``t`` and values by name); only
    samples with every GPU's power and utilisation count. InputError naming `source` without them."""
    keyed = [s for s in samples if _gpu_keys(s, POWER_SUFFIX)]
    if not keyed:
        raise InputError("no GPU power samples (gpu<i>_power_w): run the scenario with target.gpu_metrics: true "
                         "on a machine with nvidia-ml-py and a GPU", file=source)
    power_keys = _gpu_keys(keyed[0], POWER_SUFFIX)
    util_keys = [k.removesuffix(POWER_SUFFIX) + UTIL_SUFFIX for k in power_keys]
    rows = [s for s in keyed if all(k in s for k in (*power_keys, *util_keys))]
    t = np.array([float(s["t"]) for s in rows])
    watts = np.array([sum(float(s[k]) for k in power_keys) for s in rows])
    busy = np.array([np.mean([float(s[k]) for k in util_keys]) / 100.0 for s in rows])
    tokens = [_computed_tokens(s) for s in rows]
    seconds = np.diff(t)
    keep = seconds > 0
    token_rate = None
    if rows and all(v is not None for v in tokens):
        counts = np.array(tokens, dtype=float)
        steps = np.diff(counts)
        steps = np.where(steps >= 0, steps, counts[1:])  # a counter that fell back: the server restarted
        token_rate = (steps / np.where(keep, seconds, 1.0))[keep]
    return PowerIntervals(gpus=len(power_keys), seconds=seconds[keep],
                          watts=watts[1:][keep], busy=busy[1:][keep], token_rate=token_rate)


def read_intervals(folders: Sequence[Path]) -> PowerIntervals:
    """The intervals of every folder's server_metrics.jsonl, pooled (the folders' GPU counts must agree)."""
    parts = []
    for folder in folders:
        source = str(Path(folder) / SERVER_METRICS_FILE)
        samples = read_samples(Path(folder))
        if not samples:
            raise InputError("no /metrics samples (server_metrics.jsonl missing or empty)", file=source)
        parts.append(intervals_of(samples, source))
    gpus = {p.gpus for p in parts}
    if len(gpus) > 1:
        raise InputError(f"the folders were measured on different GPU counts ({', '.join(map(str, sorted(gpus)))})",
                         field="--power-from")
    rates = [p.token_rate for p in parts]
    return PowerIntervals(
        gpus=parts[0].gpus, seconds=np.concatenate([p.seconds for p in parts]),
        watts=np.concatenate([p.watts for p in parts]), busy=np.concatenate([p.busy for p in parts]),
        token_rate=None if any(r is None for r in rates) else np.concatenate(rates))  # type: ignore[arg-type]


def fit_power(data: PowerIntervals, *, source: str = "") -> PowerFit:
    """The power model that best reproduces the intervals' power, weighted by their length (see the module
    doc). InputError when the intervals cannot tell idle from busy power."""
    n = len(data.seconds)
    if n < MIN_INTERVALS:
        raise InputError(f"{n} intervals of NVML samples; a power fit needs {MIN_INTERVALS} or more",
                         field="--power-from")
    if float(np.ptp(data.busy)) < MIN_SPREAD:
        raise InputError(f"the GPUs' utilisation ranged over {float(np.ptp(data.busy)):.0%} only: a power fit needs "
                         "idle and busy stretches (a run whose load comes and goes)", field="--power-from")
    g = float(data.gpus)
    columns = [np.full(n, g), g * data.busy]
    tokens = data.token_rate is not None and float(np.ptp(data.token_rate)) > 0
    if tokens:
        columns.append(data.token_rate)
    a = np.column_stack(columns)
    weight = np.sqrt(data.seconds / data.seconds.mean())  # a long interval counts for its length
    fit = lsq_linear(a * weight[:, None], data.watts * weight, bounds=(0.0, np.inf))
    x = fit.x
    residual = a @ x - data.watts
    dof = max(1, n - a.shape[1])
    sigma2 = float(np.sum(weight ** 2 * residual ** 2)) / dof
    aw = a * weight[:, None]
    cov = sigma2 * np.linalg.pinv(aw.T @ aw)
    err = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    free = fit.active_mask == 0  # not held at the bound of 0
    idle, extra = float(x[0]), float(x[1])
    per_token = float(x[2]) if tokens else 0.0
    stderr = {"idle_w": float(err[0]) if free[0] else 0.0,
              "busy_w": float(np.sqrt(max(0.0, cov[0, 0] + cov[1, 1] + 2 * cov[0, 1]))) if free[1] else 0.0,
              "per_token_j": float(err[2]) if tokens and free[2] else 0.0}
    rms = float(np.sqrt(np.average(residual ** 2, weights=data.seconds)))
    mean = float(np.average(data.watts, weights=data.seconds))
    text = source or f"fitted by agentload calibrate to {n:,} intervals of NVML samples, rms {rms:.1f} W"
    power = PowerSettings(gpus=data.gpus, idle_w=idle, busy_w=idle + extra, per_token_j=per_token, source=text)
    return PowerFit(power, stderr, n, rms, mean)
