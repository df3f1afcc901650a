"""The band on a simulation's figures, propagated from the calibration's fit.

A calibrated profile's coefficients are estimates: the fit records their covariance and what each sweep
point's prediction missed by (`CalibrationRecord.covariance`, `residuals`). The band simulates the same
plan (the same workload and settings) again on `draws` profiles drawn from that fit, without a result
folder: each draw's records feed a tally, and its figures come from the tally by the summary's own code
(`simulator.metrics.summary.from_tally`). Draw k:

- the fitted terms from a multivariate normal around the profile's values with the fit's covariance
  (a profile calibrated before the covariance was recorded: each term on its own, from its relative
  standard error), each term's standard deviation held to at most `MAX_RELATIVE_SD` of its value and
  the draw clipped at 0;
- then every time the step-time model charges (`TIME_TERMS`) multiplied by one speed factor
  1 / (1 + r), r one of the fit's residuals drawn at random (a bootstrap: what a sweep point's prediction
  missed by, a prediction of other traffic can miss by; without recorded residuals, r is normal with the
  fit's rms error).

A scenario that leans on terms the sweep pinned down loosely (prompts longer than it sent, batches
larger) moves more between draws, so the band widens where the prediction extrapolates.

Each figure's band is the lowest and the highest value over the nominal simulation and the draws: the
range of 1 + K simulations, not a confidence interval. It is deterministic: the draws come from a
generator seeded by the run's seed. An uncalibrated profile (the GB300 presets) has no fit to draw from,
so no band, and costs nothing more.
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Optional

import numpy as np

from ..metrics.results import Window
from ..metrics.slo import Slo
from ..metrics.summary import BandRange, SimulationBand, Summary, banded_values, from_tally
from ..metrics.tally import RunTally
from ..workload import Workload
from .driver import SimDriver
from .profile import CalibrationRecord, ServerProfile, StepTimeCoefficients

DEFAULT_DRAWS = 8
"""Simulations on drawn profiles beside the nominal one, unless asked otherwise (`--band-draws`)."""

NOT_TIMES = frozenset({"idle_after", "wake_period", "shape_cache", "frontend_contention", "wake_slowdown"})
"""Step-time fields that are no time the server spends: thresholds, a count, factors."""

TIME_TERMS = tuple(name for name in StepTimeCoefficients.model_fields if name not in NOT_TIMES)
"""The step-time model's times (per step, per token, per request, in the engine and in the API server),
which the speed factor of a draw scales together."""

MAX_RELATIVE_SD = 0.5
"""The largest standard deviation of a drawn term, relative to its fitted value. A term the sweep barely
shows (a fitted value near 0 with a standard error many times it, such as `wake_slowdown` or
`per_mixed_context_token` on a CPU server) has that error because the sweep lets other terms stand in
for it, not because the server's speed is that uncertain; drawn at its full error and clipped at 0, it
would come out positive and large in most draws, a bias that makes every draw slower than the fit. Held
to half its value (its correlations kept), it stays what the fit says: a small term, maybe twice as large,
maybe none."""

BAND_STREAM = 0xBA4D
"""Mixed into the run's seed, so the draws' generator is not the workload's."""


def no_band_reason(profile: ServerProfile) -> Optional[str]:
    """Why `profile` gives no band (None: it gives one)."""
    if not profile.calibrated:
        return "no band: uncalibrated profile (no fit to draw its coefficients from)"
    if profile.calibration is None:
        return "no band: the profile is marked calibrated but records no fit"
    return None


def method_text(record: CalibrationRecord, draws: int) -> str:
    """One line saying what the band of `draws` draws is and what it drew from."""
    terms = ("the fitted terms drawn from the fit's covariance" if record.covariance
             else "the fitted terms drawn one by one from their relative standard errors (no covariance recorded)")
    speed = (f"the server's speed from the fit's {len(record.residuals)} residuals" if record.residuals
             else f"the server's speed from a normal of the fit's {record.rms_relative_error:.1%} rms error "
                  "(no residuals recorded)")
    return (f"range of 1 + {draws} simulations: {terms} (spread at most {MAX_RELATIVE_SD:.0%} of each), "
            f"clipped at 0; {speed}")


def drawn_profiles(profile: ServerProfile, draws: int, seed: int) -> list[ServerProfile]:
    """`draws` profiles drawn from `profile`'s calibration record (see the module doc), the same for the
    same seed."""
    record = profile.calibration
    assert record is not None, "a profile without a calibration record has no band"
    values = profile.step_time.model_dump()
    if record.covariance:
        terms = [t for t in record.covariance if t in values]
        cov = np.array([[record.covariance[a].get(b, 0.0) for b in terms] for a in terms])
    else:
        terms = [t for t, rel in record.terms.items() if t in values and rel > 0 and values[t] > 0]
        cov = np.diag([(record.terms[t] * values[t]) ** 2 for t in terms])
    mean = np.array([values[t] for t in terms], dtype=float)
    cov = held_spread(cov, mean)
    rng = np.random.default_rng([BAND_STREAM, seed & (2 ** 64 - 1)])
    out = []
    for _ in range(draws):
        coefficients = dict(zip(terms, np.clip(rng.multivariate_normal(mean, cov, method="eigh"), 0.0, None)
                                if terms else ()))
        if record.residuals:
            miss = float(rng.choice(np.asarray(record.residuals, dtype=float)))
        else:
            miss = float(rng.normal(0.0, record.rms_relative_error))
        speed = 1.0 / (1.0 + max(miss, -0.9))  # a point predicted 10% slow: the server 1/1.1 of the twin's times
        update = {t: float(coefficients.get(t, values[t])) * speed for t in TIME_TERMS}
        update.update({t: float(v) for t, v in coefficients.items() if t not in update})
        out.append(profile.model_copy(update={"step_time": profile.step_time.model_copy(update=update)}))
    return out


def held_spread(cov: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """`cov` with each term's standard deviation held to `MAX_RELATIVE_SD` of its value in `mean`, the
    correlations between terms kept."""
    if not cov.size:
        return cov
    sd = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    limit = MAX_RELATIVE_SD * np.abs(mean)
    scale = np.where(sd > limit, np.divide(limit, sd, out=np.zeros_like(sd), where=sd > 0), 1.0)
    return cov * np.outer(scale, scale)


def figures_on(profile: ServerProfile, workload: Workload, *, window: Window, slo: Slo,
               planned: Optional[Mapping[str, Any]], driver: Mapping[str, Any], fast_decode: bool) -> dict[str, float]:
    """The banded figures (`simulator.metrics.summary.BANDED_FIGURES`) of `workload` simulated on
    `profile`: records into a tally, no folder, no scrapes (which leave the records as they are)."""
    tally = RunTally(window, slo)
    SimDriver(workload, profile, tally, keep_gaps=False, fast_decode=fast_decode, **driver).run()
    summary, _ = from_tally(tally, planned=planned)
    return banded_values(summary)


def simulate_band(workload: Workload, profile: ServerProfile, nominal: Summary, *, window: Window = Window(),
                  slo: Slo = Slo(), planned: Optional[Mapping[str, Any]] = None,
                  driver: Optional[Mapping[str, Any]] = None, seed: int = 0, draws: int = DEFAULT_DRAWS,
                  fast_decode: bool = True) -> SimulationBand:
    """The band of `nominal` (the summary of `workload` simulated on `profile` with these settings: the
    run's window, SLO, planned counts and driver settings) from `draws` more simulations; without a
    band (an uncalibrated profile, no draws), the section says why."""
    reason = no_band_reason(profile)
    if reason is None and draws <= 0:
        reason = "no band: no draws asked for"
    if reason is not None:
        return SimulationBand(draws=0, note=reason)
    started = time.perf_counter()
    values = banded_values(nominal)
    seen: dict[str, list[float]] = {key: [value] for key, value in values.items()}
    for drawn in drawn_profiles(profile, draws, seed):
        found = figures_on(drawn, workload, window=window, slo=slo, planned=planned, driver=driver or {},
                           fast_decode=fast_decode)
        for key, series in seen.items():
            if key in found:
                series.append(found[key])
    assert profile.calibration is not None
    return SimulationBand(
        draws=draws, method=method_text(profile.calibration, draws),
        figures={key: BandRange(value=values[key], low=min(series), high=max(series)) for key, series in seen.items()},
        wall_seconds=time.perf_counter() - started)
