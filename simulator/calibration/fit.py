"""Fit a profile's step-time coefficients to measurements of the calibration sweep
(`simulator.calibration.sweep`), with the twin (`simulator.calibration.on_twin`) as the model.

Where the requests of a burst reach the engine together, the twin's schedule does not depend on the
step-time coefficients, so each measured value is linear in them: its feature for a term is what the
twin predicts with that coefficient set to 1 and all others to 0, and non-negative least squares
(`scipy.optimize.nnls`) on relative errors fits them. The API server's one-at-a-time work
(`FRONTEND_TERMS`) staggers a burst's arrivals, which moves requests from one step to the next, and a
loaded point's calls are sent at set times, which land in steps as long as the steps last: these
values are not linear, so the linear fit takes the other points only, and the fit goes on over all of
them from its solution by bounded nonlinear least squares (`scipy.optimize.least_squares`) with the
twin itself as the model. The latency outside the engine (`request_overhead`) adds once to every
value. Scheduling overhead is not separable from outside the server (it adds to the fixed and
per-sequence terms), so the fitted profile has synchronous scheduling and no overhead terms.
Speculative decoding is not fitted (calibrate with it off).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np
from scipy.optimize import least_squares, nnls

from ..sim.profile import STEP_SETTINGS, CalibrationRecord, ServerProfile
from .on_twin import measure_on_twin
from .sweep import LOADED_SHORT, SweepPoint

FIT_TERMS = ("fixed", "per_token", "per_decode_seq", "per_context_token", "per_prefill_attention",
             "per_mixed_context_token", "request_overhead", "frontend_per_request", "frontend_per_prompt_token",
             "frontend_per_output_token", "idle_wake", "per_new_shape", "wake_slowdown")
"""The identifiable terms: per step, per scheduled token, per decoding sequence (beyond its token), per
attended token, per query-key pair of prefill, latency outside the engine, and the API server's
one-at-a-time work per request and per prompt token. A single request's TTFT is the request's handling
plus its prefill steps, so the prefill rows' intercept gives the handling and their curvature the
prefill attention, and the decode rows (many steps per request) give `fixed`; cached prompts separate
the per-prompt-token handling from prefill compute, and bursts its one-at-a-time part from plain
latency; single requests decoding at several contexts separate the attended-context term from the
per-sequence ones; prefills after a pause give the cost of waking an idle engine and a long decode after
one how much slower its steps run while it warms up, prefills after one of
their size against prefills of new sizes the cost of a step of a new size; short calls sent while
streams decode give the API server's work per streamed token, which delays them by the streams' tokens
of every step, and calls sent while streams of a long context decode what their context costs in the
steps that mix a prefill chunk with their decodes."""

FRONTEND_TERMS = frozenset({"frontend_per_request", "frontend_per_prompt_token", "frontend_per_output_token"})
"""Terms that change when a burst's requests reach the engine, not only how long steps take."""

NONLINEAR_TERMS = FRONTEND_TERMS | {"wake_slowdown"}
"""Terms the measurements are not linear in: the API server's (above), and the slowdown after a wake,
a factor on other terms' time. The linear first fit leaves them out."""

WAKE_SLOWDOWN_SCALE = 0.05
"""The step of `wake_slowdown` the nonlinear search scales from when it starts at 0 (a 5% slowdown)."""

FRONTEND_SHARES = (0.1, 0.3, 0.5, 0.7, 0.9)
"""Shares of the linear fit's `request_overhead` the nonlinear search starts from as the API server's
one-at-a-time work; the best fit of these starts is kept. Burst values jump where a request moves to
the next step, and a search from a single start can stall on such a jump far from the best fit."""

MIXED_STARTS = (0.5, 1.0, 2.0)
"""Starts of `per_mixed_context_token` for the second stage, in units of the plain context term's linear
fit; the best fit of these is kept (it trades against the per-token work on the same points)."""

REPRODUCED = 1e-4
"""An rms relative error below which a fit reproduces the measurements: a server's own repeat-to-repeat
noise is ten times more at least, so only a twin's measurements are fitted this closely. A search stops
where it gets there, and the starts not yet searched are not tried: none could do better by anything a
measurement tells."""


@dataclass(frozen=True)
class FitResult:
    """Fitted coefficients, their standard errors, and how well the fit reproduces the sweep."""

    coefficients: dict[str, float]
    stderr: dict[str, float]
    """Standard error of each coefficient (from the residuals; 0 for a term fitted at its bound)."""
    points: tuple[SweepPoint, ...]
    measured: tuple[float, ...]
    predicted: tuple[float, ...]
    profile: ServerProfile
    """The input profile with the fitted coefficients (uncalibrated terms zeroed)."""

    @property
    def relative_errors(self) -> tuple[float, ...]:
        return tuple(p / m - 1 for p, m in zip(self.predicted, self.measured))

    @property
    def rms_relative_error(self) -> float:
        errors = np.asarray(self.relative_errors)
        return float(np.sqrt(np.mean(errors ** 2))) if errors.size else 0.0


def unit_profile(profile: ServerProfile, term: str) -> ServerProfile:
    """`profile` with every step-time coefficient 0 but `term` (1), synchronous, no speculation."""
    zero = {name: 0.0 for name in type(profile.step_time).model_fields if name not in STEP_SETTINGS}
    zero[term] = 1.0
    return profile.model_copy(update={
        "step_time": profile.step_time.model_copy(update=zero),
        "scheduler": profile.scheduler.model_copy(update={"async_scheduling": False}),
        "spec_decode": profile.spec_decode.model_copy(update={"num_tokens": 0, "acceptance": 0.0}),
    })


def feature_matrix(points: Sequence[SweepPoint], profile: ServerProfile,
                   terms: Sequence[str] = FIT_TERMS) -> np.ndarray:
    """Rows: sweep points; columns: terms; entry: the measured value per unit of that coefficient."""
    units = [unit_profile(profile, term) for term in terms]
    return np.array([[measure_on_twin(point, unit) for unit in units] for point in points])


def with_coefficients(profile: ServerProfile, coefficients: dict[str, float]) -> ServerProfile:
    """`profile` with these step-time coefficients and all other fitted ones 0, synchronous scheduling,
    marked calibrated."""
    values = {name: 0.0 for name in type(profile.step_time).model_fields if name not in STEP_SETTINGS}
    values.update(coefficients)
    return profile.model_copy(update={
        "step_time": profile.step_time.model_copy(update=values),
        "scheduler": profile.scheduler.model_copy(update={"async_scheduling": False}),
        "calibrated": True,
    })


def fit(points: Sequence[SweepPoint], measured: Sequence[float], profile: ServerProfile,
        terms: Sequence[str] = FIT_TERMS) -> FitResult:
    """Least squares on relative errors, coefficients non-negative: linear for the step terms over the
    points linear in them, then nonlinear on the twin over all points when `terms` has API-server terms
    or the sweep has loaded points. Returns the coefficients and `profile` with them."""
    if len(points) != len(measured):
        raise ValueError("one measurement per sweep point")
    y = np.asarray(measured, dtype=float)
    if np.any(y <= 0):
        raise ValueError("measurements must be positive")
    linear = [t for t in terms if t not in NONLINEAR_TERMS]
    rows = [i for i, p in enumerate(points) if p.kind != "loaded"]
    if not rows:
        raise ValueError("the sweep needs points other than loaded ones")
    x = feature_matrix([points[i] for i in rows], profile, linear)
    jacobian = x / y[rows, None]
    theta = np.zeros(len(linear))
    shown = _shown_terms([points[i] for i in rows], profile, linear, x)
    if shown:
        theta[shown], _ = nnls(jacobian[:, shown], np.ones(len(rows)))
    coefficients = {term: float(v) for term, v in zip(linear, theta)}
    if len(linear) < len(terms) or len(rows) < len(points):
        coefficients, jacobian, predicted = _fit_frontend(points, y, profile, list(terms), coefficients, x, rows)
    else:
        predicted = x @ theta
    values = np.array([coefficients[t] for t in terms])
    residual = predicted / y - 1
    stderr = np.zeros(len(terms))
    free = values > 0
    dof = len(y) - int(free.sum())
    covariance: dict[str, dict[str, float]] = {}
    if dof > 0 and free.any():
        sigma2 = float(residual @ residual) / dof
        sub = jacobian[:, free]
        # columns scaled to unit length first: per unit of coefficient they span many decades (a
        # fraction's against a nanosecond's), beyond what the inverse of their products resolves
        norms = np.linalg.norm(sub, axis=0)
        norms[norms == 0] = 1.0
        scaled = sub / norms
        cov = sigma2 * np.linalg.pinv(scaled.T @ scaled) / np.outer(norms, norms)
        stderr[free] = np.sqrt(np.clip(np.diag(cov), 0, None))
        names = [t for t, f in zip(terms, free) if f]
        covariance = {a: {b: float(cov[i, j]) for j, b in enumerate(names)} for i, a in enumerate(names)}
    coefficients = {t: coefficients[t] for t in terms}
    record = CalibrationRecord(
        rms_relative_error=float(np.sqrt(np.mean(residual ** 2))), points=len(y),
        worst_relative_error=float(np.max(np.abs(residual))),
        terms={t: float(e / v) if v > 0 else 0.0 for t, v, e in zip(terms, values, stderr)},
        covariance=covariance, residuals=[round(float(r), 4) for r in residual])
    return FitResult(coefficients, {t: float(e) for t, e in zip(terms, stderr)}, tuple(points),
                     tuple(float(v) for v in y), tuple(float(v) for v in predicted),
                     with_coefficients(profile, coefficients).model_copy(update={"calibration": record}))


def _shown_terms(points: Sequence[SweepPoint], profile: ServerProfile, terms: Sequence[str],
                 x: np.ndarray) -> list[int]:
    """The columns of `x` (features of `terms` at `points`) whose term changes the twin's value at some
    point. Each column also holds what the settings outside the fit take (the twin with every term at
    0); a term that no point shows (the mixed steps' context cost in a sweep without a decode batch
    large enough to mix a prefill chunk in) has only that, and the linear fit would use it as one more
    intercept, at any size: such a term stays 0 until the nonlinear search, which sees it on the
    loaded points."""
    zero = unit_profile(profile, terms[0])
    zero = zero.model_copy(update={"step_time": zero.step_time.model_copy(update={terms[0]: 0.0})})
    baseline = np.array([measure_on_twin(point, zero) for point in points])
    return [j for j in range(len(terms)) if not np.allclose(x[:, j], baseline, rtol=1e-9, atol=0.0)]


def _fit_frontend(points: Sequence[SweepPoint], y: np.ndarray, profile: ServerProfile, terms: list[str],
                  linear: dict[str, float], x: np.ndarray,
                  rows: list[int]) -> tuple[dict[str, float], np.ndarray, np.ndarray]:
    """Nonlinear least squares over `terms` and all points from the `linear` fit (features `x` of the
    points `rows`), in two stages when the API server's per-token work is a term: first every other
    term but the mixed steps' context cost, over every point but the short calls under load and the
    points of long-context streams, from the linear fit with a part of its `request_overhead` moved to
    the API server's per-request work (each of `FRONTEND_SHARES` in turn); then all of them over all
    points, from the best of those, the per-token work started from what the short calls under load
    take beyond its prediction and the mixed cost from each of `MIXED_STARTS` (searched from the linear
    fit at once, the per-token work can stall the search far from the best fit). The twin with no
    per-token work is not the limit of a little: its tokens never wait for the API server, where any
    per-token work makes them wait for a request's intake under way. So each second-stage start is
    also searched with the per-token work held at 0, and the best of all is kept (a stage's starts are
    searched in turn, and one that reproduces the measurements ends the search: `REPRODUCED`). Returns
    the coefficients, the Jacobian of the relative residuals per unit coefficient, and the twin's value
    at every point with those coefficients."""
    overhead = linear.get("request_overhead", 0.0)
    # each coefficient in units of a scale (its start, or what makes it 1% of a typical measurement):
    # the search then steps every term by the same relative amount
    typical = float(np.median(y))
    fitted = [points[i] for i in rows]
    columns = dict(zip([t for t in terms if t not in NONLINEAR_TERMS], x.T))
    per_request = columns.get("request_overhead", np.ones(len(rows)))
    columns.setdefault("frontend_per_request", per_request)
    columns.setdefault("frontend_per_prompt_token", per_request * np.array([p.input_tokens for p in fitted]))
    # the tokens of one step of the burst, as a scale only
    columns.setdefault("frontend_per_output_token", per_request * np.array([p.concurrency for p in fitted]))
    floor = {t: 0.01 * typical / float(np.median(columns[t][columns[t] > 0])) if np.any(columns[t] > 0) else 1.0
             for t in terms if t in columns}
    floor.setdefault("wake_slowdown", WAKE_SLOWDOWN_SCALE)
    if "per_mixed_context_token" in terms:  # only loaded points have it: scaled as the plain context's
        floor["per_mixed_context_token"] = linear.get("per_context_token") or floor.get("per_context_token", 1.0)
    per_token = "frontend_per_output_token" in terms
    everything = list(range(len(points)))
    # the streams' tokens wait for the API server in the mixed steps of long-context streams too, so
    # those points and their term join the second stage with the per-token work
    later = {"frontend_per_output_token", "per_mixed_context_token"} if per_token else set()
    first_terms = [t for t in terms if t not in later]
    first_rows = [i for i in everything
                  if not (per_token and (_short_under_load(points[i]) or points[i].stream_context))]

    def search(free: list[str], start: dict[str, float], used: list[int]) -> tuple[float, dict[str, float]]:
        scale = np.array([start[t] if start[t] > 0 else floor[t] for t in free])

        def model(units: np.ndarray) -> ServerProfile:
            return with_coefficients(profile, {**start, **dict(zip(free, units * scale))})

        def residuals(units: np.ndarray) -> np.ndarray:
            m = model(units)
            found = np.array([measure_on_twin(points[i], m) for i in used]) / y[used] - 1
            if np.sqrt(np.mean(found ** 2)) < REPRODUCED:
                raise _Reproduced(units.copy(), 0.5 * float(found @ found))
            return found

        # steps of 3% of each scale: smaller ones see single requests cross step boundaries, and a
        # burst's steps change sizes (kernel-cache misses), as jumps rather than the trend
        try:
            result = least_squares(residuals, np.array([start[t] for t in free]) / scale, bounds=(0.0, np.inf),
                                   diff_step=0.03, method="trf")
            x, cost = result.x, result.cost
        except _Reproduced as reproduced:
            x, cost = reproduced.units, reproduced.cost
        units = np.where(x < 1e-6, 0.0, x)  # a term the search ran down to its bound
        return cost, {**start, **dict(zip(free, (float(v) for v in units * scale)))}

    def from_share(share: float) -> dict[str, float]:
        start = {t: linear.get(t, 0.0) for t in terms}
        if "frontend_per_request" in start and overhead > 0:
            start["frontend_per_request"] = share * overhead
            start["request_overhead"] = (1 - share) * overhead
        return start

    def best_of(searches: Iterable[Callable[[], tuple[float, dict[str, float]]]], rows: int) -> dict[str, float]:
        """The coefficients of the search (over `rows` points) that ends at the least cost, the searches
        run in turn until one reproduces the measurements (`REPRODUCED`)."""
        found = []
        for run in searches:
            found.append(run())
            if found[-1][0] < 0.5 * rows * REPRODUCED ** 2:  # cost: half the sum of squared residuals
                break
        return min(found, key=lambda result: result[0])[1]

    shares = FRONTEND_SHARES if "frontend_per_request" in terms and overhead > 0 else (0.0,)
    best = best_of((functools.partial(search, first_terms, from_share(share), first_rows) for share in shares),
                   len(first_rows))
    if per_token:
        first = best
        per_token_start = _per_token_start(points, y, profile, first) or floor["frontend_per_output_token"]
        starts = ([{**first, "per_mixed_context_token": m * floor["per_mixed_context_token"]} for m in MIXED_STARTS]
                  if "per_mixed_context_token" in terms else [first])
        # every start twice: with the per-token work, and without it (no per-token work is not the limit
        # of a little), the second stage's best over all points kept
        no_per_token = [t for t in terms if t != "frontend_per_output_token"]
        best = best_of(itertools.chain(
            (functools.partial(search, terms, {**start, "frontend_per_output_token": per_token_start}, everything)
             for start in starts),
            (functools.partial(search, no_per_token, {**start, "frontend_per_output_token": 0.0}, everything)
             for start in starts)), len(everything))
    jacobian, predicted = _jacobian(points, y, profile, best, terms)
    return best, jacobian, predicted


class _Reproduced(Exception):
    """A search got to coefficients that reproduce the measurements (`REPRODUCED`): where, in units of
    the search's scales, and the cost there."""

    def __init__(self, units: np.ndarray, cost: float) -> None:
        super().__init__()
        self.units = units
        self.cost = cost


def _jacobian(points: Sequence[SweepPoint], y: np.ndarray, profile: ServerProfile, coefficients: dict[str, float],
              terms: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """The relative residuals' derivative per unit of each of `terms` at `coefficients`, by forward
    differences of 1% of the term (smaller ones would see single requests cross step boundaries),
    after the twin's values at `coefficients` it differences from; columns of terms at 0 are left 0:
    the standard errors leave them out."""
    model = with_coefficients(profile, coefficients)
    base = np.array([measure_on_twin(p, model) for p in points])
    columns = []
    for term in terms:
        value = coefficients.get(term, 0.0)
        if value <= 0:
            columns.append(np.zeros(len(points)))
            continue
        step = 0.01 * value
        moved = with_coefficients(profile, {**coefficients, term: value + step})
        columns.append((np.array([measure_on_twin(p, moved) for p in points]) - base) / (y * step))
    return np.array(columns).T, base


def _short_under_load(point: SweepPoint) -> bool:
    """A loaded point whose calls are short: what it measures beyond the steps is mostly the API
    server's per-token work (and, among streams of a long context, the mixed steps' cost of it)."""
    return point.kind == "loaded" and point.input_tokens <= LOADED_SHORT


def _per_token_start(points: Sequence[SweepPoint], y: np.ndarray, profile: ServerProfile,
                     coefficients: dict[str, float]) -> float:
    """A first guess of `frontend_per_output_token`: the median over the loaded points' short calls
    among streams of one block of what they take beyond the prediction of `coefficients` (which have
    none), shared out over the streams' tokens of one step and the call's own; 0 without such points or
    excess."""
    model = with_coefficients(profile, coefficients)
    excess = [(y[i] - measure_on_twin(p, model)) / (p.concurrency + 1)
              for i, p in enumerate(points) if _short_under_load(p) and not p.stream_context]
    return max(0.0, float(np.median(excess))) if excess else 0.0
