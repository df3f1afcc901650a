"""Fitting single-quantity distributions: parameters recovered, the right family picked."""

import numpy as np
import pytest
from pydantic import TypeAdapter, ValidationError

from simulator.model.dists import Dist, Empirical, LogNormal, LogNormalPareto, fit_discrete, fit_empirical, fit_positive, ks_distance


def test_lognormal_parameters_recovered():
    x = np.random.default_rng(1).lognormal(3.0, 1.2, 5000)
    dist, reports = fit_positive(x)
    assert dist.kind == "lognormal"
    assert dist.mu == pytest.approx(3.0, abs=0.05)
    assert dist.sigma == pytest.approx(1.2, abs=0.05)
    assert {r.family for r in reports} == {"lognormal", "lognormal_pareto", "empirical"}


def test_pareto_tail_recovered():
    truth = LogNormalPareto(mu=2.0, sigma=0.7, tail_prob=0.1, tail_start=20.0, tail_alpha=1.5)
    x = truth.sample(np.random.default_rng(2), 20000)
    dist, _ = fit_positive(x)
    assert dist.kind == "lognormal_pareto"
    assert dist.tail_alpha == pytest.approx(1.5, rel=0.12)
    assert dist.tail_start == pytest.approx(20.0, rel=0.1)
    assert ks_distance(dist, x) < 0.02


def test_bimodal_data_gets_the_empirical_quantile_function():
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.lognormal(1.0, 0.2, 3000), rng.lognormal(6.0, 0.2, 3000)])
    dist, _ = fit_positive(x)
    assert dist.kind == "empirical"
    drawn = dist.sample(np.random.default_rng(4), 50000)
    assert np.percentile(drawn, 99) == pytest.approx(np.percentile(x, 99), rel=0.05)


def test_zeros_and_whole_numbers_are_kept():
    rng = np.random.default_rng(5)
    x = np.where(rng.random(4000) < 0.2, 0.0, np.rint(rng.lognormal(2.0, 1.0, 4000)))
    dist, _ = fit_positive(x)
    assert dist.integer
    drawn = dist.sample(np.random.default_rng(6), 20000)
    assert np.all(drawn == np.rint(drawn))
    assert np.mean(drawn == 0) == pytest.approx(np.mean(x == 0), abs=0.02)


def test_empirical_and_discrete_follow_the_data():
    x = np.random.default_rng(7).pareto(1.2, 3000) * 10
    emp = fit_empirical(x)
    assert ks_distance(emp, x) < 0.01
    counts = fit_discrete(np.array([1, 1, 2, 5]))
    assert counts.values == [1, 2, 5] and counts.probs == pytest.approx([0.5, 0.25, 0.25])
    assert list(counts.cdf(np.array([0, 1, 4, 5]))) == pytest.approx([0, 0.5, 0.75, 1.0])


def test_impossible_parameters_are_rejected():
    adapter = TypeAdapter(Dist)
    with pytest.raises(ValidationError):
        adapter.validate_python({"kind": "lognormal", "mu": 1.0, "sigma": -1.0})
    with pytest.raises(ValidationError):
        adapter.validate_python({"kind": "discrete", "values": [1, 2], "probs": [0.5, 0.6]})
    with pytest.raises(ValidationError):
        adapter.validate_python({"kind": "gaussian", "mu": 1.0, "sigma": 1.0})
    with pytest.raises(ValidationError):
        Empirical(probs=[0.0, 0.5, 1.0], values=[3.0, 2.0, 4.0])
    assert LogNormal(mu=0.0, sigma=1.0).cdf(np.array([1.0]))[0] == pytest.approx(0.5)
