"""How closely one workload resembles another: per-marginal KS distances and percentile ratios, and
ratios of arrival burstiness.

Typical use: `a` is a recorded trace, `b` a workload generated from a model fitted to it. Ratios are
``b / a``; 1 means equal. A ratio is None when either value is missing or only `a`'s is 0 (two zeros give 1).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
from scipy.stats import ks_2samp

from .stats import DISPERSION_WINDOWS, LABELS, MARGINALS, Distribution, arrival_stats, workload_samples
from ..workload import Workload


@dataclass(frozen=True)
class MarginalComparison:
    """One distribution of `a` against the same of `b`."""

    name: str
    count_a: int
    count_b: int
    ks: Optional[float]
    """Two-sample Kolmogorov-Smirnov statistic (0: same distribution, 1: disjoint); None if a side is empty."""
    ks_pvalue: Optional[float]
    p50_ratio: Optional[float]
    p90_ratio: Optional[float]
    p99_ratio: Optional[float]


@dataclass(frozen=True)
class ArrivalComparison:
    """Burstiness of `b`'s arrivals relative to `a`'s."""

    interarrival_cv_ratio: Optional[float]
    dispersion_ratio: dict[str, Optional[float]]
    """Ratio of the index of dispersion per window ('1s', '10s', '60s')."""


@dataclass(frozen=True)
class Comparison:
    """Everything `compare_workloads` reports."""

    marginals: list[MarginalComparison]
    arrivals: ArrivalComparison

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values."""
        return dataclasses.asdict(self)

    def tables(self, title_a: str = "A", title_b: str = "B") -> list[Any]:
        """Rich tables: one row per marginal, then the arrival ratios (KS p-values are in `to_dict`)."""
        from rich.table import Table

        marg = Table(title=f"Distributions: {title_b} vs {title_a} (ratios {title_b}/{title_a})")
        marg.add_column("marginal", no_wrap=True)
        for col in ("n A", "n B", "KS", "p50 ratio", "p90 ratio", "p99 ratio"):
            marg.add_column(col, justify="right")
        for m in self.marginals:
            marg.add_row(LABELS.get(m.name, m.name), str(m.count_a), str(m.count_b), _fmt(m.ks),
                         _fmt(m.p50_ratio), _fmt(m.p90_ratio), _fmt(m.p99_ratio))
        arr = Table(title="Arrivals (ratios B/A)")
        arr.add_column("measure")
        arr.add_column("ratio", justify="right")
        arr.add_row("inter-arrival CV", _fmt(self.arrivals.interarrival_cv_ratio))
        for window, ratio in self.arrivals.dispersion_ratio.items():
            arr.add_row(f"index of dispersion, {window}", _fmt(ratio))
        return [marg, arr]


def compare_workloads(a: Workload, b: Workload) -> Comparison:
    """Compare `b` against `a` on every marginal of `simulator.model.stats` and on arrival burstiness."""
    sa, sb = workload_samples(a), workload_samples(b)
    marginals = [_compare_marginal(name, getattr(sa, name), getattr(sb, name)) for name in MARGINALS]
    arr_a, arr_b = arrival_stats(sa.arrivals), arrival_stats(sb.arrivals)
    dispersion = {
        key: _ratio(arr_b.index_of_dispersion[key], arr_a.index_of_dispersion[key])
        for key in (f"{w:g}s" for w in DISPERSION_WINDOWS)
    }
    return Comparison(marginals, ArrivalComparison(_ratio(arr_b.interarrival_cv, arr_a.interarrival_cv), dispersion))


def _compare_marginal(name: str, a: np.ndarray, b: np.ndarray) -> MarginalComparison:
    da, db = Distribution.of(a), Distribution.of(b)
    ks = pvalue = None
    if a.size and b.size:
        result = ks_2samp(a, b)
        ks, pvalue = float(result.statistic), float(result.pvalue)
    return MarginalComparison(
        name, da.count, db.count, ks, pvalue,
        _ratio(db.p50, da.p50), _ratio(db.p90, da.p90), _ratio(db.p99, da.p99),
    )


def _ratio(b: Optional[float], a: Optional[float]) -> Optional[float]:
    if a is None or b is None:
        return None
    if a == 0:
        return 1.0 if b == 0 else None
    return b / a


def _fmt(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.3f}"
