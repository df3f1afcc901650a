"""`agentload simulate`, `agentload profiles` and `agentload calibrate` end to end."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import aiohttp
import pytest

from simulator.calibration.fit import FIT_TERMS
from simulator.calibration.sweep import design_sweep
from simulator.cli import main
from simulator.emulator.server import run_emulator
from simulator.sim.profile import load_profile

REPO = Path(__file__).resolve().parents[1]


def test_simulate_writes_the_result_folder_of_a_run(tmp_path, capsys):
    out = tmp_path / "sim"
    code = main(["simulate", str(REPO / "scenarios" / "quickstart.yaml"), "-p", "tiny-vllm-cpu", "-o", str(out),
                 "--set", "run.max_tasks=2"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["simulation"]["profile"] == "tiny-vllm-cpu"
    assert summary["simulation"]["steps"] > 0
    assert summary["scenario"] == "quickstart"  # as a live run's summary.json names it
    calls = [json.loads(line) for line in (out / "calls.jsonl").read_text().splitlines()]
    tasks = [json.loads(line) for line in (out / "tasks.jsonl").read_text().splitlines()]
    assert calls and all(c["intended_send"] == c["actual_send"] for c in calls)
    assert len({t["task_id"] for t in tasks if t["parent_id"] is None}) == 2
    assert json.loads((out / "run.json").read_text())["simulated"] is True
    assert "TTFT" in capsys.readouterr().out


def test_simulate_states_the_profiles_calibration_error_and_unmeasured_parts(tmp_path, capsys):
    keys = None
    for preset in ("tiny-vllm-cpu", "gb300-nemotron-super-mtp1"):
        out = tmp_path / preset
        assert main(["simulate", str(REPO / "scenarios" / "quickstart.yaml"), "-p", preset, "-o", str(out),
                     "--set", "run.max_tasks=2"]) == 0
        sim = json.loads((out / "summary.json").read_text())["simulation"]
        err = capsys.readouterr().err
        assert f"profile {preset}: {sim['uncertainty']}" in " ".join(err.split())
        if keys is None:
            keys = list(sim)
        assert list(sim) == keys  # the same section whatever the profile
        if preset == "tiny-vllm-cpu":  # fitted: its sweep error, nothing unmeasured
            record = load_profile(preset).calibration
            assert sim["calibration_rms_error"] == record.rms_relative_error
            assert sim["calibration_points"] == record.points == 55
            assert sim["uncalibrated"] == [] and f"{record.rms_relative_error:.1%} rms" in sim["uncertainty"]
        else:  # chosen from published figures: says which terms no measurement backs
            assert sim["calibration_rms_error"] is None and sim["uncertainty"].startswith("uncalibrated")
            assert any("per_decode_seq" in part for part in sim["uncalibrated"])
            assert any(part.startswith("spec_decode.acceptance") for part in sim["uncalibrated"])
            assert any(part.startswith("kv_cache.hybrid") for part in sim["uncalibrated"])
    # the figures summary.json had before are all still there
    assert keys[:11] == ["profile", "calibrated", "simulated_seconds", "wall_seconds", "steps", "preemptions",
                         "prefill_tokens", "cached_prompt_tokens", "kv_evicted_blocks", "max_running", "busy_fraction"]


def test_simulate_states_the_servers_drift_over_the_calibration_sweep(tmp_path, capsys):
    said = {}
    for drift in (0.051, -0.012):
        profile = tmp_path / f"drift{drift}.yaml"
        profile.write_text("base: tiny-vllm-cpu\ncalibration: {rms_relative_error: 0.06, points: 41, "
                           f"worst_relative_error: 0.15, drift: {drift}}}\n")
        out = tmp_path / f"out{drift}"
        assert main(["simulate", str(REPO / "scenarios" / "quickstart.yaml"), "-p", str(profile), "-o", str(out),
                     "--set", "run.max_tasks=1"]) == 0
        sim = json.loads((out / "summary.json").read_text())["simulation"]
        assert sim["calibration_drift"] == drift
        said[drift] = sim["uncertainty"]
    assert "6.0% rms" in said[0.051] and "drifted +5.1% over it (past 3%" in said[0.051]
    assert "steady over it (-1.2%)" in said[-0.012] and "drifted" not in said[-0.012]
    capsys.readouterr()


def test_simulate_with_a_bad_profile_is_an_input_error(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("base: tiny-vllm-cpu\nscheduler:\n  max_num_seqs: zero\n")
    code = main(["simulate", str(REPO / "scenarios" / "quickstart.yaml"), "-p", str(bad), "-o", str(tmp_path / "o")])
    assert code == 2
    assert "scheduler.max_num_seqs" in capsys.readouterr().err


def test_profiles_lists_presets_and_marks_uncalibrated(capsys):
    assert main(["profiles"]) == 0
    out = capsys.readouterr().out
    assert "gb300-nemotron-super-fp16-state" in out and "tiny-vllm-cpu" in out and "[uncalibrated]" in out


def test_calibrate_on_the_twin_writes_a_calibrated_profile_with_its_fit_error(tmp_path, capsys):
    # a short sweep: what is checked here is the profile the command writes (the fit's accuracy is
    # tests/test_twin_calibrate.py's)
    path = tmp_path / "cal.yaml"
    assert main(["calibrate", "-p", "tiny-vllm-cpu", "--twin", "--max-prompt", "64", "--max-concurrency", "2",
                 "-o", str(path), "--name", "tiny-cal"]) == 0
    out = capsys.readouterr().out
    points = len(design_sweep(load_profile("tiny-vllm-cpu"), max_concurrency=2, max_prompt=64))
    assert out.startswith(f"calibration of tiny-vllm-cpu against twin of tiny-vllm-cpu (exact): {points} sweep "
                          "points\n")
    profile = load_profile(path)
    assert profile.calibrated and profile.name == "tiny-cal"
    assert profile.source == "agentload calibrate (exact) against twin of tiny-vllm-cpu"
    assert profile.description == load_profile("tiny-vllm-cpu").description  # a calibrated base's, kept
    record = profile.calibration
    assert record is not None and record.points == points and record.worst_relative_error >= record.rms_relative_error
    assert f"rms relative error over {points} points: {record.rms_relative_error:.2%}" in out
    assert path.read_text().startswith(
        f"# Calibrated by `agentload calibrate` (rms relative error of the fit {record.rms_relative_error:.2%}).\n")
    assert set(record.terms) == set(FIT_TERMS)
    # the coefficients written are those printed
    printed = {line.split()[0]: float(line.split()[1]) for line in out.splitlines() if line.split()[0] in FIT_TERMS}
    assert printed == {term: pytest.approx(getattr(profile.step_time, term), rel=1e-4) for term in FIT_TERMS}
    assert record.drift is None  # the twin does not drift


async def test_calibrate_drives_a_live_server_through_the_sweep(tmp_path):
    path = tmp_path / "cal.yaml"
    async with run_emulator(prefill_per_token=2e-5, decode_base=0.004, decode_per_seq=0.0005) as url:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "simulator", "calibrate", "-p", "tiny-vllm-cpu", "--target", url,
            "--max-concurrency", "2", "--max-prompt", "64", "--repeat", "1", "-o", str(path),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert "decode B=2 P=64 O=32" in out.decode()
    assert "rounds' times over the points' medians: 1.000 (trend n/a)" in err.decode()
    profile = load_profile(path)
    assert profile.calibrated and profile.source.endswith(url) and "rounds' trend n/a" in profile.source
    assert profile.calibration.drift is None  # one round: no trend measured


async def test_calibrate_warms_a_cached_points_prompt_into_the_prefix_cache():
    # against the emulator's twin: the cached 1025-token prompt skips the prefill a cold 1024-token one pays
    # (the two points of the sweep that show it, measured as `calibrate --target` measures its sweep)
    from simulator.calibration.on_server import measure_sweep
    from simulator.calibration.sweep import SweepPoint
    from simulator.live.client import Target

    points = [SweepPoint("prefill", 1, 1024, 1), SweepPoint("prefill", 1, 1025, 1, cached=True)]
    assert {p.label() for p in points} <= {p.label() for p in design_sweep(load_profile("tiny-vllm-cpu"),
                                                                           max_concurrency=2, max_prompt=1025)}
    async with run_emulator(profile="tiny-vllm-cpu") as url:
        (cold,), (cached,) = await measure_sweep(Target(base_url=url, vocab_size=1024), points, block_size=128,
                                                 scheduler=load_profile("tiny-vllm-cpu").scheduler, repeat=1)
    assert cached < 0.5 * cold, (cached, cold)


async def test_a_loaded_point_sends_its_calls_while_its_streams_decode():
    # against the emulator's twin: 4 streams (warmed, then sent), then 8 short calls while they decode
    from simulator.calibration.on_server import measure_sweep
    from simulator.calibration.sweep import SweepPoint, probe_offsets
    from simulator.live.client import Target

    point = SweepPoint("loaded", 4, 32, 1, cached=True)
    async with run_emulator(profile="tiny-vllm-cpu") as url:
        samples = await measure_sweep(Target(base_url=url, vocab_size=1024), [point], block_size=128,
                                      scheduler=load_profile("tiny-vllm-cpu").scheduler, repeat=1)
        async with aiohttp.ClientSession() as session, session.get(f"{url}/agentload/stats") as resp:
            stats = await resp.json()
    (values,) = samples
    assert len(values) == 1 and values[0] > 0
    # a warm-up round and the measured one: each the streams' prompts, the streams, the calls
    calls = len(probe_offsets(point))
    assert stats["requests"] == 2 * (4 + 4 + calls)
    assert stats["max_active_streams"] >= 4 + 1  # a call in flight beside all four streams
