"""The band on a simulation's figures: the calibration's fit keeps what the band draws from, the band
holds the nominal figure, widens with the fit's uncertainty, is the same for the same seed, is absent
(and says why) for an uncalibrated profile; `compare` marks differences within the bands, and a study on
the twin says when two configs are within the twin's band."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from rich.console import Console

import conversations as shared
import report_folders as rf
from simulator.calibration.fit import fit
from simulator.calibration.on_twin import measure_on_twin
from simulator.calibration.report import profile_text
from simulator.calibration.sweep import design_sweep
from simulator.cli import main as cli_main
from simulator.cli import simulate
from simulator.metrics.slo import Slo
from simulator.metrics.summary import BANDED_FIGURES, load_summary
from simulator.pipeline.twin import simulate_to_folder
from simulator.report.cells import number
from simulator.report.compare import BAND_MARK, compare_table, comparison, within_band
from simulator.report.csv_export import write_comparison
from simulator.report.terminal import band_lines
from simulator.sim import band as band_mod
from simulator.sim.band import DEFAULT_DRAWS, drawn_profiles
from simulator.sim.profile import ServerProfile, load_profile, profile_from_dict

STEP_TIME = {"fixed": 0.01, "per_token": 2e-5, "per_decode_seq": 3e-4, "per_context_token": 1e-7,
             "request_overhead": 0.004}
TERMS = ("fixed", "per_token", "per_decode_seq")


def profile(spread: float = 0.1, residuals: tuple[float, ...] = (-0.05, 0.02, 0.04, -0.01),
            calibrated: bool = True, record: bool = True, **calibration) -> ServerProfile:
    """A small server whose calibration record gives each of `TERMS` a relative standard deviation of
    `spread` (independent), with these residuals."""
    data = {
        "name": "small", "calibrated": calibrated,
        "scheduler": {"max_num_seqs": 32, "max_num_batched_tokens": 512, "max_model_len": 4096},
        "kv_cache": {"block_size": 16, "num_blocks": 4000},
        "step_time": STEP_TIME,
    }
    if record:
        data["calibration"] = {
            "rms_relative_error": 0.05, "points": 4, "residuals": list(residuals),
            "covariance": {a: {b: (spread * STEP_TIME[a]) ** 2 if a == b else 0.0 for b in TERMS} for a in TERMS},
            **calibration}
    return profile_from_dict(data)


def workload():
    return shared.conversations(5, tasks=14, max_output=40, arrival_span=1.0)


SLO = Slo.model_validate({"task_s": {"p50": 0.5}})


def band_of(tmp_path, prof: ServerProfile, draws: int = 4, name: str = "sim"):
    summary, _ = simulate_to_folder(workload(), prof, tmp_path / name, slo=SLO, scrape_interval=None,
                                    band_draws=draws)
    return summary, summary.simulation.band


# --- what the fit keeps -----------------------------------------------------------------------------


def test_the_fit_records_its_free_terms_covariance_and_each_points_residual():
    truth = load_profile("tiny-vllm-cpu", overrides={"step_time": {"fixed": 0.004, "per_token": 2e-5,
                                                                   "per_decode_seq": 5e-5, "request_overhead": 0.01}})
    points = [p for p in design_sweep(truth, max_concurrency=8, max_prompt=600) if p.kind != "loaded"]
    rng = np.random.default_rng(7)
    measured = [measure_on_twin(p, truth) * (1 + rng.normal(0, 0.02)) for p in points]
    terms = ("fixed", "per_token", "per_decode_seq", "per_context_token", "request_overhead")
    result = fit(points, measured, truth, terms=terms)
    record = result.profile.calibration
    free = [t for t in terms if result.coefficients[t] > 0]
    assert set(free) >= {"fixed", "per_token", "request_overhead"}
    # the free terms only, symmetric, its diagonal the squared standard errors the record gives relatively
    assert list(record.covariance) == free
    cov = np.array([[record.covariance[a][b] for b in free] for a in free])
    assert np.allclose(cov, cov.T, rtol=1e-9, atol=0.0)
    for term in free:
        assert np.sqrt(record.covariance[term][term]) / result.coefficients[term] == pytest.approx(record.terms[term])
    # a point's residual is what its prediction missed by, to 4 decimals
    assert record.residuals == [round(p / m - 1, 4) for p, m in zip(result.predicted, measured)]
    assert any(r != 0 for r in record.residuals)
    # and the profile's YAML keeps both
    written = profile_from_dict(yaml.safe_load(profile_text(result.profile)))
    assert written.calibration.covariance == record.covariance
    assert written.calibration.residuals == record.residuals


# --- the band ---------------------------------------------------------------------------------------


def test_the_band_holds_each_figures_nominal_value_and_keeps_the_records(tmp_path):
    summary, band = band_of(tmp_path, profile())
    plain, _ = simulate_to_folder(workload(), profile(), tmp_path / "plain", slo=SLO, scrape_interval=None)
    assert band.draws == 4 and "range of 1 + 4 simulations" in band.method
    assert set(band.figures) == {b.key for b in BANDED_FIGURES}
    for key, figure in band.figures.items():
        assert figure.low <= figure.value <= figure.high, key
    assert band.figures["tasks.completion_time_s.p50"].value == summary.tasks.completion_time_s.p50
    assert band.figures["p95_ttft_ms"].value == summary.ttft.p95
    assert any(f.high > f.low for f in band.figures.values())
    # the draws write nothing: the folder holds the nominal run's records, as without a band
    assert (tmp_path / "sim" / "calls.jsonl").read_bytes() == (tmp_path / "plain" / "calls.jsonl").read_bytes()
    assert sorted(p.name for p in (tmp_path / "sim").iterdir()) == sorted(p.name for p in (tmp_path / "plain").iterdir())
    assert plain.simulation.band is None


def test_a_fit_without_spread_gives_a_band_of_zero_width(tmp_path):
    _, band = band_of(tmp_path, profile(spread=0.0, residuals=(0.0, 0.0, 0.0)))
    for key, figure in band.figures.items():
        assert figure.low == figure.value == figure.high, key


def test_a_larger_covariance_gives_a_wider_band(tmp_path):
    _, narrow = band_of(tmp_path, profile(spread=0.02, residuals=(0.0,)), name="narrow")
    _, wide = band_of(tmp_path, profile(spread=0.2, residuals=(0.0,)), name="wide")

    def width(band, key):
        f = band.figures[key]
        return f.high - f.low

    for key in ("tasks.completion_time_s.p50", "tasks.completion_time_s.p95", "p95_ttft_ms"):
        assert width(wide, key) > width(narrow, key) > 0, key


def test_the_residuals_alone_move_every_time_by_one_speed_factor():
    prof = profile(spread=0.0, residuals=(0.25,))
    (drawn,) = drawn_profiles(prof, 1, seed=0)
    for term, value in STEP_TIME.items():
        assert getattr(drawn.step_time, term) == pytest.approx(value / 1.25), term
    assert drawn.step_time.idle_after == prof.step_time.idle_after  # a threshold, not a time spent


def test_the_same_seed_gives_the_same_band_and_another_seed_another():
    prof = profile()
    first = [p.step_time for p in drawn_profiles(prof, 3, seed=11)]
    assert first == [p.step_time for p in drawn_profiles(prof, 3, seed=11)]
    assert first != [p.step_time for p in drawn_profiles(prof, 3, seed=12)]


def test_a_profile_calibrated_before_the_fit_kept_its_covariance_draws_from_its_terms_and_rms():
    prof = profile(record=False).model_copy(update={"calibration": profile().calibration.model_copy(
        update={"covariance": {}, "residuals": [], "terms": {"fixed": 0.1, "per_token": 0.0}})})
    drawn = drawn_profiles(prof, 6, seed=0)
    # per_token was fitted at its bound (relative error 0) and per_decode_seq has no error recorded: both
    # move only with the speed factor, by the same ratio; fixed moves on its own besides
    speeds = [d.step_time.per_token / STEP_TIME["per_token"] for d in drawn]
    assert len(set(round(s, 12) for s in speeds)) == 6
    assert [d.step_time.per_decode_seq / STEP_TIME["per_decode_seq"] for d in drawn] == pytest.approx(speeds)
    assert not np.allclose([d.step_time.fixed / STEP_TIME["fixed"] for d in drawn], speeds)
    assert "relative standard errors" in band_mod.method_text(prof.calibration, 6)
    assert "normal of the fit's 5.0% rms error" in band_mod.method_text(prof.calibration, 6)


def test_an_uncalibrated_profile_gets_no_band_says_why_and_simulates_nothing_more(tmp_path, monkeypatch):
    def no_draws(*args, **kwargs):
        raise AssertionError("an uncalibrated profile draws nothing")

    monkeypatch.setattr(band_mod, "figures_on", no_draws)
    _, band = band_of(tmp_path, profile(calibrated=False, record=False))
    assert band.draws == 0 and band.figures == {}
    assert band.note.startswith("no band: uncalibrated profile")
    _, gb300 = band_of(tmp_path, load_profile("gb300-nemotron-super-default"), name="gb300")
    assert gb300.figures == {} and "uncalibrated" in gb300.note


def test_the_band_is_in_summary_json_and_on_the_console(tmp_path):
    _, band = band_of(tmp_path, profile())
    saved = load_summary(tmp_path / "sim").simulation.band
    assert saved == band
    lines = band_lines(saved)
    assert lines[0].startswith("band: range of 1 + 4 simulations")
    p50 = band.figures["tasks.completion_time_s.p50"]
    line = next(line for line in lines if "task p50" in line)
    assert "(band " in line and line.rstrip().endswith(f"{p50.low / p50.value - 1:+.0%}/{p50.high / p50.value - 1:+.0%})")
    assert "e-" not in "".join(lines)
    assert band_lines(band_of(tmp_path, profile(calibrated=False), name="u")[1]) == [
        "no band: uncalibrated profile (no fit to draw its coefficients from)"]


def test_the_command_lines_default_count_of_draws_is_the_bands():
    assert simulate.DEFAULT_DRAWS == DEFAULT_DRAWS


@pytest.mark.parametrize("draws, problem", [("-1", "-1 is negative"), ("two", "'two' is not a whole number")])
def test_a_count_of_draws_that_is_no_count_is_refused_before_anything_runs(tmp_path, capsys, draws, problem):
    from simulator.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "scenarios/quickstart.yaml", "-p", "tiny-vllm-cpu", "-o", str(tmp_path / "out"),
              "--band-draws", draws])
    assert exit_info.value.code == 2
    assert problem in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# --- compare ----------------------------------------------------------------------------------------


def test_compare_shows_the_bands_and_marks_a_difference_within_them(tmp_path):
    band_of(tmp_path, profile(spread=0.2), name="a")
    # the same server 2% slower: within a band that wide; the same one, far slower: beyond it
    band_of(tmp_path, profile(spread=0.2).model_copy(update={"step_time": profile().step_time.model_copy(
        update={"fixed": STEP_TIME["fixed"] * 1.02})}), name="near")
    slow = {t: v * 3 for t, v in STEP_TIME.items()}
    band_of(tmp_path, profile(spread=0.0, residuals=(0.0,)).model_copy(update={"step_time": profile().step_time.model_copy(
        update=slow)}), name="far")
    data = comparison([tmp_path / "a", tmp_path / "near", tmp_path / "far"])
    row = next(r for r in data["rows"] if r["path"] == ["tasks", "completion_time_s", "p50"])
    assert row["within_band"] == [None, True, False]
    assert row["bands"][0]["low"] <= row["values"][0] <= row["bands"][0]["high"]
    # figures without a band make no claim
    assert next(r for r in data["rows"] if r["path"] == ["p99_ttft_ms"])["within_band"] == [None, None, None]
    # a live run's figure (no band) inside a simulation's band is within it; outside, not
    assert within_band(1.0, {"low": 0.9, "high": 1.2}, 1.1, None) is True
    assert within_band(1.0, {"low": 0.9, "high": 1.2}, 1.3, None) is False
    assert within_band(1.0, None, 1.1, None) is None
    # the terminal: the band in brackets beside the figure, the ratio marked
    console = Console(width=300, record=True)
    console.print(compare_table(data["rows"], ["a", "near", "far"]))
    text = console.export_text()
    line = next(line for line in text.splitlines() if "completion p50" in line)
    low, high = row["bands"][0]["low"], row["bands"][0]["high"]
    assert f"[{number(low)}–{number(high)}]" in line and BAND_MARK.strip() in line
    assert "within the band" in text
    # the CSV: each folder's band and the within-band column
    summaries = [load_summary(tmp_path / n) for n in ("a", "near", "far")]
    (path,) = write_comparison(summaries, ["a", "near", "far"], tmp_path / "csv")
    rows = list(csv.DictReader(path.open()))
    p50 = next(r for r in rows if r["field"] == "tasks.completion_time_s.p50")
    assert float(p50["A band low"]) == low and p50["B within band of A"] == "True" and p50["C within band of A"] == "False"


# --- a study on the twin ----------------------------------------------------------------------------


ROOT = Path(__file__).resolve().parents[1]

BAND_STUDY = """\
name: band-pair
scenario: {scenario}
set: [workload.transforms.gap_cap=0]
slo:
  task_s: {{p50: 1.5}}
configs:
  base: {{name: a, profile: calibrated.yaml}}
  variants:
    - {{name: b, overlay: {{step_time: {{fixed: {fixed}}}}}}}
load: {{axis: rate, points: [2]}}
objective: p95_task
"""


def calibrated_tiny(spread: float) -> str:
    tiny = load_profile("tiny-vllm-cpu").step_time
    terms = ("fixed", "per_token", "per_decode_seq")
    cov = {a: {b: (spread * getattr(tiny, a)) ** 2 if a == b else 0.0 for b in terms} for a in terms}
    return yaml.safe_dump({"base": "tiny-vllm-cpu", "name": "tiny-calibrated", "calibration": {
        "rms_relative_error": 0.03, "points": 3, "covariance": cov, "residuals": [0.0]}})


def band_study(tmp_path, spread: float, fixed_scale: float, name: str):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "calibrated.yaml").write_text(calibrated_tiny(spread))
    fixed = load_profile("tiny-vllm-cpu").step_time.fixed * fixed_scale
    (folder / "study.yaml").write_text(BAND_STUDY.format(scenario=ROOT / "scenarios" / "vllm" / "claude-code.yaml",
                                                         fixed=fixed))
    assert cli_main(["study", str(folder / "study.yaml"), "-o", str(folder / "out"), "--html"]) == 0
    return json.loads((folder / "out" / "study.json").read_text()), (folder / "out" / "report.html").read_text()


def test_a_study_on_the_twin_says_when_two_configs_are_within_its_band(tmp_path, capsys):
    # b 3% slower per step than a, the calibration's terms uncertain by 30%: their bands overlap
    study, page = band_study(tmp_path, spread=0.3, fixed_scale=1.03, name="near")
    a, b = study["configs"]
    for c in (a, b):
        band = c["twin_band"]
        assert band["figure"] == "tasks.completion_time_s.p95" and band["where"] == "at the ranking load"
        (point,) = c["points"]
        assert band["value"] == point["task_p95_s"]  # the point's own figure, as its run's summary gives it
        assert band["low"] <= band["value"] <= band["high"] and band["draws"] == DEFAULT_DRAWS
    (comparison,) = study["ranking"]["comparisons"]
    assert comparison["within_twin_band"] is True
    assert "within the twin's band" in comparison["band_verdict"]
    out = capsys.readouterr().out
    assert comparison["band_verdict"] in out and "twin band" in out
    assert "the twin&#39;s band" in page and "within the twin&#39;s band" in page


def test_a_study_on_the_twin_says_when_two_configs_are_beyond_its_band(tmp_path, capsys):
    # b twice as slow per step, the terms known to 1%: the bands do not overlap
    study, page = band_study(tmp_path, spread=0.01, fixed_scale=2.0, name="far")
    (comparison,) = study["ranking"]["comparisons"]
    assert comparison["within_twin_band"] is False
    assert "beyond the twin's band" in comparison["band_verdict"]
    assert comparison["band_verdict"] in capsys.readouterr().out


def test_a_study_on_an_uncalibrated_profile_draws_nothing_and_says_why(tmp_path, monkeypatch):
    def no_draws(*args, **kwargs):
        raise AssertionError("an uncalibrated profile draws nothing")

    monkeypatch.setattr(band_mod, "figures_on", no_draws)
    folder = tmp_path / "u"
    folder.mkdir()
    (folder / "calibrated.yaml").write_text("base: tiny-vllm-cpu\ncalibrated: false\n")
    fixed = load_profile("tiny-vllm-cpu").step_time.fixed
    (folder / "study.yaml").write_text(BAND_STUDY.format(scenario=ROOT / "scenarios" / "vllm" / "claude-code.yaml",
                                                         fixed=fixed * 2))
    assert cli_main(["study", str(folder / "study.yaml"), "-o", str(folder / "out")]) == 0
    study = json.loads((folder / "out" / "study.json").read_text())
    assert all(c["twin_band"]["note"].startswith("no band: uncalibrated") for c in study["configs"])
    assert study["ranking"]["comparisons"][0]["within_twin_band"] is None


def test_the_run_report_shows_the_band_where_it_shows_the_figures(tmp_path):
    band_of(tmp_path, profile())
    page_file = tmp_path / "sim.html"
    assert cli_main(["report", str(tmp_path / "sim"), "--html", str(page_file)]) == 0
    page = rf.Page(page_file.read_text(encoding="utf-8"))
    summary = json.loads((tmp_path / "sim" / "summary.json").read_text())
    banded = [c for c in page.cells if json.loads(c["source"])[:3] == ["simulation", "band", "figures"]]
    assert len(banded) == 3 * len(BANDED_FIGURES)  # value, low, high of each
    rf.check_cells(banded, [summary])
    p50 = summary["simulation"]["band"]["figures"]["tasks.completion_time_s.p50"]
    assert any(f"band {number(p50['low'])}–{number(p50['high'])}" in text for text in page.text)


def test_a_term_the_fit_barely_pins_down_is_drawn_within_half_its_value_without_bias():
    """A near-zero term with a standard error 100 times its value (the fit traded it for others) would,
    drawn at that error and clipped at 0, come out far above its value in most draws."""
    prof = profile(spread=0.0, residuals=(0.0,))
    record = prof.calibration
    value = STEP_TIME["fixed"]
    covariance = {a: dict(row) for a, row in record.covariance.items()}
    covariance["fixed"]["fixed"] = (100 * value) ** 2
    prof = prof.model_copy(update={"calibration": record.model_copy(update={"covariance": covariance})})
    drawn = [p.step_time.fixed for p in drawn_profiles(prof, 400, seed=3)]
    assert np.mean(drawn) == pytest.approx(value, rel=0.1)
    assert max(drawn) < value * (1 + 5 * band_mod.MAX_RELATIVE_SD)
