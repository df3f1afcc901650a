"""Arrival processes: EM for the two-state MMPP, AIC choice, the other fits, sampling."""

import numpy as np
import pytest

from simulator.model.arrivals import (
    MMPP2, ArrivalFit, EmpiricalArrivals, GammaRenewal, Modulated, Piecewise, Poisson, fit_arrivals, fit_mmpp2,
)
from simulator.model.dists import Discrete
from simulator.model.stats import index_of_dispersion

_MODULATED = Modulated(
    curve=Piecewise(bin_seconds=60.0, rates=[1.0, 0.0, 3.0, 0.5]),
    base=MMPP2(rates=[4.0, 0.2], stay=[0.95, 0.7]),
    batch_window=0.02,
    batch_sizes=Discrete(values=[1, 3], probs=[0.6, 0.4]),
    batch_gap_mean=0.002,
)


def _bursty(seed: int, n: int = 6000) -> np.ndarray:
    truth = MMPP2(rates=[20.0, 0.5], stay=[0.98, 0.9])
    return truth.sample(np.random.default_rng(seed), n=n)


def test_mmpp_em_recovers_two_rates():
    times = _bursty(1)
    fit, _ = fit_mmpp2(np.diff(times))
    assert fit.rates[0] == pytest.approx(20.0, rel=0.1)
    assert fit.rates[1] == pytest.approx(0.5, rel=0.2)
    assert fit.stay[0] == pytest.approx(0.98, abs=0.02)
    assert fit.stay[1] == pytest.approx(0.9, abs=0.06)


def test_aic_picks_poisson_for_poisson_data():
    times = Poisson(rate=3.0).sample(np.random.default_rng(2), n=3000)
    fit = fit_arrivals(times)
    assert fit.use == "poisson"
    assert fit.processes["poisson"].rate == pytest.approx(3.0, rel=0.05)
    assert {c.kind for c in fit.candidates} == {"poisson", "gamma", "mmpp2", "piecewise", "modulated"}


def test_aic_picks_mmpp_for_bursty_data():
    fit = fit_arrivals(_bursty(3))
    assert fit.use == "mmpp2"
    aic = {c.kind: c.aic for c in fit.candidates}
    assert aic["mmpp2"] < aic["poisson"] - 100


def test_gamma_renewal_recovers_shape():
    times = GammaRenewal(shape=0.3, scale=2.0).sample(np.random.default_rng(4), n=5000)
    fit = fit_arrivals(times)
    assert fit.processes["gamma"].shape == pytest.approx(0.3, rel=0.08)
    assert fit.use in {"gamma", "mmpp2"}


def test_piecewise_recovers_a_rate_step():
    truth = Piecewise(bin_seconds=1000.0, rates=[1.0, 5.0])
    times = truth.sample(np.random.default_rng(5), duration=2000.0)
    fit = fit_arrivals(times)
    assert fit.use == "piecewise"
    rates = fit.processes["piecewise"].rates
    half = len(rates) // 2
    assert np.mean(rates[:half]) == pytest.approx(1.0, rel=0.15)
    assert np.mean(rates[half:]) == pytest.approx(5.0, rel=0.1)


def test_equal_arrivals_need_a_user_rate():
    fit = fit_arrivals(np.zeros(40))
    assert fit.use == "user" and "--rate" in fit.note
    with pytest.raises(ValueError):
        fit.process()
    assert fit.process(rate=2.0).rate == 2.0


@pytest.mark.parametrize(
    "proc",
    [
        Poisson(rate=4.0),
        GammaRenewal(shape=0.5, scale=0.5),
        MMPP2(rates=[10.0, 1.0], stay=[0.9, 0.8]),
        Piecewise(bin_seconds=10.0, rates=[0.0, 8.0]),
        EmpiricalArrivals(times=[0.0, 0.1, 0.2, 3.0]),
        _MODULATED,
    ],
)
def test_sampling_matches_mean_rate_and_scaling(proc):
    rng = np.random.default_rng(6)
    times = proc.sample(rng, n=40000)
    assert np.all(np.diff(times) >= 0)
    assert len(times) / times[-1] == pytest.approx(proc.mean_rate(), rel=0.06)
    faster = proc.scaled(3.0)
    assert faster.mean_rate() == pytest.approx(3 * proc.mean_rate())
    within = proc.sample(np.random.default_rng(7), duration=100.0)
    assert within.max() < 100.0
    again = proc.sample(np.random.default_rng(7), duration=100.0)
    assert np.array_equal(within, again)


def test_arrival_fit_rejects_a_missing_process():
    with pytest.raises(ValueError):
        ArrivalFit(use="mmpp2", processes={})


def test_modulated_fit_recovers_batches_and_keeps_dispersion():
    times = _MODULATED.sample(np.random.default_rng(8), duration=3600.0)
    fit = fit_arrivals(times)
    assert fit.use == "modulated"
    got = fit.processes["modulated"]
    sizes = dict(zip(got.batch_sizes.values, got.batch_sizes.probs))
    # Batches that happen to start within the window of each other merge, so sizes run a bit large.
    assert sizes[1] == pytest.approx(0.6, abs=0.1)
    assert np.dot(got.batch_sizes.values, got.batch_sizes.probs) == pytest.approx(1.8, rel=0.2)
    assert 0.002 <= got.batch_gap_mean < 0.004  # merged batches add a few longer gaps
    again = got.sample(np.random.default_rng(9), duration=3600.0)
    for window in (1.0, 10.0, 60.0):
        ratio = index_of_dispersion(again, window) / index_of_dispersion(times, window)
        assert 0.6 < ratio < 1.6
