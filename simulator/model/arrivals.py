"""Task arrival processes: their YAML form, fitting by maximum likelihood, choice by AIC, and sampling.

Candidates fitted to recorded arrival times (all scored on the same data: the arrivals after the first):

- ``poisson``: constant rate.
- ``gamma``: a renewal process with gamma inter-arrival times (matches the coefficient of variation).
- ``mmpp2``: two-state Markov-modulated Poisson process for bursts, fitted by EM (Baum-Welch). The
  state is tracked at arrival epochs: arrival k comes after an exponential gap at the rate of its state,
  and the state changes between arrivals with probability 1 - stay[s]. This embedded chain is what the
  EM fits exactly and what `sample` draws from.
- ``piecewise``: a Poisson process whose rate is constant within bins and repeats (daily cycles when
  the trace spans days; else bins over the trace, their number chosen by BIC).

``empirical`` replays the recorded times (repeated end to end when more are needed) and has no
likelihood; ``user`` means the trace cannot give arrivals (one session, or all arrivals equal) and the
rate must come from the user at generate time.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal, Optional, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator
from scipy import special, stats

from .dists import Discrete, fit_discrete

Positive = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]
Prob = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]


class _Process(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def mean_rate(self) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def _gaps(self, rng: np.random.Generator, n: int) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def scaled(self, factor: float) -> "_Process":
        """The same process running `factor` times faster (rate × factor, bursts kept)."""
        raise NotImplementedError  # pragma: no cover

    def sample(self, rng: np.random.Generator, n: Optional[int] = None, duration: Optional[float] = None) -> np.ndarray:
        """Arrival times from 0: exactly `n` of them, or all before `duration` seconds."""
        if n is not None:
            return np.concatenate([[0.0], np.cumsum(self._gaps(rng, n - 1))]) if n > 0 else np.zeros(0)
        assert duration is not None
        chunk = max(16, int(self.mean_rate() * duration * 1.2) + 16)
        times = [np.zeros(1)]
        last = 0.0
        while last < duration:
            more = last + np.cumsum(self._gaps(rng, chunk))
            times.append(more)
            last = float(more[-1])
        out = np.concatenate(times)
        return out[out < duration]


class Poisson(_Process):
    """Exponential gaps at a constant `rate` (tasks per second)."""

    kind: Literal["poisson"] = "poisson"
    rate: Positive

    def mean_rate(self) -> float:
        return self.rate

    def _gaps(self, rng, n):
        return rng.exponential(1.0 / self.rate, n)

    def scaled(self, factor):
        return Poisson(rate=self.rate * factor)


class GammaRenewal(_Process):
    """Independent gamma gaps: `shape` < 1 is burstier than Poisson (CV = 1/sqrt(shape))."""

    kind: Literal["gamma"] = "gamma"
    shape: Positive
    scale: Positive
    """Seconds; the mean gap is shape × scale."""

    def mean_rate(self) -> float:
        return 1.0 / (self.shape * self.scale)

    def _gaps(self, rng, n):
        return rng.gamma(self.shape, self.scale, n)

    def scaled(self, factor):
        return GammaRenewal(shape=self.shape, scale=self.scale / factor)


def gamma_renewal(rate: float, burstiness: float) -> GammaRenewal:
    """Arrivals at `rate` tasks per second whose gaps have the gamma shape `burstiness`, as `vllm bench
    serve --burstiness` defines it: 1 is Poisson, lower is burstier (the gaps' coefficient of variation
    is 1 / sqrt(burstiness)), higher is more even."""
    return GammaRenewal(shape=burstiness, scale=1.0 / (rate * burstiness))


class MMPP2(_Process):
    """Two-state Markov-modulated Poisson process, its state tracked at arrivals."""

    kind: Literal["mmpp2"] = "mmpp2"
    rates: Annotated[list[Positive], Field(min_length=2, max_length=2)]
    """Arrival rate in each state (tasks per second)."""
    stay: Annotated[list[Prob], Field(min_length=2, max_length=2)]
    """Probability that the next arrival comes in the same state as this one."""

    def _stationary(self) -> tuple[float, float]:
        leave0, leave1 = 1.0 - self.stay[0], 1.0 - self.stay[1]
        if leave0 + leave1 == 0:
            return 0.5, 0.5
        return leave1 / (leave0 + leave1), leave0 / (leave0 + leave1)

    def mean_rate(self) -> float:
        p0, p1 = self._stationary()
        return 1.0 / (p0 / self.rates[0] + p1 / self.rates[1])

    def _gaps(self, rng, n):
        states = np.empty(n, dtype=np.int8)
        p0, _ = self._stationary()
        state = 0 if rng.random() < p0 else 1
        filled = 0
        while filled < n:
            leave = 1.0 - self.stay[state]
            run = n - filled if leave <= 0 else min(n - filled, int(rng.geometric(leave)))
            states[filled:filled + run] = state
            filled += run
            state = 1 - state
        rates = np.asarray(self.rates)[states]
        return rng.exponential(1.0, n) / rates

    def scaled(self, factor):
        return MMPP2(rates=[r * factor for r in self.rates], stay=list(self.stay))


class Piecewise(_Process):
    """A Poisson process whose rate is `rates[i]` during bin i, repeating every len(rates) bins."""

    kind: Literal["piecewise"] = "piecewise"
    bin_seconds: Positive
    rates: Annotated[list[Annotated[float, Field(ge=0.0, allow_inf_nan=False)]], Field(min_length=1)]

    @model_validator(mode="after")
    def _some_rate(self) -> "Piecewise":
        if not any(r > 0 for r in self.rates):
            raise ValueError("at least one bin needs a positive rate")
        return self

    def mean_rate(self) -> float:
        return float(np.mean(self.rates))

    def _gaps(self, rng, n):
        # Time change: unit-rate Poisson points mapped through the inverse of the cumulative rate.
        rates = np.asarray(self.rates, dtype=float)
        cum = np.concatenate([[0.0], np.cumsum(rates * self.bin_seconds)])
        per_period = cum[-1]
        period = self.bin_seconds * len(rates)
        s = np.cumsum(rng.exponential(1.0, n))
        cycles, rest = np.divmod(s, per_period)
        idx = np.clip(np.searchsorted(cum, rest, side="right") - 1, 0, len(rates) - 1)
        # A zero-rate bin has no mass, so `rest` never falls inside one.
        within = (rest - cum[idx]) / np.where(rates[idx] > 0, rates[idx], 1.0)
        t = cycles * period + idx * self.bin_seconds + within
        return np.diff(np.concatenate([[0.0], t]))

    def scaled(self, factor):
        return Piecewise(bin_seconds=self.bin_seconds / factor, rates=[r * factor for r in self.rates])


class EmpiricalArrivals(_Process):
    """The recorded arrival times (seconds from the first), replayed end to end as often as needed."""

    kind: Literal["empirical"] = "empirical"
    times: Annotated[list[Annotated[float, Field(ge=0.0, allow_inf_nan=False)]], Field(min_length=2)]

    @model_validator(mode="after")
    def _sorted(self) -> "EmpiricalArrivals":
        if any(b < a for a, b in zip(self.times, self.times[1:])):
            raise ValueError("times must be non-decreasing")
        if self.times[-1] <= self.times[0]:
            raise ValueError("times must span some time")
        return self

    def _period(self) -> float:
        t = self.times
        return (t[-1] - t[0]) * len(t) / (len(t) - 1)

    def mean_rate(self) -> float:
        return len(self.times) / self._period()

    def _gaps(self, rng, n):
        base = np.diff(np.asarray(self.times, dtype=float))
        wrap = self._period() - (self.times[-1] - self.times[0])
        cycle = np.concatenate([base, [wrap]])
        reps = n // len(cycle) + 1
        return np.tile(cycle, reps)[:n]

    def scaled(self, factor):
        return EmpiricalArrivals(times=[t / factor for t in self.times])


class Modulated(_Process):
    """Bursts on three timescales: a slow rate curve (minutes), a two-state MMPP on top of it (seconds),
    and batches of requests sent together (milliseconds).

    The curve acts as a time change: `base` runs in operational seconds, which pass at
    rates[i] / mean(rates) real-time speed in bin i, so busy bins get proportionally more arrivals.
    Each arrival of `base` is a batch of `batch_sizes` requests, the later ones each after an
    exponential gap of mean `batch_gap_mean` seconds, cut at `batch_window`."""

    kind: Literal["modulated"] = "modulated"
    curve: Piecewise
    base: MMPP2
    batch_window: Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
    batch_sizes: Discrete
    batch_gap_mean: Annotated[float, Field(ge=0.0, allow_inf_nan=False)]

    def _cum(self) -> tuple[np.ndarray, np.ndarray]:
        rates = np.asarray(self.curve.rates, dtype=float)
        speed = rates / rates.mean()
        return speed, np.concatenate([[0.0], np.cumsum(speed * self.curve.bin_seconds)])

    def to_operational(self, t: np.ndarray) -> np.ndarray:
        """Real seconds -> operational seconds."""
        speed, cum = self._cum()
        w, k = self.curve.bin_seconds, len(speed)
        cycles, rest = np.divmod(np.asarray(t, dtype=float), w * k)
        i = np.minimum((rest // w).astype(int), k - 1)
        return cycles * cum[-1] + cum[i] + (rest - i * w) * speed[i]

    def to_real(self, u: np.ndarray) -> np.ndarray:
        """Operational seconds -> real seconds."""
        speed, cum = self._cum()
        w, k = self.curve.bin_seconds, len(speed)
        cycles, rest = np.divmod(np.asarray(u, dtype=float), cum[-1])
        i = np.clip(np.searchsorted(cum, rest, side="right") - 1, 0, k - 1)
        return cycles * w * k + i * w + (rest - cum[i]) / np.where(speed[i] > 0, speed[i], 1.0)

    def _mean_batch(self) -> float:
        return float(np.dot(self.batch_sizes.values, self.batch_sizes.probs))

    def mean_rate(self) -> float:
        return self.base.mean_rate() * self._mean_batch()

    def _expand(self, rng: np.random.Generator, epochs: np.ndarray) -> np.ndarray:
        sizes = self.batch_sizes.sample(rng, len(epochs)).astype(np.int64)
        sizes = np.maximum(sizes, 1)
        starts = np.repeat(epochs, sizes)
        extra = np.ones(len(starts), dtype=bool)
        first = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        extra[first] = False
        gaps = np.zeros(len(starts))
        if self.batch_gap_mean > 0 and self.batch_window > 0:
            u = rng.random(int(extra.sum()))
            # Exponential cut at the window, by inverse CDF.
            top = 1.0 - math.exp(-self.batch_window / self.batch_gap_mean)
            gaps[extra] = -self.batch_gap_mean * np.log1p(-u * top)
        # Offsets within each batch are the running sum of its gaps.
        csum = np.cumsum(gaps)
        offset = csum - np.repeat(csum[first], sizes)
        return np.sort(starts + offset)

    def sample(self, rng, n=None, duration=None):
        if n is not None:
            if n <= 0:
                return np.zeros(0)
            epochs = self.base.sample(rng, n=n)
            out = self._expand(rng, self.to_real(epochs))[:n]
        else:
            assert duration is not None
            end = float(self.to_operational(np.array([duration]))[0])
            out = self._expand(rng, self.to_real(self.base.sample(rng, duration=end)))
            out = out[out < duration]
        return out - (out[0] if len(out) else 0.0)

    def scaled(self, factor):
        return Modulated(
            curve=Piecewise(bin_seconds=self.curve.bin_seconds / factor, rates=list(self.curve.rates)),
            base=self.base.scaled(factor),
            batch_window=self.batch_window / factor,
            batch_sizes=self.batch_sizes,
            batch_gap_mean=self.batch_gap_mean / factor,
        )


Process = Annotated[Union[Poisson, GammaRenewal, MMPP2, Piecewise, Modulated, EmpiricalArrivals], Field(discriminator="kind")]


class Candidate(BaseModel):
    """How well one fitted process explains the recorded arrivals."""

    model_config = ConfigDict(extra="forbid")
    kind: str
    params: int
    loglik: float
    aic: float


# ---------------------------------------------------------------- fitting


def _loglik_poisson(gaps: np.ndarray) -> tuple[Poisson, float]:
    rate = len(gaps) / gaps.sum()
    return Poisson(rate=rate), float(len(gaps) * math.log(rate) - rate * gaps.sum())


def _loglik_gamma(gaps: np.ndarray) -> tuple[GammaRenewal, float]:
    mean, var = float(gaps.mean()), float(gaps.var())
    if var <= (1e-6 * mean) ** 2:  # (nearly) clockwork arrivals: the MLE does not exist, use moments
        shape = 1e6
        scale = mean / shape
    else:
        shape, _, scale = stats.gamma.fit(gaps, floc=0.0)
    return GammaRenewal(shape=shape, scale=scale), float(stats.gamma.logpdf(gaps, shape, scale=scale).sum())


def _hmm_pass(gaps: np.ndarray, rates: tuple[float, float], stay: tuple[float, float]):
    """Scaled forward-backward for the two-state exponential HMM: (loglik, state posteriors,
    expected transition counts)."""
    n = len(gaps)
    b0 = rates[0] * np.exp(-rates[0] * gaps)
    b1 = rates[1] * np.exp(-rates[1] * gaps)
    scale_em = np.maximum(b0, b1)  # emissions rescaled per step for stability, restored in the loglik
    scale_em = np.where(scale_em > 0, scale_em, 1e-300)
    e0 = (b0 / scale_em).tolist()
    e1 = (b1 / scale_em).tolist()
    p00, p11 = stay
    p01, p10 = 1.0 - p00, 1.0 - p11
    pi0 = (p10 / (p01 + p10)) if (p01 + p10) > 0 else 0.5
    f0 = [0.0] * n
    f1 = [0.0] * n
    c = [0.0] * n
    a0, a1 = pi0 * e0[0], (1.0 - pi0) * e1[0]
    for k in range(n):
        if k:
            a0, a1 = (f0[k - 1] * p00 + f1[k - 1] * p10) * e0[k], (f0[k - 1] * p01 + f1[k - 1] * p11) * e1[k]
        s = a0 + a1 or 1e-300
        c[k] = s
        f0[k], f1[k] = a0 / s, a1 / s
    g0 = [0.0] * n
    g1 = [0.0] * n
    n00 = n01 = n10 = n11 = 0.0
    r0 = r1 = 1.0
    g0[-1], g1[-1] = f0[-1], f1[-1]
    for k in range(n - 1, 0, -1):
        # r = backward message at k (scaled); transitions k-1 -> k.
        w0, w1 = e0[k] * r0, e1[k] * r1
        ck = c[k]
        x00 = f0[k - 1] * p00 * w0 / ck
        x01 = f0[k - 1] * p01 * w1 / ck
        x10 = f1[k - 1] * p10 * w0 / ck
        x11 = f1[k - 1] * p11 * w1 / ck
        n00 += x00
        n01 += x01
        n10 += x10
        n11 += x11
        g0[k - 1], g1[k - 1] = x00 + x01, x10 + x11
        r0, r1 = (p00 * w0 + p01 * w1) / ck, (p10 * w0 + p11 * w1) / ck
    loglik = float(np.sum(np.log(c)) + np.sum(np.log(scale_em)))
    return loglik, np.asarray(g0), np.asarray(g1), (n00, n01, n10, n11)


def fit_mmpp2(gaps: np.ndarray, iterations: int = 200, tol: float = 1e-7) -> tuple[MMPP2, float]:
    """EM (Baum-Welch) for the two-state process, started from a few splits of the gaps into a fast
    and a slow group (EM finds local optima); returns the best fit and its log-likelihood."""
    gaps = np.asarray(gaps, dtype=float)
    best: Optional[tuple[MMPP2, float]] = None
    # A short run from each start, then the most promising one to convergence.
    for split in (0.5, 0.9, 0.99):
        cut = float(np.quantile(gaps, split))
        low, high = gaps[gaps <= cut], gaps[gaps > cut]
        if len(low) == 0 or len(high) == 0:
            continue
        got = _em(gaps, (1.0 / max(low.mean(), 1e-12), 1.0 / max(high.mean(), 1e-12)), (split, 1.0 - split), 15, tol)
        if best is None or got[1] > best[1]:
            best = got
    if best is None:  # all gaps equal
        return _em(gaps, (2.0 / gaps.mean(), 0.5 / gaps.mean()), (0.5, 0.5), iterations, tol)
    start = best[0]
    return _em(gaps, tuple(start.rates), tuple(start.stay), iterations, tol)


def _em(gaps, rates, stay, iterations, tol) -> tuple[MMPP2, float]:
    stay = (min(max(stay[0], 1e-3), 1 - 1e-6), min(max(stay[1], 1e-3), 1 - 1e-6))
    last = -math.inf
    for _ in range(iterations):
        loglik, g0, g1, (n00, n01, n10, n11) = _hmm_pass(gaps, rates, stay)
        w0, w1 = g0.sum(), g1.sum()
        rates = (
            max(w0, 1e-12) / max(float(g0 @ gaps), 1e-300),
            max(w1, 1e-12) / max(float(g1 @ gaps), 1e-300),
        )
        stay = (
            n00 / (n00 + n01) if n00 + n01 > 0 else 1.0,
            n11 / (n10 + n11) if n10 + n11 > 0 else 1.0,
        )
        if abs(loglik - last) <= tol * abs(loglik):
            break
        last = loglik
    loglik, *_ = _hmm_pass(gaps, rates, stay)
    order = (0, 1) if rates[0] >= rates[1] else (1, 0)
    return MMPP2(rates=[float(rates[i]) for i in order], stay=[float(min(1.0, stay[i])) for i in order]), loglik


def _fit_piecewise(times: np.ndarray) -> tuple[Piecewise, float, int]:
    """Rate per bin; daily bins of an hour when the trace spans two days or more, else the bin count
    (2 to 96) with the best BIC over the trace's span."""
    t = times - times[0]
    span = float(t[-1])
    events = t[1:]
    if span >= 2 * 86400:
        options = [(24, 3600.0, True)]
    else:
        options = [(k, span / k, False) for k in (2, 4, 8, 16, 32, 64, 96) if len(events) >= 5 * k]
        options = options or [(1, span, False)]
    best = None
    for k, width, daily in options:
        bins = np.minimum((events // width).astype(int), int(span // width) if daily else k - 1)
        if daily:
            counts = np.bincount(bins % 24, minlength=24).astype(float)
            exposure = np.array([np.sum((np.arange(int(span // width) + 1) % 24) == h) for h in range(24)], float) * width
        else:
            counts = np.bincount(bins, minlength=k).astype(float)
            exposure = np.full(k, width)
        rates = counts / np.maximum(exposure, 1e-300)
        ll = float(np.sum(special.xlogy(counts, rates)) - np.sum(rates * exposure))
        # The bin count is chosen by BIC: picking the best of several counts by AIC, then comparing
        # that winner by AIC again, would favour bins on plain Poisson data.
        bic = len(rates) * math.log(max(2, len(events))) - 2 * ll
        if best is None or bic < best[3]:
            best = (Piecewise(bin_seconds=width, rates=rates.tolist()), ll, len(rates), bic)
    assert best is not None
    return best[0], best[1], best[2]


class ArrivalFit(BaseModel):
    """Fitted arrival processes of a task class, the one in use, and how each fitted."""

    model_config = ConfigDict(extra="forbid")

    use: Literal["poisson", "gamma", "mmpp2", "piecewise", "modulated", "empirical", "user"]
    """Which process generates arrivals; 'user' means: give --rate at generate time."""
    processes: dict[str, Process] = {}
    candidates: list[Candidate] = []
    note: Optional[str] = None

    @model_validator(mode="after")
    def _use_exists(self) -> "ArrivalFit":
        if self.use != "user" and self.use not in self.processes:
            raise ValueError(f"use: {self.use!r} has no parameters under processes")
        for name, proc in self.processes.items():
            if proc.kind != name:
                raise ValueError(f"processes.{name} has kind {proc.kind!r}")
        return self

    def process(self, rate: Optional[float] = None) -> _Process:
        """The process to generate from; with `rate`, scaled to that mean rate (Poisson for 'user')."""
        if self.use == "user":
            if rate is None:
                raise ValueError(self.note or "this model has no fitted arrivals: give a rate")
            return Poisson(rate=rate)
        proc = self.processes[self.use]
        return proc if rate is None else proc.scaled(rate / proc.mean_rate())


BATCH_WINDOW = 0.02
"""Seconds: requests closer than this form one batch (a client sending several at once), far below
human and tool timescales."""


def fit_modulated(times: np.ndarray, curve: Piecewise, batch_window: float = BATCH_WINDOW) -> Optional[tuple[Modulated, float, int]]:
    """The three-timescale process: `curve` as a time change, batches split at `batch_window`, and an
    MMPP2 fitted by EM to the batch epochs in operational time. Returns (process, log-likelihood,
    parameter count); the likelihood takes the batch split as given."""
    t = np.sort(np.asarray(times, dtype=float))
    t = t - t[0]
    gaps = np.diff(t)
    starts = np.flatnonzero(np.concatenate([[True], gaps > batch_window]))
    sizes = np.diff(np.concatenate([starts, [len(t)]]))
    inner = gaps[gaps <= batch_window]
    if len(starts) < 20:
        return None
    speed = np.asarray(curve.rates) / np.mean(curve.rates)
    probe = Modulated(curve=curve, base=MMPP2(rates=[1.0, 1.0], stay=[0.5, 0.5]), batch_window=batch_window,
                      batch_sizes=Discrete(values=[1], probs=[1.0]), batch_gap_mean=0.0)
    u = probe.to_operational(t[starts])
    ugaps = np.diff(u)
    positive = ugaps[ugaps > 0]
    ugaps = np.where(ugaps > 0, ugaps, positive.min() / 2 if len(positive) else 1e-6)
    base, ll = fit_mmpp2(ugaps)
    # Jacobian of the time change at each epoch after the first.
    bins = np.minimum((t[starts][1:] // curve.bin_seconds).astype(int), len(speed) - 1)
    ll += float(np.sum(np.log(np.maximum(speed[bins], 1e-300))))
    sizes_dist = fit_discrete(sizes)
    ll += float(np.sum(np.log(np.asarray(sizes_dist.probs)[np.searchsorted(sizes_dist.values, sizes)])))
    mean_gap = float(inner.mean()) if len(inner) else 0.0
    if len(inner) and mean_gap > 0:
        top = 1.0 - math.exp(-batch_window / mean_gap)
        ll += float(np.sum(-np.log(mean_gap) - inner / mean_gap - math.log(top)))
    params = len(curve.rates) + 4 + (len(sizes_dist.values) - 1) + 1
    proc = Modulated(curve=curve, base=base, batch_window=batch_window, batch_sizes=sizes_dist, batch_gap_mean=mean_gap)
    return proc, ll, params


def fit_arrivals(times: np.ndarray, min_arrivals: int = 3) -> ArrivalFit:
    """Fit every candidate to arrival times; use the best AIC (the simplest within 2 units of it).
    Too few distinct times → 'user'."""
    t = np.sort(np.asarray(times, dtype=float))
    if len(t) < min_arrivals or t[-1] <= t[0]:
        why = "one task" if len(t) <= 1 else f"all {len(t)} tasks arrive at the same time" if t[-1] <= t[0] else f"only {len(t)} tasks"
        return ArrivalFit(use="user", note=f"arrivals: {why}, so the trace gives no arrival process; pass a rate at generate time (--rate TASKS_PER_S)")
    gaps = np.diff(t)
    positive = gaps[gaps > 0]
    # Simultaneous arrivals (clock resolution) get half the smallest recorded gap, so densities stay finite.
    gaps = np.where(gaps > 0, gaps, positive.min() / 2 if len(positive) else 1e-6)
    fits: dict[str, _Process] = {}
    cands: list[Candidate] = []
    proc, ll = _loglik_poisson(gaps)
    fits["poisson"] = proc
    cands.append(Candidate(kind="poisson", params=1, loglik=ll, aic=2 - 2 * ll))
    proc, ll = _loglik_gamma(gaps)
    fits["gamma"] = proc
    cands.append(Candidate(kind="gamma", params=2, loglik=ll, aic=4 - 2 * ll))
    if len(gaps) >= 10:
        proc, ll = fit_mmpp2(gaps)
        fits["mmpp2"] = proc
        cands.append(Candidate(kind="mmpp2", params=4, loglik=ll, aic=8 - 2 * ll))
    proc, ll, k = _fit_piecewise(t)
    fits["piecewise"] = proc
    cands.append(Candidate(kind="piecewise", params=k, loglik=ll, aic=2 * k - 2 * ll))
    got = fit_modulated(t, proc) if len(gaps) >= 50 else None
    if got is not None:
        fits["modulated"], ll, k = got
        cands.append(Candidate(kind="modulated", params=k, loglik=ll, aic=2 * k - 2 * ll))
    fits["empirical"] = EmpiricalArrivals(times=[float(f"{x:.6f}") for x in (t - t[0])])
    for c in cands:
        c.loglik = round(c.loglik, 3)
        c.aic = round(c.aic, 3)
    # Candidates within 2 AIC units of the best are equally supported; the simplest of them is used.
    lowest = min(c.aic for c in cands)
    best = min((c for c in cands if c.aic <= lowest + 2.0), key=lambda c: (c.params, c.aic))
    return ArrivalFit(use=best.kind, processes=fits, candidates=cands)
