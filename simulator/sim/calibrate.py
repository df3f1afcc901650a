"""Fit a profile's step-time coefficients to measurements of a designed sweep.

The sweep has two kinds of points, each a burst of identical requests sent at once to an idle
server with no shared prefix:

- ``prefill``: one request of P prompt tokens and one output token; measured: its TTFT (the sum of
  its prefill steps, chunked by the token budget);
- ``prefill`` after a pause (``idle`` > 0): the same, sent once the server has been idle that long;
  the difference to the back-to-back point is the engine's ``idle_wake``;
- ``prefill`` of a cached prompt (``cached``): the same prompt sent twice, the second timed; the prefix
  cache holds all its full blocks but the last token's, so what grows with P is the request's handling
  in the API server (``frontend_per_prompt_token``: parsing, block hashing), not prefill compute;
- ``prefill`` bursts (B > 1): B requests sent at once; the API server hands them to the engine one
  after another (``frontend_per_request``), so the later ones miss the first step;
- ``decode``: B requests of P prompt tokens and O output tokens, their prompts already in the prefix
  cache but for the last token (so the burst is decode steps, not prefills); measured: the mean
  end-to-end latency over the requests (a one-token prefill, then O - 1 decode steps of up to B
  sequences at growing context). End to end rather than inter-token: a busy server merges several
  tokens into one streamed chunk, which delays the first token and shortens the gaps, but leaves the
  end in place.

Where the requests of a burst reach the engine together, the twin's schedule does not depend on the
step-time coefficients, so each measured value is linear in them: its feature for a term is what the
twin predicts with that coefficient set to 1 and all others to 0, and non-negative least squares
(`scipy.optimize.nnls`) on relative errors fits them. The API server's one-at-a-time work
(`FRONTEND_TERMS`) staggers a burst's arrivals, which moves requests from one step to the next: the
values are no longer linear, so the fit goes on from the linear solution by bounded nonlinear least
squares (`scipy.optimize.least_squares`) with the twin itself as the model. The latency outside the
engine (`request_overhead`) adds once to every value. Scheduling overhead is not separable from
outside the server (it adds to the fixed and per-sequence terms), so the fitted profile has
synchronous scheduling and no overhead terms.
Speculative decoding is not fitted (calibrate with it off).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np
import simpy
from scipy.optimize import least_squares, nnls

from .profile import CalibrationRecord, ServerProfile
from .twin import Twin

FIT_TERMS = ("fixed", "per_token", "per_decode_seq", "per_context_token", "per_prefill_attention",
             "request_overhead", "frontend_per_request", "frontend_per_prompt_token", "idle_wake")
"""The identifiable terms: per step, per scheduled token, per decoding sequence (beyond its token), per
attended token, per query-key pair of prefill, latency outside the engine, and the API server's
one-at-a-time work per request and per prompt token. A single request's TTFT is the request's handling
plus its prefill steps, so the prefill rows' intercept gives the handling and their curvature the
prefill attention, and the decode rows (many steps per request) give `fixed`; cached prompts separate
the per-prompt-token handling from prefill compute, and bursts its one-at-a-time part from plain
latency; single requests decoding at several contexts separate the attended-context term from the
per-sequence ones; prefills after a pause give the cost of waking an idle engine."""

FRONTEND_TERMS = frozenset({"frontend_per_request", "frontend_per_prompt_token"})
"""Terms that change when a burst's requests reach the engine, not only how long steps take."""

FRONTEND_SHARES = (0.1, 0.3, 0.5, 0.7, 0.9)
"""Shares of the linear fit's `request_overhead` the nonlinear search starts from as the API server's
one-at-a-time work; the best fit of these starts is kept. Burst values jump where a request moves to
the next step, and a search from a single start can stall on such a jump far from the best fit."""

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
    cached: bool = False
    """Each request's prompt is sent once just before the burst (untimed), so the prefix cache holds
    its whole blocks."""

    def label(self) -> str:
        pause = f" after {self.idle:g} s idle" if self.idle else ""
        cached = " cached" if self.cached else ""
        return f"{self.kind} B={self.concurrency} P={self.input_tokens}{cached} O={self.output_tokens}{pause}"


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
    # cached prompts of whole blocks and one token more: the warm-up leaves all the blocks cached, and
    # the timed request computes a single token after them
    bs = kv.block_size
    for p in sorted({1024, 4096, 16384, 65536, (limit - 2) // bs * bs} - {0}):
        if p + 2 <= limit:
            points.append(SweepPoint("prefill", 1, p + 1, 1, cached=True))
    for b, p in ((4, 16), (16, 16), (4, 1024)):
        if b <= top and b * -(-(p + 1) // bs) <= kv.capacity_blocks:
            points.append(SweepPoint("prefill", b, p, 1))
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
        # prompts of a block or more are cached beforehand, but for one token: the burst then measures
        # its decode steps, not the prefills that would otherwise make most of its time
        cached = context >= bs
        prompt = context + 1 if cached else context
        if prompt + output > limit or context <= 0:
            continue
        for b in (batches if context in contexts else [1]):
            # a burst the KV cache cannot hold would measure preemption, not steps
            if b * -(-(prompt + output) // bs) <= kv.capacity_blocks:
                points.append(SweepPoint("decode", b, prompt, output, cached=cached))
    return points


def measure_on_twin(point: SweepPoint, profile: ServerProfile) -> float:
    """What the twin of `profile` measures at one sweep point."""
    env = simpy.Environment()
    twin = Twin(env, profile)
    bs = profile.kv_cache.block_size
    prompts = [()] * point.concurrency
    if point.cached:
        prompts = cached_prompts(point, bs)
        for hash_ids in prompts:
            twin.submit(point.input_tokens, 1, hash_ids, bs)
        env.run()
    if point.idle:
        env.run(until=env.now + point.idle)
    events = [twin.submit(point.input_tokens, point.output_tokens, hash_ids, bs) for hash_ids in prompts]
    env.run()
    done = [event.value for event in events]
    if point.kind == "prefill":
        return float(np.mean([c.ttft for c in done]))
    return float(np.mean([c.end - c.submitted for c in done]))


def cached_prompts(point: SweepPoint, block_size: int, first: int = 0) -> list[tuple[int, ...]]:
    """The hash ids of a cached point's prompts, one run of its own per request from `first`: each
    request's whole blocks, warmed into the prefix cache by sending them once before the burst."""
    n = point.input_tokens // block_size
    return [tuple(range(first + i * n, first + (i + 1) * n)) for i in range(point.concurrency)]


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


def with_coefficients(profile: ServerProfile, coefficients: dict[str, float]) -> ServerProfile:
    """`profile` with these step-time coefficients and all other fitted ones 0, synchronous scheduling,
    marked calibrated."""
    values = {name: 0.0 for name in type(profile.step_time).model_fields if name not in SETTINGS}
    values.update(coefficients)
    return profile.model_copy(update={
        "step_time": profile.step_time.model_copy(update=values),
        "scheduler": profile.scheduler.model_copy(update={"async_scheduling": False}),
        "calibrated": True,
    })


def fit(points: Sequence[SweepPoint], measured: Sequence[float], profile: ServerProfile,
        terms: Sequence[str] = FIT_TERMS) -> FitResult:
    """Least squares on relative errors, coefficients non-negative: linear for the step terms, then
    nonlinear on the twin when `terms` has API-server terms. Returns the coefficients and `profile`
    with them."""
    if len(points) != len(measured):
        raise ValueError("one measurement per sweep point")
    y = np.asarray(measured, dtype=float)
    if np.any(y <= 0):
        raise ValueError("measurements must be positive")
    linear = [t for t in terms if t not in FRONTEND_TERMS]
    x = feature_matrix(points, profile, linear)
    jacobian = x / y[:, None]
    theta, _ = nnls(jacobian, np.ones_like(y))
    coefficients = {term: float(v) for term, v in zip(linear, theta)}
    if len(linear) < len(terms):
        coefficients, jacobian = _fit_frontend(points, y, profile, list(terms), coefficients, x)
        predicted = np.array([measure_on_twin(p, with_coefficients(profile, coefficients)) for p in points])
    else:
        predicted = x @ theta
    values = np.array([coefficients[t] for t in terms])
    residual = predicted / y - 1
    stderr = np.zeros(len(terms))
    free = values > 0
    dof = len(y) - int(free.sum())
    if dof > 0 and free.any():
        sigma2 = float(residual @ residual) / dof
        sub = jacobian[:, free]
        cov = sigma2 * np.linalg.pinv(sub.T @ sub)
        stderr[free] = np.sqrt(np.clip(np.diag(cov), 0, None))
    coefficients = {t: coefficients[t] for t in terms}
    record = CalibrationRecord(
        rms_relative_error=float(np.sqrt(np.mean(residual ** 2))), points=len(y),
        worst_relative_error=float(np.max(np.abs(residual))),
        terms={t: float(e / v) if v > 0 else 0.0 for t, v, e in zip(terms, values, stderr)})
    return FitResult(coefficients, {t: float(e) for t, e in zip(terms, stderr)}, tuple(points),
                     tuple(float(v) for v in y), tuple(float(v) for v in predicted),
                     with_coefficients(profile, coefficients).model_copy(update={"calibration": record}))


def _fit_frontend(points: Sequence[SweepPoint], y: np.ndarray, profile: ServerProfile, terms: list[str],
                  linear: dict[str, float], x: np.ndarray) -> tuple[dict[str, float], np.ndarray]:
    """Nonlinear least squares over all `terms` from the `linear` fit (features `x`), a part of its
    `request_overhead` moved to the API server's per-request work (each of `FRONTEND_SHARES` in turn).
    Returns the best coefficients and the Jacobian of the relative residuals per unit coefficient."""
    overhead = linear.get("request_overhead", 0.0)
    # each coefficient in units of a scale (its start, or what makes it 1% of a typical measurement):
    # the search then steps every term by the same relative amount
    typical = float(np.median(y))
    columns = dict(zip([t for t in terms if t not in FRONTEND_TERMS], x.T))
    per_request = columns.get("request_overhead", np.ones(len(points)))
    columns.setdefault("frontend_per_request", per_request)
    columns.setdefault("frontend_per_prompt_token", per_request * np.array([p.input_tokens for p in points]))
    floor = {t: 0.01 * typical / float(np.median(columns[t][columns[t] > 0])) if np.any(columns[t] > 0) else 1.0
             for t in terms}

    def search(share: float):
        start = {t: linear.get(t, 0.0) for t in terms}
        if "frontend_per_request" in start and overhead > 0:
            start["frontend_per_request"] = share * overhead
            start["request_overhead"] = (1 - share) * overhead
        scale = np.array([start[t] if start[t] > 0 else floor[t] for t in terms])

        def residuals(units: np.ndarray) -> np.ndarray:
            model = with_coefficients(profile, dict(zip(terms, units * scale)))
            return np.array([measure_on_twin(p, model) for p in points]) / y - 1

        # steps of 1% of each scale: smaller ones would see single requests cross step boundaries
        # (jumps) rather than the trend
        result = least_squares(residuals, np.array([start[t] for t in terms]) / scale, bounds=(0.0, np.inf),
                               diff_step=0.01, method="trf")
        units = np.where(result.x < 1e-6, 0.0, result.x)  # a term the search ran down to its bound
        return result.cost, units * scale, result.jac / scale

    shares = FRONTEND_SHARES if "frontend_per_request" in terms and overhead > 0 else (0.0,)
    _, values, jacobian = min((search(share) for share in shares), key=lambda found: found[0])
    return dict(zip(terms, (float(v) for v in values))), jacobian


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
