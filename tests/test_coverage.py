"""Coverage: the region of call shapes a calibration measured (`simulator.calibration.region`), a
simulation's calls held against it (`simulator.sim.coverage`), and how `agentload simulate` shows it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import simpy

from simulator.calibration.fit import FitResult
from simulator.calibration.pipeline import Calibration, MeasuredSweep
from simulator.calibration.region import region_of
from simulator.calibration.sweep import SweepPoint, cached_prompts, design_sweep
from simulator.calibration.usable import UsableSweep
from simulator.cli import main
from simulator.errors import InputError
from simulator.metrics.records import CallRecord
from simulator.metrics.results import Window
from simulator.metrics.summary import SimulationStats
from simulator.report.coverage import coverage_lines, percent
from simulator.sim.coverage import CallShapes, burst_sizes, coverage, in_flight
from simulator.sim.driver import ListSink
from simulator.sim.make_twin import make_twin
from simulator.sim.profile import CalibratedRegion, load_profile

REPO = Path(__file__).resolve().parents[1]

SMALL_SWEEP = [
    SweepPoint("prefill", 1, 16, 1),
    SweepPoint("prefill", 4, 1024, 1),
    SweepPoint("prefill", 1, 1025, 1, cached=True),
    SweepPoint("decode", 8, 65, 32, cached=True),
    SweepPoint("decode", 1, 257, 160, cached=True),
    SweepPoint("loaded", 16, 32, 1, cached=True),
]


def test_the_region_of_a_small_sweep_spans_the_calls_its_points_time():
    region = region_of(SMALL_SWEEP, block_size=16)
    assert region.prompt_tokens == (16, 1025)
    # the cached prefill of 1,025 tokens hits 64 blocks of 16, the decode of 65 tokens 4 of them
    assert region.cached_share == (0.0, 1024 / 1025)
    # the decode burst of 8; the loaded point's call among its 16 streams
    assert region.running_calls == (1, 17)
    # the loaded point's calls go alone: the largest burst sent at once is the decode's 8
    assert region.burst_calls == (1, 8)
    assert region.output_tokens == (1, 160)


def test_the_regions_cached_share_is_what_the_twin_reports_for_a_cached_point():
    profile = load_profile("tiny-vllm-cpu")
    bs = profile.kv_cache.block_size
    for point in (SweepPoint("prefill", 1, 1025, 1, cached=True), SweepPoint("prefill", 1, 3 * bs, 1, cached=True)):
        env = simpy.Environment()
        twin = make_twin(env, profile)
        (ids,) = cached_prompts(point, bs)
        twin.submit(point.input_tokens, 1, ids, bs)
        env.run()
        done = twin.submit(point.input_tokens, 1, ids, bs)
        env.run()
        share = region_of([point], bs).cached_share[1]
        assert share == done.value.cached_tokens / point.input_tokens > 0


def test_a_calibration_records_the_region_of_the_points_it_measured():
    base = load_profile("tiny-vllm-cpu")
    # the burst of 1,024-token prefills was measured in no round: the region leaves it out
    kept = [p for p in SMALL_SWEEP if p.input_tokens != 1024]
    samples = [[0.01] if p in kept else [None] for p in SMALL_SWEEP]
    usable = UsableSweep(kept, [0.01] * len(kept), [(SMALL_SWEEP[1], "no measurement")], len(SMALL_SWEEP))
    record = base.calibration.model_copy(update={"region": None})
    fitted = base.model_copy(update={"calibration": record})
    result = FitResult({}, {}, tuple(usable.points), tuple(usable.values), tuple(usable.values), fitted)
    profile = Calibration(MeasuredSweep(samples, usable, [None], None), result).profile
    region = profile.calibration.region
    assert region == region_of(kept, base.kv_cache.block_size)
    assert region.prompt_tokens == (16, 1025) and region.burst_calls == (1, 8)
    assert profile.calibration.rms_relative_error == base.calibration.rms_relative_error  # the rest kept


def test_calibrate_on_the_twin_writes_the_region_into_the_profile(tmp_path, capsys):
    path = tmp_path / "cal.yaml"
    assert main(["calibrate", "-p", "tiny-vllm-cpu", "--twin", "--max-prompt", "64", "--max-concurrency", "2",
                 "-o", str(path)]) == 0
    capsys.readouterr()
    base = load_profile("tiny-vllm-cpu")
    points = design_sweep(base, max_concurrency=2, max_prompt=64)
    region = load_profile(path).calibration.region
    assert region == region_of(points, base.kv_cache.block_size)
    assert region.prompt_tokens[1] == 64 and region.running_calls[1] <= 2 + 1


def test_the_shipped_tiny_preset_holds_the_region_of_the_default_sweep():
    profile = load_profile("tiny-vllm-cpu")
    assert profile.calibration.region == region_of(design_sweep(profile), profile.kv_cache.block_size)


def call(send: float, end: float, prompt: int = 100, output: int = 10, cached: int = 0, ok: bool = True,
         intended: float | None = None) -> CallRecord:
    return CallRecord("t", "c", 0, 0, send if intended is None else intended, send, end, ok,
                      input_tokens=prompt, output_tokens=output, cached_tokens=cached)


REGION = CalibratedRegion(prompt_tokens=(16, 1000), cached_share=(0.0, 0.9), running_calls=(1, 4),
                          burst_calls=(1, 4), output_tokens=(1, 100))


def shapes_of(records, window=Window()):
    sink = ListSink()
    shapes = CallShapes(sink, window)
    for record in records:
        shapes.call(record)
    assert sink.calls == list(records)  # every record passed on
    return shapes.shapes()


def test_calls_inside_every_range_leave_nothing_outside():
    records = [call(t, t + 0.5, prompt=16 + t, output=1 + t, cached=t) for t in range(10)]
    cover = coverage(REGION, shapes_of(records))
    assert cover.calls == 10 and cover.outside == 0
    for dimension in cover.dimensions.values():
        assert dimension.calls == 10 and dimension.below_share == dimension.above_share == 0
        assert dimension.above_max is None and dimension.below_max is None
    assert coverage_lines(SimulationStats(calibrated=True, coverage=cover)) == [
        "calibrated region: all 10 calls inside what the calibration measured"]


def test_coverage_gives_the_share_outside_each_range_and_how_far():
    records = [
        call(0.0, 1.0, prompt=2000),          # prompt 2x the high bound
        call(10.0, 11.0, prompt=3000),        # 3x
        call(20.0, 21.0, prompt=8),           # half the low bound
        call(30.0, 31.0, prompt=500, cached=475),  # cached share 0.95: 0.05 above 0.9
        call(40.0, 41.0, output=250),         # 2.5x the output bound
        call(50.0, 51.0),                     # inside
        call(60.0, 61.0), call(70.0, 71.0),   # inside
    ]
    cover = coverage(REGION, shapes_of(records))
    assert cover.calls == 8 and cover.outside == 5 / 8
    prompt = cover.dimensions["prompt_tokens"]
    assert prompt.above_share == 2 / 8 and prompt.above_median == 2.5 and prompt.above_max == 3.0
    assert prompt.below_share == 1 / 8 and prompt.below_max == 2.0
    share = cover.dimensions["cached_share"]
    assert share.measure == "difference" and share.above_share == 1 / 8
    assert share.above_max == pytest.approx(0.05)
    assert cover.dimensions["output_tokens"].above_max == 2.5
    lines = coverage_lines(SimulationStats(calibrated=True, coverage=cover))
    assert lines[0] == "calibrated region: 62.5% of the 8 calls outside what the calibration measured"
    assert ("prompt tokens 12.5% below 16 (median 2.00x under, up to 2.00x) and 25.0% above 1,000 (median 2.50x, "
            "up to 3.00x)") in lines[1]
    assert "cached share of the prompt 12.5% above 90.0% (median +5.00 points, up to +5.00 points)" in lines[1]


def test_calls_in_the_engine_and_bursts_count_every_call_as_load_but_judge_the_counted_ones():
    records = [call(0.0, 1.0) for _ in range(6)]  # six sent at once: a burst of 6, 6 in flight
    records += [call(5.0, 6.0), call(5.004, 6.0), call(5.0101, 6.0)]  # a burst of 2, then one of 1
    records += [call(9.0, 9.5, intended=99.0), call(9.0, 9.5, ok=False)]  # load, not counted
    shapes = shapes_of(records, Window(0.0, 50.0))
    assert in_flight(shapes.sent, shapes.ended).tolist() == [6] * 6 + [1, 2, 3, 2, 2]
    assert burst_sizes(shapes.sent).tolist() == [6] * 6 + [2, 2, 1, 2, 2]
    cover = coverage(REGION, shapes)
    assert cover.calls == 9
    assert cover.dimensions["burst_calls"].above_share == 6 / 9 and cover.dimensions["burst_calls"].above_max == 1.5
    assert cover.dimensions["running_calls"].above_share == 6 / 9
    # calls beyond the server's seats wait outside the batch: with 4 seats, 4 in the engine at most
    capped = coverage(REGION, shapes, max_running=4)
    assert capped.dimensions["running_calls"].above_share == 0


def test_a_share_never_reads_as_none_or_all_of_the_calls():
    assert percent(0.0004) == "0.04%" and percent(0.99996) == "99.996%"
    assert percent(0.125) == "12.5%" and percent(0) == "0.0%" and percent(1) == "100.0%"


def test_simulate_reports_the_share_of_calls_outside_a_narrow_region(tmp_path, capsys):
    high = 580
    profile = tmp_path / "narrow.yaml"
    profile.write_text("base: tiny-vllm-cpu\ncalibration:\n  region: {prompt_tokens: [16, %d], cached_share: [0, 1],"
                       " running_calls: [1, 128], burst_calls: [1, 128], output_tokens: [1, 4096]}\n" % high)
    out = tmp_path / "sim"
    assert main(["simulate", str(REPO / "scenarios" / "quickstart.yaml"), "-p", str(profile), "-o", str(out),
                 "--set", "run.max_tasks=2"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    cover = json.loads((out / "summary.json").read_text())["simulation"]["coverage"]
    calls = [json.loads(line) for line in (out / "calls.jsonl").read_text().splitlines()]
    prompts = np.array([c["input_tokens"] for c in calls if c["ok"]])
    above = prompts[prompts > high]
    assert 0 < len(above) < len(prompts)
    assert cover["calls"] == len(prompts) and cover["outside"] == len(above) / len(prompts)
    assert cover["dimensions"]["prompt_tokens"]["above_max"] == above.max() / high
    # the console says what summary.json holds
    assert f"calibrated region: {percent(cover['outside'])} of the {len(prompts)} calls outside" in err
    assert f"prompt tokens {percent(len(above) / len(prompts))} above {high}" in err


def test_simulate_on_a_profile_without_a_region_says_so(tmp_path, capsys):
    profile = tmp_path / "old.yaml"
    profile.write_text("base: tiny-vllm-cpu\ncalibrated: false\n")
    out = tmp_path / "sim"
    assert main(["simulate", str(REPO / "scenarios" / "quickstart.yaml"), "-p", str(profile), "-o", str(out),
                 "--set", "run.max_tasks=1"]) == 0
    assert json.loads((out / "summary.json").read_text())["simulation"]["coverage"] is None
    err = " ".join(capsys.readouterr().err.split())
    assert "calibrated region: not known (the profile is uncalibrated), so no coverage of the calls" in err


@pytest.mark.parametrize("region, where, says", [
    ("{prompt_tokens: [4096, 16], cached_share: [0, 1], running_calls: [1, 2], burst_calls: [1, 2], "
     "output_tokens: [1, 2]}", "calibration.region.prompt_tokens", "low 4096 is above high 16"),
    ("{prompt_tokens: [16, 4096], cached_share: [0, 1.5], running_calls: [1, 2], burst_calls: [1, 2], "
     "output_tokens: [1, 2]}", "calibration.region.cached_share", "less than or equal to 1"),
    ("{prompt_tokens: [16, 4096], cached_share: [0, 1], running_calls: [1, 2], burst_calls: [1, 2], "
     "output_tokens: [1, 2], prompts: [1, 2]}", "calibration.region.prompts", "prompt_tokens"),
])
def test_a_bad_region_in_a_profile_is_an_input_error_naming_the_field(tmp_path, region, where, says):
    path = tmp_path / "bad.yaml"
    path.write_text(f"base: tiny-vllm-cpu\ncalibration:\n  region: {region}\n")
    with pytest.raises(InputError) as caught:
        load_profile(path)
    text = str(caught.value)
    assert str(path) in text and where in text and says in text
