"""Fit a profile's step-time coefficients to measurements of a designed sweep.

The sweep has two kinds of points, each a burst of identical requests sent at once to an idle
server with no shared prefix:

- ``prefill``: one request of P prompt tokens and one output token; measured: its TTFT (the sum of
  its prefill steps, chunked by the token budget);
- ``prefill`` after a pause (``idle`` > 0): the same, sent once the server has been idle that long;
  the difference to the back-to-back point is the engine's ``idle_wake``;
- ``decode``: B requests of P prompt tokens and O output tokens; measured: the mean end-to-end
  latency over the requests (their prefill, then O - 1 decode steps of up to B sequences at growing
  context). End to end rather than inter-token: a busy server merges several tokens into one
  streamed chunk, which delays the first token and shortens the gaps, but leaves the end in place.

Because the twin's schedule for such a burst does not depend on the coefficients, each measured
value is linear in them: its feature for a term is what the twin predicts with that coefficient set
to 1 and all others to 0. The fit is then non-negative least squares (`scipy.optimize.nnls`) on
relative errors. The per-request overhead outside the engine (`request_overhead`) adds once to every
value. Scheduling overhead is not separable from outside the server (it adds to the fixed
and per-sequence terms), so the fitted profile has synchronous scheduling and no overhead terms.
Speculative decoding is not fitted (calibrate with it off).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np
import simpy
from scipy.optimize import nnls

from .profile import ServerProfile
from .twin import Twin

FIT_TERMS = ("fixed", "per_token", "per_decode_seq", "per_context_token", "per_prefill_attention",
             "request_overhead", "idle_wake")
"""The identifiable terms: per step, per scheduled token, per decoding sequence (beyond its token), per
attended token, per query-key pair of prefill, and per request outside the engine. A single request's
TTFT is `request_overhead` plus its prefill steps, so the prefill rows' intercept gives the overhead
and their curvature the prefill attention, and the decode rows (many steps per request) give `fixed`;
single requests decoding at several contexts separate the attended-context term from the per-sequence
ones; prefills after a pause give the cost of waking an idle engine."""

SETTINGS = frozenset({"idle_after"})
"""Step-time fields that are settings, not coefficients: calibration keeps them as the profile has them."""

WAKE_PAUSE = 0.5
"""Seconds of quiet before the sweep's wake-up points: well past any `idle_after` a server needs."""


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """One measurement of the sweep."""

    kind: str
    """'prefill' (value: TTFT) or 'decode' (value: mean end-to-end latency)."""
    concurrency: int
    input_tokens: int
    output_tokens: int
    idle: float = 0.0
    """Seconds the server is left idle before the burst is sent."""

    def label(self) -> str:
        pause = f" after {self.idle:g} s idle" if self.idle else ""
        return f"{self.kind} B={self.concurrency} P={self.input_tokens} O={self.output_tokens}{pause}"


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


def design_sweep(profile: ServerProfile, *, max_concurrency: Optional[int] = None) -> list[SweepPoint]:
    """A sweep that separates the terms: prompt lengths up to the context limit for prefill; batch
    sizes up to `max_num_seqs` crossed with short and long contexts for decode, plus single requests
    decoding at several more contexts, leaving out bursts whose KV blocks exceed the cache."""
    s, kv = profile.scheduler, profile.kv_cache
    limit = s.max_model_len
    top = min(s.max_num_seqs, max_concurrency or s.max_num_seqs)
    points = []
    lengths = {16, 64, 256, 512, 1024, 2048, 4096, 16384, 65536}
    if limit <= 65536:
        lengths.add(limit - 1)  # the longest prompt the server takes
        lengths.add(limit * 3 // 4)  # and one between: the curvature of prefill attention
    for p in sorted(lengths):
        if p + 1 <= limit:
            points.append(SweepPoint("prefill", 1, p, 1))
    for p in (64, 1024):
        if p + 1 <= limit:
            points.append(SweepPoint("prefill", 1, p, 1, idle=WAKE_PAUSE))
    batches = sorted({b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if b <= top} | {top})
    output = 32
    # a long context near the model's limit separates the attended-context term from per-sequence costs
    long_context = (limit * 3 // 4) // 64 * 64
    contexts = {64, 1024, 8192}
    if 8192 + output > limit:
        contexts.add(long_context)
    # single requests at more contexts: the cleanest rows for the attended-context term
    singles = {256, 512, 2048, 4096, 16384, limit // 2 // 64 * 64} - contexts
    for context in sorted(contexts | singles):
        if context + output > limit or context <= 0:
            continue
        for b in (batches if context in contexts else [1]):
            # a burst the KV cache cannot hold would measure preemption, not steps
            if b * -(-(context + output) // kv.block_size) <= kv.capacity_blocks:
                points.append(SweepPoint("decode", b, context, output))
    return points


def measure_on_twin(point: SweepPoint, profile: ServerProfile) -> float:
    """What the twin of `profile` measures at one sweep point."""
    env = simpy.Environment()
    twin = Twin(env, profile)
    if point.idle:
        env.run(until=point.idle)
    events = [twin.submit(point.input_tokens, point.output_tokens) for _ in range(point.concurrency)]
    env.run()
    done = [event.value for event in events]
    if point.kind == "prefill":
        return float(np.mean([c.ttft for c in done]))
    return float(np.mean([c.end - c.submitted for c in done]))


def unit_profile(profile: ServerProfile, term: str) -> ServerProfile:
    """`profile` with every step-time coefficient 0 but `term` (1), synchronous, no speculation."""
    zero = {name: 0.0 for name in type(profile.step_time).model_fields if name not in SETTINGS}
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


def fit(points: Sequence[SweepPoint], measured: Sequence[float], profile: ServerProfile,
        terms: Sequence[str] = FIT_TERMS) -> FitResult:
    """Non-negative least squares on relative errors; returns the coefficients and `profile` with them."""
    if len(points) != len(measured):
        raise ValueError("one measurement per sweep point")
    y = np.asarray(measured, dtype=float)
    if np.any(y <= 0):
        raise ValueError("measurements must be positive")
    x = feature_matrix(points, profile, terms)
    weights = 1.0 / y
    xw, yw = x * weights[:, None], y * weights
    theta, _ = nnls(xw, yw)
    predicted = x @ theta
    residual = yw - xw @ theta
    stderr = np.zeros(len(terms))
    free = theta > 0
    dof = len(y) - int(free.sum())
    if dof > 0 and free.any():
        sigma2 = float(residual @ residual) / dof
        sub = xw[:, free]
        cov = sigma2 * np.linalg.pinv(sub.T @ sub)
        stderr[free] = np.sqrt(np.clip(np.diag(cov), 0, None))
    coefficients = {term: float(v) for term, v in zip(terms, theta)}
    fitted_terms = {name: 0.0 for name in type(profile.step_time).model_fields if name not in SETTINGS}
    fitted_terms.update(coefficients)
    fitted = profile.model_copy(update={
        "step_time": profile.step_time.model_copy(update=fitted_terms),
        "scheduler": profile.scheduler.model_copy(update={"async_scheduling": False}),
        "calibrated": True,
    })
    return FitResult(coefficients, {t: float(e) for t, e in zip(terms, stderr)}, tuple(points),
                     tuple(float(v) for v in y), tuple(float(v) for v in predicted), fitted)


def fit_report(result: FitResult) -> str:
    """The fitted terms with their standard errors, then each point's measured and predicted value."""
    lines = ["term                 coefficient      std error   (relative)"]
    for term, value in result.coefficients.items():
        err = result.stderr[term]
        rel = f"{err / value:9.1%}" if value > 0 else "      n/a"
        lines.append(f"{term:18s} {value:13.4e}  {err:13.4e}   {rel}")
    lines.append(f"rms relative error over {len(result.points)} points: {result.rms_relative_error:.2%}")
    for point, m, p in zip(result.points, result.measured, result.predicted):
        lines.append(f"  {point.label():34s} measured {m * 1e3:10.3f} ms  predicted {p * 1e3:10.3f} ms  "
                     f"{p / m - 1:+7.2%}")
    return "\n".join(lines)


def calibrate(profile: ServerProfile, measure: Callable[[SweepPoint], float],
              points: Optional[Sequence[SweepPoint]] = None) -> FitResult:
    """Measure every sweep point with `measure` (a real server, or a twin) and fit."""
    points = list(points) if points is not None else design_sweep(profile)
    return fit(points, [measure(p) for p in points], profile)
