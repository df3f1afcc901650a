"""Calibration: the fit recovers known step-time coefficients from the twin's own measurements."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.sim.calibrate import FIT_TERMS, calibrate, design_sweep, fit, fit_report, measure_on_twin
from simulator.sim.profile import load_profile

TRUE = {"fixed": 0.004, "per_token": 2.0e-5, "per_decode_seq": 5.0e-5, "per_context_token": 2.0e-8}


def known_profile():
    return load_profile("tiny-vllm-cpu", overrides={
        "step_time": {**TRUE, "schedule_fixed": 0.0, "schedule_per_seq": 0.0},
        "scheduler": {"max_num_seqs": 64},
    })


def test_sweep_separates_prefill_and_decode_within_limits():
    points = design_sweep(known_profile())
    kinds = {p.kind for p in points}
    assert kinds == {"prefill", "decode"}
    assert all(p.input_tokens + p.output_tokens <= 4096 for p in points)
    assert max(p.concurrency for p in points) == 64


def test_fit_recovers_known_coefficients_from_exact_measurements():
    truth = known_profile()
    result = calibrate(truth, lambda point: measure_on_twin(point, truth))
    for term in FIT_TERMS:
        assert result.coefficients[term] == pytest.approx(TRUE[term], rel=1e-6)
    assert result.rms_relative_error < 1e-9
    assert result.profile.calibrated and result.profile.step_time.fixed == pytest.approx(TRUE["fixed"], rel=1e-6)
    report = fit_report(result)
    assert "per_context_token" in report and "rms relative error" in report


def test_fit_with_noisy_measurements_stays_close_and_reports_errors():
    truth = known_profile()
    points = design_sweep(truth)
    rng = np.random.default_rng(3)
    measured = [measure_on_twin(p, truth) * (1 + rng.normal(0, 0.01)) for p in points]
    result = fit(points, measured, truth)
    for term in ("fixed", "per_token", "per_decode_seq"):
        assert result.coefficients[term] == pytest.approx(TRUE[term], rel=0.1)
        assert result.stderr[term] > 0
    assert 0.003 < result.rms_relative_error < 0.03


def test_fit_rejects_mismatched_or_non_positive_measurements():
    truth = known_profile()
    points = design_sweep(truth)[:3]
    with pytest.raises(ValueError):
        fit(points, [0.1, 0.2], truth)
    with pytest.raises(ValueError):
        fit(points, [0.1, 0.0, 0.2], truth)
