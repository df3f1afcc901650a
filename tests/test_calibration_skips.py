"""A live calibration goes on past what it cannot measure: a measurement whose call failed or whose
answer had no first token is missed, a point no round measured is left out of the fit and named, and
the calibration stops (a clean error, exit code 2) only when too little is left to fit."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest
from aiohttp import web

from simulator.calibration.drift import round_speeds, speed_trend
from simulator.calibration.fit import FIT_TERMS
from simulator.calibration.on_server import measure_sweep
from simulator.calibration.sweep import SweepPoint
from simulator.calibration.usable import usable_sweep
from simulator.emulator.server import run_emulator
from simulator.errors import InputError
from simulator.live.client import Target
from simulator.sim.profile import load_profile

FAILING_PROMPT = 16
"""Prompt length the test server answers with HTTP 500."""
TOKENLESS_PROMPT = 20
"""Prompt length the test server answers with a stream that has no token, only its usage."""


def event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


async def completions(request: web.Request) -> web.StreamResponse:
    """A streaming /v1/completions whose answer depends on the prompt's length (see the constants)."""
    body = await request.json()
    prompt, output = len(body["prompt"]), body["max_tokens"]
    if prompt == FAILING_PROMPT:
        return web.json_response({"object": "error", "message": "engine fault", "code": 500}, status=500)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    tokens = 0 if prompt == TOKENLESS_PROMPT else output
    for _ in range(tokens):
        await resp.write(event({"choices": [{"index": 0, "text": " x", "finish_reason": None}]}))
    usage = {"prompt_tokens": prompt, "completion_tokens": tokens, "total_tokens": prompt + tokens}
    await resp.write(event({"choices": [], "usage": usage}) + b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


@pytest.fixture
async def test_server():
    """The base URL of a server answering as `completions` does."""
    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def test_a_point_no_round_can_measure_is_missed_and_the_sweep_goes_on(test_server):
    # prompts of 32 tokens or fewer are sent at their length (no moves): each point meets its rule
    points = [SweepPoint("prefill", 1, FAILING_PROMPT, 1), SweepPoint("prefill", 1, TOKENLESS_PROMPT, 1),
              SweepPoint("prefill", 2, 24, 1), SweepPoint("decode", 2, 28, 4)]
    missed: list[tuple[int, int, str]] = []
    samples = await measure_sweep(Target(test_server, model="m", vocab_size=1024), points, block_size=16,
                                  scheduler=load_profile("tiny-vllm-cpu").scheduler, repeat=2,
                                  on_missed=lambda *args: missed.append(args))
    assert samples[0] == [None, None] and samples[1] == [None, None]
    assert all(v is not None and v > 0 for s in samples[2:] for v in s) and all(len(s) == 2 for s in samples)
    assert sorted((index, round_number) for index, round_number, _ in missed) == [(0, 1), (0, 2), (1, 1), (1, 2)]
    reasons = {index: why for index, _, why in missed}
    assert "1 of 1 calls of the burst failed (http_5xx: HTTP 500: engine fault)" == reasons[0]
    assert "1 of 1 answers had no first token to time" == reasons[1]


async def test_an_unreachable_server_stops_the_sweep_with_a_clean_error():
    from simulator.live.vllm import free_port

    url = f"http://user:sekret@127.0.0.1:{free_port()}"
    with pytest.raises(InputError, match="cannot be reached") as caught:
        await measure_sweep(Target(url, model="m", connect_timeout=2), [SweepPoint("prefill", 1, 16, 1)],
                            block_size=16, scheduler=load_profile("tiny-vllm-cpu").scheduler, repeat=1)
    assert "sekret" not in str(caught.value)


def sweep(count: int, kind: str = "prefill") -> list[SweepPoint]:
    return [SweepPoint(kind, 1, 16 + k, 1) for k in range(count)]


def test_the_fit_gets_the_points_measured_and_the_report_names_the_others():
    points = sweep(len(FIT_TERMS) + 2)
    samples = [[0.010 + k * 1e-3, 0.012 + k * 1e-3, None] for k in range(len(points))]
    samples[3] = [None, None, None]
    samples[5] = [None, 0.050, None]  # measured once: kept, with that value
    missed = {3: ["a call failed", "a call failed", "no first token"], 5: ["x", "y"]}
    usable = usable_sweep(points, samples, missed)
    assert usable.points == points[:3] + points[4:]
    assert usable.values[4] == pytest.approx(0.050)  # points[5]
    assert usable.values[0] == pytest.approx(0.011)  # the median of the rounds measured
    assert usable.skipped == [(points[3], "a call failed; no first token")]
    text = usable.skipped_text()
    assert text.splitlines() == [f"skipped 1 of {len(points)} points, measured in no round (left out of the fit):",
                                 f"  {points[3].label()}: a call failed; no first token"]
    assert usable_sweep(points[:2], samples[:2]).skipped_text() == ""


@pytest.mark.parametrize("kept,kind", [(len(FIT_TERMS) - 1, "prefill"), (len(FIT_TERMS) + 5, "loaded")])
def test_too_little_left_to_fit_is_a_clean_error_naming_what_was_skipped(kept, kind):
    points = sweep(len(FIT_TERMS) + 5, kind)
    samples = [[0.01] if k < kept else [None] for k in range(len(points))]
    with pytest.raises(InputError, match="too little left to fit") as caught:
        usable_sweep(points, samples, {len(points) - 1: ["HTTP 500"]}, server="http://h:1")
    text = str(caught.value)
    assert text.startswith("http://h:1: ")
    if kind == "prefill":
        assert f"{kept} of {len(points)} points were measured and the fit needs at least {len(FIT_TERMS)}" in text
        assert f"  {points[-1].label()}: HTTP 500" in text
    else:
        assert "only loaded points were measured" in text


def test_a_sweep_smaller_than_the_fits_terms_may_lose_no_point():
    points = sweep(4)
    assert len(usable_sweep(points, [[0.01]] * 4).points) == 4
    with pytest.raises(InputError, match="3 of 4 points were measured and the fit needs at least 4"):
        usable_sweep(points, [[0.01]] * 3 + [[None]])


def test_the_rounds_speeds_leave_out_missed_measurements():
    # points' medians over their measured rounds: 1.15, 2.4, none, 3.3
    samples = [[1.0, 1.1, 1.2, 1.3], [2.0, None, 2.4, 2.6], [None, None, None, None], [3.0, 3.3, None, 3.9]]
    expected = [1.0 / 1.15, (1.1 / 1.15 + 1.0) / 2, (1.2 / 1.15 + 1.0) / 2, 1.3 / 1.15]
    assert round_speeds(samples) == pytest.approx(expected)
    assert round_speeds([[None, 1.0, 1.0], [None, 2.0, 2.0]]) == [None, 1.0, 1.0]
    assert speed_trend([None, 1.0, 1.0, 1.0]) == pytest.approx(0.0)
    assert speed_trend([None, 1.1, 1.0, 0.9]) == pytest.approx(-0.3 / 1.2)  # along the line from round 0
    assert speed_trend([None, None, 1.0, 1.0]) is None  # two rounds with a speed: no trend


async def calibrate_cli(url: str, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "simulator", "calibrate", "-p", "tiny-vllm-cpu", "--target", url, "--vocab-size", "1024",
        "--repeat", "1", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    return proc.returncode, out.decode(), err.decode()


async def test_calibrate_reports_a_point_it_could_not_measure_and_fits_the_rest():
    # a server whose context is shorter than the profile says: the one point beyond it (a cached
    # 513-token prompt decoding 32 tokens) is refused every time; the 13 others are measured
    async with run_emulator(ttft=0.002, itl=0.001, max_model_len=540, vocab_size=1024) as url:
        code, out, err = await calibrate_cli(url, "--max-prompt", "600", "--max-concurrency", "4")
    assert code == 0, err
    assert "13 sweep points" in out and "1 of 14 points not measured" in out
    assert "skipped 1 of 14 points, measured in no round (left out of the fit):" in out
    assert "  decode B=1 P=513 cached O=32: 1 of 1 calls of the burst failed (http_4xx: HTTP 400: min_tokens" in out
    assert "not measured in round 1: decode B=1 P=513 cached O=32" in err
    assert "Traceback" not in err


async def test_calibrate_with_too_little_measured_fails_cleanly():
    async with run_emulator(ttft=0.002, itl=0.001, max_model_len=100, vocab_size=1024) as url:
        code, out, err = await calibrate_cli(url, "--max-prompt", "600", "--max-concurrency", "4")
    assert code == 2
    assert "agentload: error:" in err and "too little left to fit" in err
    assert "  prefill B=1 P=256 O=1: 1 of 1 calls of the burst failed (http_4xx: HTTP 400:" in err
    assert "Traceback" not in err
