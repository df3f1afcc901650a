"""The /metrics probe: Prometheus parsing, summaries, per-task joins, and scraping a small HTTP server."""

import asyncio
import json

import pytest
from aiohttp import web

from simulator.live.probes import MetricsProbe, Sample, parse_metrics
from simulator.metrics.records import TaskRecord
from simulator.metrics.server import TimelineJoin

# Shaped like vLLM 0.x's exposition: counters with _total and _created, labels, two engines.
EXPOSITION = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
vllm:num_requests_running{engine="1",model_name="tiny"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 7.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 4096.0
vllm:prefix_cache_queries_created{engine="0",model_name="tiny"} 1.7e+09
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 1024.0
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="tiny"} 1.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="tiny"} 5000.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="tiny"} 640.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5",model_name="tiny"} 3.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="tiny"} 4.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="tiny"} 4.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="tiny"} 1.5
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 123.0
"""

OLD_NAMES = """\
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.5
# TYPE vllm:gpu_prefix_cache_queries_total counter
vllm:gpu_prefix_cache_queries_total{model_name="m"} 10.0
# TYPE vllm:gpu_prefix_cache_hits_total counter
vllm:gpu_prefix_cache_hits_total{model_name="m"} 4.0
"""

SPEC_DECODE = """\
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30.0
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 21.0
"""


def test_parse_sums_label_sets_and_keeps_counter_totals():
    values = parse_metrics(EXPOSITION)
    assert values == {
        "num_requests_running": 5.0,
        "num_requests_waiting": 7.0,
        "kv_cache_usage_perc": 0.25,
        "prefix_cache_queries": 4096.0,
        "prefix_cache_hits": 1024.0,
        "num_preemptions": 1.0,
        "prompt_tokens": 5000.0,
        "generation_tokens": 640.0,
    }


def test_parse_reads_older_names_and_spec_decode():
    values = parse_metrics(OLD_NAMES + SPEC_DECODE)
    assert values["kv_cache_usage_perc"] == 0.5
    assert values["prefix_cache_queries"] == 10.0 and values["prefix_cache_hits"] == 4.0
    assert values["spec_decode_num_drafts"] == 10.0
    assert values["spec_decode_num_draft_tokens"] == 30.0
    assert values["spec_decode_num_accepted_tokens"] == 21.0
    assert "num_requests_running" not in values


def test_parse_rejects_garbage():
    with pytest.raises(ValueError):
        parse_metrics("vllm:num_requests_running{engine=0 3.0 x y\n")


def _probe_with(samples):
    probe = MetricsProbe("http://127.0.0.1:1", interval_s=1.0, t0=0.0)
    probe.samples.extend(Sample(t, v) for t, v in samples)
    return probe


def test_summary_means_maxes_deltas_and_hit_share():
    probe = _probe_with([
        (0.0, {"kv_cache_usage_perc": 0.1, "num_requests_waiting": 0.0, "prefix_cache_queries": 100.0, "prefix_cache_hits": 10.0}),
        (1.0, {"kv_cache_usage_perc": 0.3, "num_requests_waiting": 4.0, "prefix_cache_queries": 300.0, "prefix_cache_hits": 110.0}),
        (2.0, {"kv_cache_usage_perc": 0.2, "num_requests_waiting": 2.0, "prefix_cache_queries": 500.0, "prefix_cache_hits": 210.0}),
    ])
    probe.failures = 1
    s = probe.summary()
    assert s["samples"] == 3 and s["failed_scrapes"] == 1
    assert s["kv_cache_usage_perc"]["mean"] == pytest.approx(0.2)
    assert s["kv_cache_usage_perc"]["max"] == pytest.approx(0.3)
    assert s["num_requests_waiting"] == {"mean": 2.0, "max": 4.0}
    assert s["prefix_cache_queries_delta"] == 400.0
    assert s["prefix_cache_hits_delta"] == 200.0
    assert s["prefix_cache_hit_share"] == pytest.approx(0.5)
    assert "num_requests_running" not in s


def test_counter_delta_survives_a_server_restart():
    probe = _probe_with([(0.0, {"prompt_tokens": 100.0}), (1.0, {"prompt_tokens": 150.0}),
                         (2.0, {"prompt_tokens": 20.0}), (3.0, {"prompt_tokens": 60.0})])
    assert probe.summary()["prompt_tokens_delta"] == 50.0 + 20.0 + 40.0


def test_hit_share_is_none_without_queries():
    probe = _probe_with([(0.0, {"prefix_cache_queries": 5.0, "prefix_cache_hits": 0.0}),
                         (1.0, {"prefix_cache_queries": 5.0, "prefix_cache_hits": 0.0})])
    assert probe.summary()["prefix_cache_hit_share"] is None


def _task(task_id, arrival, end):
    return TaskRecord(task_id, "c", arrival, end, True, 1, 1, end - arrival, 0.0, 0.0)


def test_join_is_time_weighted_sample_and_hold():
    probe = _probe_with([
        (1.0, {"kv_cache_usage_perc": 0.2, "num_requests_waiting": 0.0, "num_requests_running": 1.0}),
        (2.0, {"kv_cache_usage_perc": 0.6, "num_requests_waiting": 4.0, "num_requests_running": 3.0}),
        (4.0, {"kv_cache_usage_perc": 0.0, "num_requests_waiting": 0.0}),
    ])
    join = TimelineJoin(probe.samples)
    a, b, c, d, e = (join.loads(t) for t in (_task("a", 1.5, 3.5), _task("b", 0.0, 1.0), _task("c", 5.0, 5.0),
                                              _task("d", 3.0, 5.0), _task("e", 0.5, 1.5)))
    # a: 0.5 s at 0.2, 1.5 s at 0.6
    assert a["kv_cache_usage_mean"] == pytest.approx((0.5 * 0.2 + 1.5 * 0.6) / 2.0)
    assert a["waiting_mean"] == pytest.approx(1.5 * 4.0 / 2.0)
    # b lies before the first sample: the first value holds.
    assert b["kv_cache_usage_mean"] == pytest.approx(0.2)
    # c has zero length: the value at its instant.
    assert c["kv_cache_usage_mean"] == 0.0
    # d: running's last sample is at 2.0 and holds through d's lifetime.
    assert d["running_mean"] == pytest.approx(3.0)
    assert d["waiting_mean"] == pytest.approx((1.0 * 4.0 + 1.0 * 0.0) / 2.0)
    # e starts before the first sample and ends after it
    assert e["kv_cache_usage_mean"] == pytest.approx(0.2) and e["running_mean"] == pytest.approx(1.0)


def test_join_without_samples_gives_none():
    load = TimelineJoin([]).loads(_task("a", 0.0, 1.0))
    assert load == {"kv_cache_usage_mean": None, "waiting_mean": None, "running_mean": None}


def test_write_jsonl(tmp_path):
    probe = _probe_with([(0.5, {"num_requests_running": 1.0}), (1.5, {"num_requests_running": 0.0})])
    path = probe.write(tmp_path / "result")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert path.name == "server_metrics.jsonl"
    assert rows == [{"t": 0.5, "num_requests_running": 1.0}, {"t": 1.5, "num_requests_running": 0.0}]


class _FakeServer:
    """A /metrics endpoint whose counters grow each scrape; answers 500 on chosen scrapes."""

    def __init__(self, fail_on=(), notify_after=None):
        self.count = 0
        self.fail_on = set(fail_on)
        self.notify_after = notify_after
        self.reached = asyncio.Event()

    async def handle(self, request):
        self.count += 1
        if self.notify_after is not None and self.count >= self.notify_after:
            self.reached.set()
        if self.count in self.fail_on:
            return web.Response(status=500, text="boom")
        text = (
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="m"}} {self.count}.0\n'
            "# TYPE vllm:prompt_tokens_total counter\n"
            f'vllm:prompt_tokens_total{{model_name="m"}} {100 * self.count}.0\n'
        )
        return web.Response(text=text, content_type="text/plain")


async def _serve(fake):
    app = web.Application()
    app.router.add_get("/metrics", fake.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}"


async def test_scrape_once_counts_failures_and_goes_on():
    fake = _FakeServer(fail_on={2})
    runner, url = await _serve(fake)
    try:
        probe = MetricsProbe(url, interval_s=1.0)
        first = await probe.scrape_once()
        assert await probe.scrape_once() is None
        third = await probe.scrape_once()
    finally:
        await runner.cleanup()
    assert first.values == {"num_requests_running": 1.0, "prompt_tokens": 100.0}
    assert third.values["prompt_tokens"] == 300.0
    assert probe.failures == 1 and "500" in probe.last_error
    assert [s.values["num_requests_running"] for s in probe.samples] == [1.0, 3.0]


async def test_unreachable_server_is_counted_not_raised():
    probe = MetricsProbe("http://127.0.0.1:9", interval_s=1.0, timeout_s=2.0)
    assert await probe.scrape_once() is None
    assert probe.failures == 1 and probe.samples == []


async def test_scheduled_scraping_until_stopped(tmp_path):
    fake = _FakeServer(notify_after=3)
    runner, url = await _serve(fake)
    try:
        async with MetricsProbe(url, interval_s=0.05, gpu=True) as probe:
            await asyncio.wait_for(fake.reached.wait(), timeout=30)
    finally:
        await runner.cleanup()
    # at least the three scheduled scrapes plus the final one taken by stop()
    assert len(probe.samples) >= 4
    times = [s.t for s in probe.samples]
    assert times == sorted(times)
    summary = probe.summary()
    assert summary["prompt_tokens_delta"] == 100.0 * (len(probe.samples) - 1)
    assert summary["num_requests_running"]["max"] == float(len(probe.samples))
    # No GPU here: GPU sampling turned itself off without failing scrapes.
    assert probe.failures == 0
    assert probe.write(tmp_path).exists()


def test_rejects_a_non_positive_interval():
    with pytest.raises(ValueError):
        MetricsProbe("http://x", interval_s=0)
