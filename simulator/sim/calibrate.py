"""Fit a profile's step-time coefficients to measurements of a designed sweep.

The sweep has two kinds of points, each a burst of identical requests sent at once to an idle
server with no shared prefix:

- ``prefill``: one request of P prompt tokens and one output token; measured: its TTFT (the sum of
  its prefill steps, chunked by the token budget);
- ``prefill`` after a pause (``idle`` > 0): the same, sent once the server has been idle that long;
  the difference to the back-to-back point is the engine's ``idle_wake``;
- ``decode`` after a pause: the long single decode (`LONG_OUTPUT` tokens) sent once the server has
  been idle that long; beyond the wake-up of its first step, its steps in the first ``wake_period``
  are slower by ``wake_slowdown`` (the hardware coming back to speed);
- ``prefill`` of a cached prompt (``cached``): the same prompt sent twice, the second timed; the prefix
  cache holds all its full blocks but the last token's, so what grows with P is the request's handling
  in the API server (``frontend_per_prompt_token``: parsing, block hashing), not prefill compute;
- ``prefill`` after one of the same size (``same_size``): a request of as many prompt tokens (other
  tokens) runs just before, untimed, so the timed one's step finds its kernels built; the difference
  to a prefill of a size the server has not run lately is ``per_new_shape`` (a live sweep makes the
  other points' prompt lengths new by a few tokens each time, `simulator.live.calibration`);
- ``prefill`` bursts (B > 1): B requests sent at once; the API server hands them to the engine one
  after another (``frontend_per_request``), so the later ones miss the first step;
- ``decode``: B requests of P prompt tokens and O output tokens, their prompts already in the prefix
  cache but for the last token (so the burst is decode steps, not prefills); measured: the mean
  end-to-end latency over the requests (a one-token prefill, then O - 1 decode steps of up to B
  sequences at growing context). End to end rather than inter-token: a busy server merges several
  tokens into one streamed chunk, which delays the first token and shortens the gaps, but leaves the
  end in place.
- ``loaded``: N streams decode (`loaded_stream`: cached one-block prompts, so they prefill a token
  each) while calls of P prompt tokens are sent at set times after them (`probe_offsets`); measured:
  the calls' mean TTFT. With short calls it is the API server's per-token work
  (``frontend_per_output_token``): every step the streams' N tokens pass the API server before a new
  call's first token, and a call arriving meanwhile waits for them; with long prompts it is steps that
  mix a prefill chunk with N decodes, which no other point has. With streams of a long context
  (``stream_context``: cached prompts of that many tokens) the calls' steps mix a prefill with decodes
  that attend thousands of tokens each (``per_mixed_context_token``), as an agent's calls meet the
  long-context decodes of other agents.

Where the requests of a burst reach the engine together, the twin's schedule does not depend on the
step-time coefficients, so each measured value is linear in them: its feature for a term is what the
twin predicts with that coefficient set to 1 and all others to 0, and non-negative least squares
(`scipy.optimize.nnls`) on relative errors fits them. The API server's one-at-a-time work
(`FRONTEND_TERMS`) staggers a burst's arrivals, which moves requests from one step to the next, and a
loaded point's calls are sent at set times, which land in steps as long as the steps last: these
values are not linear, so the linear fit takes the other points only, and the fit goes on over all of
them from its solution by bounded nonlinear least squares (`scipy.optimize.least_squares`) with the
twin itself as the model. The latency outside the
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

from .profile import STEP_SETTINGS, CalibrationRecord, ServerProfile
from .twin import Twin, exact_delay

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

LONG_OUTPUT = 160
"""Output tokens of the sweep's long single decodes (five times the other decode points')."""

WAKE_PAUSE = 0.5
"""Seconds of quiet before the sweep's wake-up points: well past any `idle_after` a server needs."""

LOADED_STREAMS = (8, 16, 48, 96, 192)
"""Streams decoding under the sweep's loaded points (those the server's `max_num_seqs` leaves a seat
beside): from where the API server's per-token work is a small share of a step to where it is most."""
LOADED_SHORT = 32
"""Prompt tokens of the short calls sent under load."""
LOADED_MIXED = ((16, 1024), (48, 2048), (96, 512))
"""(streams, prompt tokens) of the loaded points whose calls are long prefills: steps that mix a
prefill chunk (a whole step's budget at 2,048 on a 2,048-token server) with the streams' decodes."""
LOADED_LONG = ((8, 2048, LOADED_SHORT), (8, 2048, 512))
"""(streams, stream context, prompt tokens) of the loaded points whose streams decode at a long
context: short and longer calls whose steps mix their prefill with decodes attending 2,048 tokens each
(the context capped at half the model's limit). Beside the short calls among as many streams of one
block (`LOADED_STREAMS` has 8), which wait for the API server's tokens alike, they show what the
streams' context costs in the mixed steps."""
PROBES = 8
"""Calls sent under load at each loaded point (half as many of long prompts)."""
PROBE_SPACING = 0.083
"""Seconds between them (no multiple of a typical step, so they meet steps at different phases); more
for long prompts (a 1,024-token prompt's call twice this, a 2,048-token one's three times), so that
each finds the one before it done."""
PROBE_LEAD = 0.15
PROBE_LEAD_PER_STREAM = 0.003
"""The first call goes this long after the streams were sent: a fixed part and a part per stream,
the time an API server takes to let that many requests in (about 3 ms each on the CPU test server), so
that the calls find the streams decoding."""
STREAM_TOKENS = 8192
"""Output tokens of a loaded point's streams together (each within `STREAM_OUTPUT`): each point then
takes about as long, and its streams outlast its calls on the CPU test server with a margin."""
STREAM_OUTPUT = (96, 384)
"""Fewest and most output tokens of one stream."""
DRIFT_WARNING = 0.03
"""A trend of a live sweep's rounds' times larger than this (either way) is reported as the server's
drift (`CalibrationRecord.drift`): each point's median then mixes speeds."""


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """One measurement of the sweep."""

    kind: str
    """'prefill' (value: TTFT), 'decode' (value: mean end-to-end latency) or 'loaded' (value: mean
    TTFT of calls sent while `concurrency` streams decode)."""
    concurrency: int
    """Requests of the burst (of a loaded point: its streams)."""
    input_tokens: int
    output_tokens: int
    idle: float = 0.0
    """Seconds the server is left idle before the burst is sent."""
    cached: bool = False
    """Each request's prompt is sent once just before the burst (untimed), so the prefix cache holds
    its whole blocks (of a loaded point: its streams' prompts)."""
    same_size: bool = False
    """A request of as many prompt tokens (no prefix shared) runs just before, untimed: the burst's
    step sizes have their kernels built (`per_new_shape`)."""
    stream_context: int = 0
    """Of a loaded point: its streams' cached context in tokens (0: one block)."""

    def label(self) -> str:
        if self.kind == "loaded":
            context = f" C={self.stream_context}" if self.stream_context else ""
            return f"loaded N={self.concurrency}{context} P={self.input_tokens} O={self.output_tokens}"
        pause = f" after {self.idle:g} s idle" if self.idle else ""
        prompt = " cached" if self.cached else " after one of its size" if self.same_size else ""
        return f"{self.kind} B={self.concurrency} P={self.input_tokens}{prompt} O={self.output_tokens}{pause}"


def loaded_stream(point: SweepPoint, block_size: int) -> tuple[int, int]:
    """(prompt, output) tokens of each stream of a loaded point: its `stream_context` (or one block) in
    the prefix cache and a token, so that each prefills one token, and `STREAM_TOKENS` output tokens
    shared out."""
    low, high = STREAM_OUTPUT
    return (point.stream_context or block_size) + 1, min(high, max(low, STREAM_TOKENS // point.concurrency))


def probe_offsets(point: SweepPoint) -> list[float]:
    """Seconds after a loaded point's streams were sent at which each of its calls is sent."""
    lead = PROBE_LEAD + PROBE_LEAD_PER_STREAM * point.concurrency
    short = point.input_tokens <= LOADED_SHORT
    spacing = PROBE_SPACING * (1 + point.input_tokens // 1024)
    return [lead + spacing * k for k in range(PROBES if short else PROBES // 2)]


def probe_phases(count: int) -> list[float]:
    """Where in a step each of `count` calls lands on the twin: the middles of `count` equal parts of
    the step, in an order that spreads them over the point's time (bit-reversed for a power of two)."""
    bits = max(1, (count - 1).bit_length())
    order = sorted(range(count), key=lambda k: int(format(k, f"0{bits}b")[::-1], 2))
    return [(k + 0.5) / count for k in order]


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
            points.append(SweepPoint("prefill", 1, p, 1, same_size=True))
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
    # single requests of a longer output at two contexts: with every other decode point at 32 tokens,
    # what a decode step costs and what a request costs once would otherwise rest on the prefill points
    for context in (64, 1024):
        cached = context >= bs
        prompt = context + 1 if cached else context
        if prompt + LONG_OUTPUT <= limit:
            points.append(SweepPoint("decode", 1, prompt, LONG_OUTPUT, cached=cached))
            if context == 64:  # and once after a pause: the steps of an engine warming up again
                points.append(SweepPoint("decode", 1, prompt, LONG_OUTPUT, cached=cached, idle=WAKE_PAUSE))
    # calls sent while streams decode, each stream and call with a seat and blocks of its own: short
    # calls (the API server's work per streamed token), long prefills (steps mixing prefill and decode)
    # and calls among streams of a long context (steps mixing a prefill with long-context decodes)
    loaded = [(n, 0, LOADED_SHORT) for n in LOADED_STREAMS] + [(n, 0, p) for n, p in LOADED_MIXED]
    loaded += [(n, min(c, limit // 2 // bs * bs), p) for n, c, p in LOADED_LONG if limit // 2 >= 2 * bs]
    for n, context, p in loaded:
        point = SweepPoint("loaded", n, p, 1, cached=True, stream_context=context)
        prompt, output = loaded_stream(point, bs)
        blocks = n * -(-(prompt + output) // bs) + PROBES * -(-(p + 1) // bs)
        if n < top and prompt + output <= limit and p + 1 <= limit and blocks <= kv.capacity_blocks:
            points.append(point)
    return points


def measure_on_twin(point: SweepPoint, profile: ServerProfile) -> float:
    """What the twin of `profile` measures at one sweep point."""
    env = simpy.Environment()
    bs = profile.kv_cache.block_size
    if point.kind == "loaded":
        # stepped one by one: a call is sent inside a step planned before it, which a run of decode
        # steps advanced at once would not see
        return _loaded_on_twin(point, env, Twin(env, profile, fast_decode=False), bs)
    twin = Twin(env, profile)
    twin.requests_ended()  # the sweep's point before ended just before this one
    prompts = [()] * point.concurrency
    if point.cached:
        prompts = cached_prompts(point, bs)
        for hash_ids in prompts:
            twin.submit(point.input_tokens, 1, hash_ids, bs)
        env.run()
    if point.same_size:
        twin.submit(point.input_tokens, 1)
        env.run()
    if point.idle:
        env.run(until=env.now + point.idle)
    events = [twin.submit(point.input_tokens, point.output_tokens, hash_ids, bs) for hash_ids in prompts]
    env.run()
    done = [event.value for event in events]
    if point.kind == "prefill":
        return float(np.mean([c.ttft for c in done]))
    return float(np.mean([c.end - c.submitted for c in done]))


def _loaded_on_twin(point: SweepPoint, env: simpy.Environment, twin: Twin, bs: int) -> float:
    """A loaded point on the twin: the streams' prompts warmed, the streams sent, the calls sent
    about their offsets; the calls' mean TTFT (the streams are not waited for).

    A call's TTFT depends on where in a step it arrives (it waits for the next step, and for the API
    server when that is sending the step's tokens); on the real server the phase is random. On the
    twin each call goes in the step after the one under way at its offset, at its own phase
    (`probe_phases`), so that the calls sample the phases evenly and the value moves smoothly with the
    coefficients rather than jumping each time a step boundary crosses a call's send time."""
    prompt, output = loaded_stream(point, bs)
    streams = cached_prompts(point, bs, tokens=prompt)
    for hash_ids in streams:
        twin.submit(prompt, 1, hash_ids, bs)
    env.run()
    start = env.now
    for hash_ids in streams:
        twin.submit(prompt, output, hash_ids, bs)
    ttfts: list[float] = []

    def calls():
        sent = []
        offsets = probe_offsets(point)
        for offset, phase in zip(offsets, probe_phases(len(offsets))):
            yield env.timeout(exact_delay(env.now, start + offset))
            plan = twin.planned_step()
            if plan is not None:  # wait for the step under way to end
                yield env.timeout(exact_delay(env.now, plan[1]))
                plan = twin.planned_step()
                while plan is not None and plan[1] <= env.now:  # the next one is planned after the clients
                    yield env.timeout(0)
                    plan = twin.planned_step()
            if plan is not None:
                yield env.timeout(exact_delay(env.now, plan[0] + phase * (plan[1] - plan[0])))
            sent.append(twin.submit(point.input_tokens, point.output_tokens))
        for event in sent:
            ttfts.append((yield event).ttft)

    env.run(until=env.process(calls()))
    return float(np.mean(ttfts))


def cached_prompts(point: SweepPoint, block_size: int, first: int = 0,
                   tokens: Optional[int] = None) -> list[tuple[int, ...]]:
    """The hash ids of a cached point's prompts (of `tokens` each, default the point's input tokens),
    one run of its own per request from `first`: each request's whole blocks, warmed into the prefix
    cache by sending them once before the burst."""
    n = (point.input_tokens if tokens is None else tokens) // block_size
    return [tuple(range(first + i * n, first + (i + 1) * n)) for i in range(point.concurrency)]


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
    coefficients = {t: coefficients[t] for t in terms}
    record = CalibrationRecord(
        rms_relative_error=float(np.sqrt(np.mean(residual ** 2))), points=len(y),
        worst_relative_error=float(np.max(np.abs(residual))),
        terms={t: float(e / v) if v > 0 else 0.0 for t, v, e in zip(terms, values, stderr)})
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
    also searched with the per-token work held at 0, and the best of all is kept. Returns the
    coefficients, the Jacobian of the relative residuals per unit coefficient, and the twin's value at
    every point with those coefficients."""
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

    def search(free: list[str], start: dict[str, float], used: list[int]):
        scale = np.array([start[t] if start[t] > 0 else floor[t] for t in free])

        def model(units: np.ndarray) -> ServerProfile:
            return with_coefficients(profile, {**start, **dict(zip(free, units * scale))})

        def residuals(units: np.ndarray) -> np.ndarray:
            m = model(units)
            return np.array([measure_on_twin(points[i], m) for i in used]) / y[used] - 1

        # steps of 3% of each scale: smaller ones see single requests cross step boundaries, and a
        # burst's steps change sizes (kernel-cache misses), as jumps rather than the trend
        result = least_squares(residuals, np.array([start[t] for t in free]) / scale, bounds=(0.0, np.inf),
                               diff_step=0.03, method="trf")
        units = np.where(result.x < 1e-6, 0.0, result.x)  # a term the search ran down to its bound
        return result.cost, {**start, **dict(zip(free, (float(v) for v in units * scale)))}

    def from_share(share: float) -> dict[str, float]:
        start = {t: linear.get(t, 0.0) for t in terms}
        if "frontend_per_request" in start and overhead > 0:
            start["frontend_per_request"] = share * overhead
            start["request_overhead"] = (1 - share) * overhead
        return start

    shares = FRONTEND_SHARES if "frontend_per_request" in terms and overhead > 0 else (0.0,)
    _, best = min((search(first_terms, from_share(share), first_rows) for share in shares),
                  key=lambda found: found[0])
    if per_token:
        first = best
        per_token_start = _per_token_start(points, y, profile, first) or floor["frontend_per_output_token"]
        starts = ([{**first, "per_mixed_context_token": m * floor["per_mixed_context_token"]} for m in MIXED_STARTS]
                  if "per_mixed_context_token" in terms else [first])
        # every start twice: with the per-token work, and without it (no per-token work is not the limit
        # of a little), the second stage's best over all points kept
        no_per_token = [t for t in terms if t != "frontend_per_output_token"]
        found = [search(terms, {**start, "frontend_per_output_token": per_token_start}, everything)
                 for start in starts]
        found += [search(no_per_token, {**start, "frontend_per_output_token": 0.0}, everything)
                  for start in starts]
        _, best = min(found, key=lambda result: result[0])
    jacobian, predicted = _jacobian(points, y, profile, best, terms)
    return best, jacobian, predicted


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
