"""The built-in emulator's default timing: batched steps of ~ one H100 serving an 8B model on vLLM, not
a zero-latency server; explicit settings keep their meaning, and every kind of timing is described in
words (banner, run.json, reports), a zero-latency one as such."""

from __future__ import annotations

import time

import aiohttp
import pytest

from simulator.emulator.server import Emulator, run_emulator
from simulator.emulator.settings import (
    DEFAULT_DECODE_BASE, DEFAULT_DECODE_PER_SEQ, DEFAULT_PREFILL_PER_TOKEN, EmulatorSettings, describe_timing,
    from_values, is_zero_latency, timing_record,
)
from simulator.emulator.timing import BatchTiming, FixedTiming


def test_the_default_is_batched_timing_of_an_h100_class_server():
    settings = EmulatorSettings()
    assert settings.max_model_len == 131072  # any trace fits
    timing = Emulator(settings).timing
    assert isinstance(timing, BatchTiming)
    assert (timing.prefill_per_token, timing.decode_per_seq, timing.decode_base) == (0.00005, 0.0001, 0.008)
    # a step at a batch of 8 lasts 8.8 ms; a 10,000-token prompt prefills in half a second
    assert DEFAULT_DECODE_BASE + 8 * DEFAULT_DECODE_PER_SEQ == pytest.approx(0.0088)
    assert 10_000 * DEFAULT_PREFILL_PER_TOKEN == pytest.approx(0.5)
    assert not is_zero_latency(settings)
    assert describe_timing(settings) == ("default timing, ~ one H100 serving an 8B model on vLLM: steps of 8 ms "
                                         "+ 0.1 ms a running sequence, prefill 20,000 tokens/s")


def test_explicit_timing_keeps_its_meaning():
    assert isinstance(Emulator(EmulatorSettings(ttft=0.0, itl=0.0)).timing, FixedTiming)
    custom = Emulator(EmulatorSettings(prefill_per_token=0.000005, decode_per_seq=0.0002, decode_base=0.006)).timing
    assert (custom.prefill_per_token, custom.decode_per_seq, custom.decode_base) == (0.000005, 0.0002, 0.006)
    # a scenario's section: host and port are where it listens, no timing
    assert from_values({"ttft": 0.05, "host": "0.0.0.0", "port": 0}) == EmulatorSettings(ttft=0.05)


@pytest.mark.parametrize("values,text,zero", [
    ({}, "default timing, ~ one H100 serving an 8B model on vLLM: steps of 8 ms + 0.1 ms a running sequence, "
         "prefill 20,000 tokens/s", False),
    ({"ttft": 0.05, "itl": 0.01}, "fixed TTFT 50 ms, ITL 10 ms", False),
    ({"ttft": 0, "itl": 0}, "fixed TTFT 0 ms, ITL 0 ms: a zero-latency server", True),
    ({"itl": 0}, "fixed TTFT 0 ms, ITL 0 ms: a zero-latency server", True),
    ({"prefill_per_token": 0, "decode_per_seq": 0, "decode_base": 0},
     "batched timing with every coefficient 0: a zero-latency server", True),
    ({"prefill_per_token": 0.000005, "decode_base": 0.006},
     "batched timing: steps of 6 ms + 0.1 ms a running sequence, prefill 200,000 tokens/s", False),
    ({"decode_base": 0.025, "prefill_per_token": 0}, "batched timing: steps of 25 ms + 0.1 ms a running sequence, "
                                                     "prefill free", False),
    ({"profile": "tiny-vllm-cpu"}, "profile tiny-vllm-cpu (its server twin in real time)", False),
])
def test_each_timing_is_described_and_a_zero_latency_one_said_so(values, text, zero):
    settings = from_values(values)
    assert describe_timing(settings) == text
    record = timing_record(settings)
    assert record["text"] == text and record["zero_latency"] is zero


async def test_the_default_emulator_answers_no_sooner_than_its_server_class_would():
    # 2,000 prompt tokens prefill in 0.1 s (in the first step, which also gives the first token), then
    # 19 more steps of 8.1 ms: the emulator never sends a token before its time, so these are floors
    async with run_emulator() as url:
        async with aiohttp.ClientSession() as session:
            body = {"prompt": [20] * 2000, "max_tokens": 20, "stream": True}
            sent = time.perf_counter()
            async with session.post(url + "/v1/completions", json=body) as resp:
                first = None
                async for _ in resp.content.iter_any():
                    first = first or time.perf_counter()
            done = time.perf_counter()
    assert first - sent >= 0.1 + 0.0081
    assert done - sent >= 0.1 + 20 * 0.0081
