"""Distributions of one quantity (tokens, gaps, counts): their YAML form, fitting and vectorised sampling.

Every distribution is a pydantic model with a ``kind`` tag, so a model file names it plainly and a
typo or an impossible parameter is caught on load. Common to all: ``zero_prob`` (a point mass at 0,
since a few gaps are exactly zero and no log-normal makes them) and ``integer`` (draws are rounded,
for token counts and for traces that record whole seconds). Heavy tails are the rule here, so the
families are log-normal, a log-normal body with a Pareto tail, and an empirical quantile function;
`fit_positive` tries them all and picks by goodness of fit (Kolmogorov-Smirnov distance).
"""

from __future__ import annotations

import math
from typing import Annotated, Literal, Optional, Union

import numpy as np
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from scipy import optimize, special, stats

Prob = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]
Positive = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]
Finite = Annotated[float, Field(allow_inf_nan=False)]

PARAMETRIC_PVALUE = 0.5
"""A parametric family is used when the KS test's p-value against the data is at least this."""

SUM_TOLERANCE = 1e-4
"""How far from 1 a hand-edited list of probabilities may sum (model files round to 6 digits)."""

KNOTS = 160
"""Quantile-function knots kept by an empirical fit (denser in the upper tail, where p99 lives)."""


class _Dist(BaseModel):
    model_config = ConfigDict(extra="forbid")

    zero_prob: Prob = 0.0
    """Probability of an exact 0."""
    integer: bool = False
    """Round draws to whole numbers."""
    upper: Optional[Annotated[float, Field(gt=0.0, allow_inf_nan=False)]] = None
    """Draws above this are cut to it (fits set twice the largest value seen: a Pareto tail with
    alpha < 1 would otherwise now and then draw a million-fold outlier)."""

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """`n` draws as float64 (rounded when `integer`)."""
        return self.quantile(rng.random(n))

    def quantile(self, u: np.ndarray) -> np.ndarray:
        """The draws that uniform numbers `u` in [0, 1) map to (what `sample` returns for them)."""
        u = np.asarray(u, dtype=float)
        x = self._ppf_positive(np.clip((u - self.zero_prob) / max(1e-300, 1.0 - self.zero_prob), 0.0, 1.0))
        if self.zero_prob > 0.0:
            x = np.where(u < self.zero_prob, 0.0, x)
        if self.upper is not None:
            x = np.minimum(x, self.upper)
        return np.rint(x) if self.integer else x

    def cdf(self, x: np.ndarray) -> np.ndarray:
        """P(draw <= x), rounding and the zero mass included."""
        x = np.asarray(x, dtype=float)
        edge = np.floor(x) + 0.5 if self.integer else x
        body = self._cdf_positive(np.maximum(edge, 0.0))
        out = self.zero_prob + (1.0 - self.zero_prob) * body
        if self.upper is not None:
            out = np.where(x >= self.upper, 1.0, out)
        return np.where(x < 0, 0.0, out)

    def _ppf_positive(self, p: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def _cdf_positive(self, x: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError


class Constant(_Dist):
    """Always the same value."""

    kind: Literal["constant"] = "constant"
    value: Annotated[float, Field(ge=0.0, allow_inf_nan=False)]

    def _ppf_positive(self, p):
        return np.full(np.shape(p), self.value)

    def _cdf_positive(self, x):
        return (x >= self.value).astype(float)


class LogNormal(_Dist):
    """exp(N(mu, sigma²))."""

    kind: Literal["lognormal"] = "lognormal"
    mu: Finite
    sigma: Positive

    def _ppf_positive(self, p):
        return np.exp(self.mu + self.sigma * special.ndtri(np.clip(p, 1e-12, 1 - 1e-12)))

    def _cdf_positive(self, x):
        with np.errstate(divide="ignore"):
            return special.ndtr((np.log(np.maximum(x, 1e-300)) - self.mu) / self.sigma)


class LogNormalPareto(_Dist):
    """A log-normal body below `tail_start` and a Pareto tail above it, weighted `1 - tail_prob` : `tail_prob`."""

    kind: Literal["lognormal_pareto"] = "lognormal_pareto"
    mu: Finite
    sigma: Positive
    tail_prob: Annotated[float, Field(gt=0.0, lt=1.0)]
    tail_start: Positive
    tail_alpha: Positive

    def _body_mass(self) -> float:
        return max(1e-300, float(special.ndtr((math.log(self.tail_start) - self.mu) / self.sigma)))

    def _ppf_positive(self, p):
        p = np.asarray(p, dtype=float)
        body_p = np.clip(p / (1.0 - self.tail_prob), 0.0, 1.0) * self._body_mass()
        body = np.exp(self.mu + self.sigma * special.ndtri(np.clip(body_p, 1e-12, 1 - 1e-12)))
        tail_u = np.clip((1.0 - p) / self.tail_prob, 1e-12, 1.0)
        tail = self.tail_start * tail_u ** (-1.0 / self.tail_alpha)
        return np.where(p < 1.0 - self.tail_prob, np.minimum(body, self.tail_start), tail)

    def _cdf_positive(self, x):
        x = np.asarray(x, dtype=float)
        with np.errstate(divide="ignore"):
            z = (np.log(np.maximum(x, 1e-300)) - self.mu) / self.sigma
        body = (1.0 - self.tail_prob) * np.minimum(special.ndtr(z) / self._body_mass(), 1.0)
        tail = 1.0 - self.tail_prob * (np.maximum(x, self.tail_start) / self.tail_start) ** (-self.tail_alpha)
        return np.where(x < self.tail_start, body, tail)


class Empirical(_Dist):
    """A quantile function: `values[i]` is the `probs[i]` quantile, linear in between."""

    kind: Literal["empirical"] = "empirical"
    probs: list[Prob]
    values: list[Annotated[float, Field(ge=0.0, allow_inf_nan=False)]]

    @model_validator(mode="after")
    def _check(self) -> "Empirical":
        if len(self.probs) != len(self.values) or len(self.probs) < 2:
            raise ValueError("probs and values need the same length, at least 2")
        if self.probs[0] != 0.0 or self.probs[-1] != 1.0:
            raise ValueError("probs must run from 0 to 1")
        if any(b < a for a, b in zip(self.probs, self.probs[1:])) or any(
            b < a for a, b in zip(self.values, self.values[1:])
        ):
            raise ValueError("probs and values must be non-decreasing")
        return self

    def _ppf_positive(self, p):
        return np.interp(p, self.probs, self.values)

    def _cdf_positive(self, x):
        v = np.asarray(self.values)
        p = np.asarray(self.probs)
        # Invert the piecewise-linear quantile function; flat stretches of `values` are jumps of the CDF.
        idx = np.searchsorted(v, x, side="right")
        lo = np.clip(idx - 1, 0, len(v) - 1)
        hi = np.clip(idx, 0, len(v) - 1)
        span = v[hi] - v[lo]
        frac = np.where(span > 0, (x - v[lo]) / np.where(span > 0, span, 1.0), 0.0)
        out = p[lo] + frac * (p[hi] - p[lo])
        return np.where(x < v[0], 0.0, np.where(x >= v[-1], 1.0, out))


def _sum_one(probs: list[float]) -> list[float]:
    if abs(sum(probs) - 1.0) > SUM_TOLERANCE:
        raise ValueError(f"probabilities must sum to 1 (they sum to {sum(probs):.6g})")
    return probs


class Discrete(_Dist):
    """Whole numbers with given probabilities (calls per task, fan-out)."""

    kind: Literal["discrete"] = "discrete"
    values: list[Annotated[int, Field(ge=0)]]
    probs: Annotated[list[Prob], AfterValidator(_sum_one)]

    @model_validator(mode="after")
    def _check(self) -> "Discrete":
        if len(self.values) != len(self.probs) or not self.values:
            raise ValueError("values and probs need the same, non-zero length")
        return self

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        p = np.asarray(self.probs, dtype=float)
        return np.asarray(self.values, dtype=float)[rng.choice(len(p), size=n, p=p / p.sum())]

    def cdf(self, x):
        order = np.argsort(self.values)
        v = np.asarray(self.values, dtype=float)[order]
        cum = np.concatenate([[0.0], np.cumsum(np.asarray(self.probs, dtype=float)[order])])
        return cum[np.searchsorted(v, np.asarray(x, dtype=float), side="right")]


Dist = Annotated[Union[Constant, LogNormal, LogNormalPareto, Empirical, Discrete], Field(discriminator="kind")]


class FitReport(BaseModel):
    """Goodness of fit of one candidate family (KS distance to the data)."""

    model_config = ConfigDict(extra="forbid")
    family: str
    ks: float


# ---------------------------------------------------------------- fitting


def _quantile_knots(n: int) -> np.ndarray:
    body = np.linspace(0.0, 0.9, KNOTS // 2)
    tail = 1.0 - np.geomspace(0.1, max(1e-4, 0.5 / max(n, 1)), KNOTS // 2)
    return np.unique(np.concatenate([body, tail, [1.0]]))


def fit_empirical(x: np.ndarray, integer: bool = False) -> Empirical:
    """The data's own quantile function, at `KNOTS` probabilities."""
    x = np.sort(np.asarray(x, dtype=float))
    probs = _quantile_knots(len(x))
    values = np.maximum.accumulate([float(f"{v:.6g}") for v in np.quantile(x, probs)])
    return Empirical(probs=probs.round(5).tolist(), values=values.tolist(), integer=integer)


def fit_discrete(x: np.ndarray) -> Discrete:
    """The observed frequencies of whole numbers."""
    values, counts = np.unique(np.asarray(x, dtype=int), return_counts=True)
    probs = counts / counts.sum()
    return Discrete(values=values.tolist(), probs=[round(float(p), 6) for p in probs])


def ks_distance(dist: _Dist, x: np.ndarray) -> float:
    """Kolmogorov-Smirnov distance between the data and the distribution (ties handled)."""
    x = np.sort(np.asarray(x, dtype=float))
    uniq, last = np.unique(x, return_index=False, return_counts=True)
    ecdf_hi = np.cumsum(last) / len(x)
    ecdf_lo = ecdf_hi - last / len(x)
    model_hi = dist.cdf(uniq)
    below = np.nextafter(uniq, -np.inf) if not dist.integer else uniq - 1.0
    model_lo = dist.cdf(below)
    return float(max(np.max(np.abs(ecdf_hi - model_hi)), np.max(np.abs(ecdf_lo - model_lo))))


def _fit_lognormal(pos: np.ndarray) -> tuple[float, float]:
    logs = np.log(pos)
    return float(logs.mean()), float(max(logs.std(), 1e-6))


def _fit_lognormal_pareto(pos: np.ndarray, tail_prob: float) -> Optional[tuple[float, float, float, float]]:
    """(mu, sigma, tail_start, alpha): Hill estimate above the (1 - tail_prob) quantile, a truncated
    log-normal MLE below it."""
    u = float(np.quantile(pos, 1.0 - tail_prob))
    over = pos[pos > u]
    under = np.log(pos[pos <= u])
    if len(over) < 5 or len(under) < 5 or u <= 0:
        return None
    alpha = len(over) / float(np.sum(np.log(over / u)))
    lu = math.log(u)

    def nll(theta: np.ndarray) -> float:
        mu, log_sigma = theta
        s = math.exp(log_sigma)
        mass = stats.norm.logcdf((lu - mu) / s)
        return float(-(stats.norm.logpdf(under, mu, s).sum() - len(under) * mass))

    start = np.array([under.mean(), math.log(max(under.std(), 1e-3))])
    res = optimize.minimize(nll, start, method="Nelder-Mead", options={"xatol": 1e-4, "fatol": 1e-6, "maxiter": 400})
    mu, log_sigma = res.x
    return float(mu), float(math.exp(log_sigma)), u, float(alpha)


def fit_positive(
    x: np.ndarray, *, integer: Optional[bool] = None, allow_empirical: bool = True
) -> tuple[_Dist, list[FitReport]]:
    """Fit a non-negative quantity; returns the chosen distribution and every candidate's KS distance.

    A parametric family is chosen when it fits comfortably (KS p-value >= `PARAMETRIC_PVALUE`; the
    simpler family first); otherwise the empirical quantile function, which follows any shape. A bare
    "not rejected at 5 %" let small cells take log-normals whose tails missed the data's p99."""
    x = np.asarray(x, dtype=float)
    if len(x) == 0:
        raise ValueError("no data")
    if integer is None:
        integer = bool(np.all(x == np.rint(x)))
    zero_prob = float(np.mean(x <= 0))
    pos = x[x > 0]
    if len(pos) == 0 or np.all(pos == pos[0]):
        value = float(pos[0]) if len(pos) else 0.0
        return Constant(value=value, zero_prob=zero_prob if value > 0 else 0.0, integer=integer), []
    candidates: list[tuple[str, _Dist]] = []
    upper = float(2.0 * pos.max())
    mu, sigma = _fit_lognormal(pos)
    candidates.append(("lognormal", LogNormal(mu=mu, sigma=sigma, zero_prob=zero_prob, integer=integer, upper=upper)))
    best_tail: Optional[LogNormalPareto] = None
    for tail_prob in (0.05, 0.1, 0.2):
        got = _fit_lognormal_pareto(pos, tail_prob)
        if got is None:
            continue
        m, s, u, a = got
        d = LogNormalPareto(mu=m, sigma=s, tail_prob=tail_prob, tail_start=u, tail_alpha=a, zero_prob=zero_prob,
                            integer=integer, upper=upper)
        if best_tail is None or ks_distance(d, x) < ks_distance(best_tail, x):
            best_tail = d
    if best_tail is not None:
        candidates.append(("lognormal_pareto", best_tail))
    if allow_empirical and len(x) >= 2:
        candidates.append(("empirical", fit_empirical(x, integer=integer)))
    reports = [FitReport(family=name, ks=round(ks_distance(d, x), 5)) for name, d in candidates]
    critical = stats.kstwo.isf(PARAMETRIC_PVALUE, len(x)) if PARAMETRIC_PVALUE < 1 else -1.0
    for (name, dist), rep in zip(candidates, reports):
        if name != "empirical" and rep.ks <= critical:
            return dist, reports
    best = min(range(len(candidates)), key=lambda i: reports[i].ks)
    return candidates[best][1], reports
