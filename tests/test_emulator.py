"""The emulator: vLLM's wire format, errors, prefix cache, timing models and faults."""

import asyncio
import json
import time

import aiohttp
import pytest

from simulator.emulator.faults import parse_fault
from simulator.emulator.prefix_cache import PrefixCache
from simulator.emulator.server import Emulator, run_emulator
from simulator.emulator.settings import EmulatorSettings
from simulator.emulator.timing import BatchTiming, FixedTiming, TimingModel
from simulator.errors import InputError


async def post(url, path, body, headers=None):
    async with aiohttp.ClientSession() as session:
        async with session.post(url + path, json=body, headers=headers or {}) as resp:
            return resp.status, await resp.read()


async def test_models_health_and_tokenize():
    async with run_emulator(model="m1", max_model_len=4096) as url:
        async with aiohttp.ClientSession() as session:
            async with session.get(url + "/health") as resp:
                assert resp.status == 200
            async with session.get(url + "/v1/models") as resp:
                data = await resp.json()
        assert data["data"][0]["id"] == "m1" and data["data"][0]["max_model_len"] == 4096
        status, body = await post(url, "/tokenize", {"prompt": [11, 12, 13]})
        assert status == 200 and json.loads(body)["count"] == 3
        status, body = await post(url, "/tokenize", {"prompt": "one two three four"})
        assert json.loads(body)["count"] == 4
        status, body = await post(url, "/tokenize", {"messages": [{"role": "user", "content": "a b c"}]})
        assert json.loads(body)["count"] == 3 + 3 + 4


async def test_non_streaming_completion_and_chat():
    async with run_emulator(ttft=0.0, itl=0.0) as url:
        status, body = await post(url, "/v1/completions", {"prompt": [20] * 50, "max_tokens": 7})
        data = json.loads(body)
        assert status == 200
        assert data["usage"]["prompt_tokens"] == 50 and data["usage"]["completion_tokens"] == 7
        assert len(data["choices"][0]["text"].split()) == 7
        status, body = await post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi there"}], "max_tokens": 3})
        data = json.loads(body)
        assert data["object"] == "chat.completion" and data["usage"]["completion_tokens"] == 3
        assert data["usage"]["prompt_tokens"] == 3 + 4 + 2


async def test_streaming_chunks_usage_and_done():
    async with run_emulator() as url:
        async with aiohttp.ClientSession() as session:
            body = {"prompt": [20] * 40, "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}}
            async with session.post(url + "/v1/completions", json=body) as resp:
                raw = (await resp.read()).decode()
    events = [line[6:] for line in raw.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    texts = [c["choices"][0]["text"] for c in chunks if c["choices"]]
    assert len(texts) == 5
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5


@pytest.mark.parametrize(
    "body,status,needle",
    [
        ({"prompt": [20] * 200, "max_tokens": 4}, 400, "maximum context length is 100 tokens. However, your prompt contains 200 input tokens"),
        ({"prompt": [20] * 90, "max_tokens": 20, "min_tokens": 20}, 400, "min_tokens must be less than or equal to max_tokens=10, got 20."),
        ({"prompt": [20] * 5, "max_tokens": 0}, 400, "max_tokens must be at least 1"),
        ({"prompt": [20] * 5, "max_tokens": 2, "temperature": -1}, 400, "temperature"),
        ({"prompt": [20] * 5, "max_tokens": 2, "stream_options": {"include_usage": True}}, 400, "Stream options"),
        ({"prompt": [99999], "max_tokens": 2}, 400, "out of vocabulary"),
        ({"prompt": {"x": 1}}, 400, "'prompt' must be"),
        ({"prompt": [20], "model": "nope"}, 404, "The model `nope` does not exist."),
    ],
)
async def test_errors_in_vllm_shape(body, status, needle):
    async with run_emulator(max_model_len=100) as url:
        got, raw = await post(url, "/v1/completions", body)
    error = json.loads(raw)["error"]
    assert got == status and error["code"] == status
    assert needle in error["message"]
    assert error["type"] in ("BadRequestError", "NotFoundError")


async def test_max_tokens_capped_by_the_context_like_vllm():
    async with run_emulator(max_model_len=100, ttft=0.0, itl=0.0) as url:
        status, raw = await post(url, "/v1/completions", {"prompt": [20] * 90, "max_tokens": 20})
    assert status == 200 and json.loads(raw)["usage"]["completion_tokens"] == 10


async def test_bad_json_and_api_key():
    async with run_emulator(api_key="sekret") as url:
        async with aiohttp.ClientSession() as session:
            async with session.post(url + "/v1/completions", data=b"{nope", headers={"Authorization": "Bearer sekret"}) as resp:
                assert resp.status == 400 and "Invalid JSON" in (await resp.json())["error"]["message"]
        status, _ = await post(url, "/v1/completions", {"prompt": [20], "max_tokens": 1})
        assert status == 401


def test_prefix_cache_counts_leading_blocks_only():
    cache = PrefixCache(block_size=4, capacity=100)
    a = list(range(10, 30))
    assert cache.lookup_and_insert(a) == 0
    assert cache.lookup_and_insert(a[:12] + [99] * 8) == 12
    assert cache.lookup_and_insert([1, 2, 3, 4] + a[4:]) == 0  # same blocks after a different one do not count
    assert cache.lookup_and_insert(a) == 16  # a full hit still computes the last block


def test_prefix_cache_evicts_least_recent():
    cache = PrefixCache(block_size=2, capacity=3)
    cache.lookup_and_insert([1, 2, 3, 4, 5, 6])
    cache.lookup_and_insert([7, 8, 9, 10])
    assert cache.lookup_and_insert([1, 2, 3, 4, 5, 6, 0]) == 0


def recorder(times, stop_after=None):
    """An emit function noting when tokens came and how many; stops after `stop_after` tokens."""

    def emit(count):
        times.extend([time.perf_counter()] * count)
        return stop_after is None or len(times) < stop_after

    return emit


async def test_fixed_timing_emits_on_absolute_schedule_for_every_request():
    timing = FixedTiming(ttft=0.02, itl=0.005)
    try:
        start = time.perf_counter()
        records = [[] for _ in range(5)]
        futures = [timing.submit(start + 0.003 * i, 10, 10, 4, recorder(records[i])) for i in range(5)]
        await asyncio.gather(*futures)
    finally:
        await timing.close()
    for i, times in enumerate(records):
        assert len(times) == 4
        for k, t in enumerate(times):
            assert t >= start + 0.003 * i + 0.02 + k * 0.005  # never early


async def test_fixed_timing_zero_delay_gives_one_token_a_pass():
    timing = FixedTiming(ttft=0.0, itl=0.0)
    try:
        counts = [[] for _ in range(3)]
        futures = [timing.submit(0.0, 10, 10, n, recorder(counts[i])) for i, n in enumerate((2, 5, 9))]
        await asyncio.gather(*futures)
        assert [len(c) for c in counts] == [2, 5, 9]
        assert timing.passes == 9  # the three requests shared passes
    finally:
        await timing.close()


@pytest.mark.parametrize("make", [lambda: FixedTiming(0.0, 0.001), lambda: BatchTiming(0.0, 0.0)])
async def test_stopped_failed_and_abandoned_requests_leave_the_others_running(make):
    timing = make()
    try:
        stopped, failed, abandoned, healthy = [], [], [], []

        def boom(count):
            failed.append(count)
            raise ConnectionResetError("gone")

        f_stop = timing.submit(0.0, 10, 10, 50, recorder(stopped, stop_after=3))
        f_fail = timing.submit(0.0, 10, 10, 50, boom)
        f_gone = timing.submit(0.0, 10, 10, 50, recorder(abandoned))
        f_ok = timing.submit(0.0, 10, 10, 20, recorder(healthy))
        f_gone.cancel()
        await f_stop
        with pytest.raises(ConnectionResetError):
            await f_fail
        await f_ok
        assert len(stopped) == 3 and failed == [1] and abandoned == [] and len(healthy) == 20
    finally:
        await timing.close()


async def test_batch_timing_serves_all_streams_in_shared_steps():
    timing = BatchTiming(prefill_per_token=0.0, decode_per_seq=0.0)
    counts = [3, 5, 8]
    got = [[] for _ in counts]
    try:
        await asyncio.gather(*(timing.submit(0.0, 10, 10, n, recorder(got[i])) for i, n in enumerate(counts)))
        assert [len(g) for g in got] == counts
        # all three ran in the same steps: 8 steps (plus admission) serve 16 tokens
        assert timing.steps <= 9
    finally:
        await timing.close()


async def test_sequential_calls_reuse_one_connection():
    from simulator.behaviour import CallRequest
    from simulator.live.client import Client, Target
    from simulator.workload import Call

    emulator = Emulator(EmulatorSettings(ttft=0.001, itl=0.001))
    url = await emulator.start()
    try:
        async with Client(Target(url), time.perf_counter()) as client:
            for i in range(20):
                record, _ = await client.send(CallRequest("t", "c", i, Call(input_tokens=32, output_tokens=5)), 0.0)
                assert record.ok
    finally:
        await emulator.stop()
    assert emulator.requests == 20
    assert emulator.connections_opened <= 2  # one for GET /v1/models and the calls, at most one more
    stats = emulator.stats()
    assert stats["requests"] == 20 and stats["connections_opened"] == emulator.connections_opened
    assert stats["emit_lateness"]["count"] == 20 * 5  # every token's lateness was noted
    assert 0 <= stats["emit_lateness"]["p50"] <= stats["emit_lateness"]["max"]  # never early


async def test_stats_route():
    async with run_emulator() as url:
        async with aiohttp.ClientSession() as session:
            async with session.get(url + "/agentload/stats") as resp:
                data = await resp.json()
    assert data == {"requests": 0, "connections_opened": 1, "active_streams": 0, "max_active_streams": 0}  # batched: no lateness


def test_parse_fault():
    assert parse_fault("http_503:0.25") == ("http_503", 0.25)
    assert parse_fault("reset") == ("reset", 1.0)
    for bad, field in (("boom:0.1", "kind"), ("http_200:0.1", "kind"), ("stall:x", "rate"), ("stall:2", "rate")):
        with pytest.raises(InputError) as info:
            parse_fault(bad)
        assert info.value.field == field


async def test_global_faults_are_seeded():
    async def statuses(seed):
        async with run_emulator(faults=(("http_503", 0.5),), seed=seed, ttft=0.0, itl=0.0) as url:
            return [(await post(url, "/v1/completions", {"prompt": [20], "max_tokens": 1}))[0] for _ in range(20)]

    first = await statuses(1)
    assert first == await statuses(1)
    async with run_emulator(faults=("http_503:0.5",), seed=1, ttft=0.0, itl=0.0) as url:  # the command line's form
        assert [(await post(url, "/v1/completions", {"prompt": [20], "max_tokens": 1}))[0] for _ in range(20)] == first
    assert set(first) == {200, 503}


async def test_fault_header_http_status():
    async with run_emulator() as url:
        status, raw = await post(url, "/v1/completions", {"prompt": [20], "max_tokens": 1}, {"X-Agentload-Fault": "http_429"})
        assert status == 429 and "injected fault" in json.loads(raw)["error"]["message"]
        status, raw = await post(url, "/v1/completions", {"prompt": [20], "max_tokens": 1}, {"X-Agentload-Fault": "bogus"})
        assert status == 400


async def test_emulator_object_counts_requests():
    emulator = Emulator(EmulatorSettings(ttft=0.0, itl=0.0))
    async with emulator:
        await post(emulator.url, "/v1/completions", {"prompt": [20], "max_tokens": 2})
    assert emulator.requests == 1 and emulator.max_active_streams == 1


def test_serve_emulator_rejects_bad_options(capsys):
    from simulator.cli import main

    assert main(["serve-emulator", "--fault", "boom:0.1"]) == 2
    assert "unknown fault 'boom'" in capsys.readouterr().err
    assert main(["serve-emulator", "--fault", "reset:0.7", "--fault", "stall:0.7"]) == 2
    assert main(["serve-emulator", "--itl", "-1"]) == 2
    assert "--itl" in capsys.readouterr().err


def test_serve_emulator_settings():
    from simulator.cli import build_parser
    from simulator.cli.serve_emulator import settings_from

    args = build_parser().parse_args(
        ["serve-emulator", "--ttft", "0.05", "--itl", "0.01", "--fault", "http_500:0.1", "--max-model-len", "2048"]
    )
    settings = settings_from(args)
    assert (settings.ttft, settings.itl, settings.max_model_len) == (0.05, 0.01, 2048)
    assert settings.faults == (("http_500", 0.1),)
    assert isinstance(Emulator(settings).timing, FixedTiming)
    args = build_parser().parse_args(["serve-emulator", "--decode-per-seq", "0.001"])
    assert isinstance(Emulator(settings_from(args)).timing, BatchTiming)


async def test_chat_stream_opens_with_the_role_chunk():
    async with run_emulator() as url:
        async with aiohttp.ClientSession() as session:
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}
            async with session.post(url + "/v1/chat/completions", json=body) as resp:
                raw = (await resp.read()).decode()
    events = [json.loads(line[6:]) for line in raw.split("\n\n") if line.startswith("data: {")]
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [e["choices"][0]["delta"]["content"] != "" for e in events[1:]] == [True] * 3
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    assert "usage" not in events[-1]  # not asked for


async def test_batch_timing_respects_max_num_seqs():
    """Requests beyond max_num_seqs wait for a free slot (counted in scheduler steps, not time)."""
    timing = BatchTiming(prefill_per_token=0.0, decode_per_seq=0.0, max_num_seqs=2)

    try:
        await asyncio.gather(*(timing.submit(0.0, 1, 1, 4, recorder([])) for _ in range(4)))
        # only two run at once: four streams of four tokens take at least eight steps
        assert timing.steps >= 8
    finally:
        await timing.close()


class DeclaringTiming(TimingModel):
    """A timing model declaring every capability: all tokens at once, its own 'prefix cache' that
    reports 7 cached tokens, a context of 64 tokens, lateness, stats and metrics."""

    max_model_len = 64
    keeps_prefix_cache = True

    def __init__(self):
        self.prompts = []
        self.lateness = [0.002, 0.004]

    def submit(self, arrival, prompt_tokens, uncached_tokens, output_tokens, emit, prompt_ids=None):
        self.prompts.append((prompt_tokens, uncached_tokens, list(prompt_ids)))
        future = asyncio.get_running_loop().create_future()

        def all_tokens():
            emit(output_tokens)
            future.set_result(7)

        asyncio.get_running_loop().call_soon(all_tokens)
        return future

    async def close(self):
        pass

    def stats(self):
        return {"declared": {"prompts": len(self.prompts)}}

    def metrics_text(self, model):
        return f'vllm:num_requests_running{{model_name="{model}"}} 0.0\n'


async def test_the_server_uses_what_a_timing_model_declares():
    timing = DeclaringTiming()
    emulator = Emulator(EmulatorSettings(model="m", max_model_len=4096), timing=timing)
    async with emulator:
        url = emulator.url
        async with aiohttp.ClientSession() as session:
            async with session.get(url + "/v1/models") as resp:
                assert (await resp.json())["data"][0]["max_model_len"] == 64
            async with session.get(url + "/metrics") as resp:
                assert resp.status == 200 and (await resp.text()) == 'vllm:num_requests_running{model_name="m"} 0.0\n'
            async with session.get(url + "/agentload/stats") as resp:
                stats = await resp.json()
        status, raw = await post(url, "/v1/completions", {"prompt": list(range(20, 85)), "max_tokens": 1})
        assert status == 400 and "maximum context length is 64 tokens" in json.loads(raw)["error"]["message"]
        prompt = list(range(20, 52))  # two blocks, sent twice: the server's own cache would find 16
        for _ in range(2):
            status, raw = await post(url, "/v1/completions", {"prompt": prompt, "max_tokens": 100})
            usage = json.loads(raw)["usage"]
            assert status == 200 and usage["prompt_tokens_details"]["cached_tokens"] == 7
        assert usage["completion_tokens"] == 64 - 32  # capped by the declared context
    assert stats["declared"] == {"prompts": 0}
    assert stats["emit_lateness"]["count"] == 2 and stats["emit_lateness"]["max"] == 0.004
    # the model's own cache: every prompt arrives whole, with its token ids
    assert timing.prompts == [(32, 32, prompt), (32, 32, prompt)]


async def test_a_timing_model_declaring_nothing_gets_no_metrics_and_no_lateness():
    emulator = Emulator(EmulatorSettings(max_model_len=4096), timing=BatchTiming(0.0, 0.0))
    async with emulator:
        async with aiohttp.ClientSession() as session:
            async with session.get(emulator.url + "/metrics") as resp:
                assert resp.status == 404
        prompt = list(range(20, 52))
        cached = []
        for _ in range(2):
            status, raw = await post(emulator.url, "/v1/completions", {"prompt": prompt, "max_tokens": 2})
            cached.append(json.loads(raw)["usage"]["prompt_tokens_details"]["cached_tokens"])
    assert cached == [0, 16]  # the server's own prefix cache
    assert set(emulator.stats()) == {"requests", "connections_opened", "active_streams", "max_active_streams"}
    assert emulator.settings.max_model_len == 4096
