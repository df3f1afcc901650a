"""A simulation's server_metrics.jsonl: the twin sampled as a live run scrapes vLLM's /metrics, on the
scrape grid of simulated time, with values that agree with the twin and its records."""

from __future__ import annotations

import math

import numpy as np
import pytest

import conversations as shared
from simulator.metrics import results, server
from simulator.metrics.server import COUNTERS, GAUGES
from simulator.report.folder_data import Scrapes
from simulator.sim.driver import SimDriver, ListSink
from simulator.sim.profile import ServerProfile, profile_from_dict
from simulator.pipeline.twin import simulate_to_folder
from simulator.sim.scrape import KEYS
from simulator.workload import Call, Task, Workload

STEP_TIME = {"fixed": 0.01, "per_token": 2e-5, "per_decode_seq": 3e-4, "per_context_token": 1e-7}


def plain(num_blocks: int = 4000, max_num_seqs: int = 64, caching: bool = True) -> ServerProfile:
    return profile_from_dict({
        "scheduler": {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": 512, "max_model_len": 4096},
        "kv_cache": {"block_size": 16, "num_blocks": num_blocks, "enable_prefix_caching": caching},
        "step_time": STEP_TIME})


def hybrid(num_blocks: int = 500) -> ServerProfile:
    return profile_from_dict({
        "scheduler": {"max_num_seqs": 64, "max_num_batched_tokens": 256, "max_model_len": 4096},
        "kv_cache": {"block_size": 16, "num_blocks": num_blocks, "bytes_per_token": 64,
                     "hybrid": {"attention_layers": 1, "mamba_layers": 2, "mamba_state_bytes": 4096}},
        "step_time": STEP_TIME})


PROFILES = {
    "plain": plain(),
    # a pool too small for the load, and few seats: requests wait, the newest are preempted
    "tight": plain(num_blocks=300, max_num_seqs=16),
    "hybrid": hybrid(),
    "hybrid-tight": hybrid(num_blocks=150),
}


def conversations() -> Workload:
    return shared.conversations(3, tasks=40, max_output=150, arrival_span=3.0)


def simulated(tmp_path, profile: ServerProfile, interval=0.25, **options):
    folder = tmp_path / "sim"
    summary, outcome = simulate_to_folder(conversations(), profile, folder, scrape_interval=interval, **options)
    return folder, summary, outcome, server.read_samples(folder)


def test_samples_carry_a_live_scrapes_names_on_the_grid_of_simulated_time(tmp_path):
    folder, summary, outcome, samples = simulated(tmp_path, PROFILES["plain"], interval=0.25)
    assert set(KEYS) <= set(GAUGES) | set(COUNTERS)  # the names the probe gives vLLM's metrics
    assert all(set(s) == {"t", *KEYS} for s in samples)
    times = [s["t"] for s in samples]
    end = summary.simulation.simulated_seconds
    assert times[:-1] == [0.25 * k for k in range(len(times) - 1)]  # 0, then every interval
    assert times[-1] == end == outcome.end and times[-2] < end <= times[-2] + 0.25  # and the run's end
    scrapes = Scrapes.read(folder / server.SERVER_METRICS_FILE)  # what the report reads
    assert len(scrapes) == len(samples) and set(scrapes.values) == set(KEYS)


@pytest.mark.parametrize("interval", [0.01, 100.0])  # every request seen by samples; none but at its end
@pytest.mark.parametrize("name", sorted(PROFILES))
def test_samples_agree_with_the_twin_and_its_records(tmp_path, name, interval):
    profile = PROFILES[name]
    folder, summary, _, samples = simulated(tmp_path, profile, interval=interval)
    column = {key: np.array([s[key] for s in samples]) for key in KEYS}
    running, waiting, usage = column["num_requests_running"], column["num_requests_waiting"], column["kv_cache_usage_perc"]
    assert running.max() <= profile.scheduler.max_num_seqs and waiting.min() >= 0
    assert ((usage >= 0) & (usage <= 1)).all() and (usage[running > 0] > 0).all()
    assert running[-1] == waiting[-1] == usage[-1] == 0  # the last sample: every task ended
    for key in ("prefix_cache_queries", "prefix_cache_hits", "num_preemptions", "prompt_tokens",
                "generation_tokens", "prompt_tokens_cached"):
        assert (np.diff(column[key]) >= 0).all(), key  # cumulative, as vLLM's counters
    last = samples[-1]
    calls = [c for c in results.iter_calls(folder) if c.ok]
    sim = summary.simulation
    # vLLM counts a request's lookup once, at its first admission; its prompt when its first token comes
    assert last["prefix_cache_queries"] == last["prompt_tokens"] == sum(c.input_tokens for c in calls)
    assert last["prefix_cache_hits"] == last["prompt_tokens_cached"] == sim.cached_prompt_tokens \
        == sum(c.cached_tokens for c in calls) > 0
    assert last["generation_tokens"] == sum(c.output_tokens for c in calls)
    assert last["num_preemptions"] == sim.preemptions
    if interval < 1:
        assert running.max() > 0 and usage.max() > 0
    if name.endswith("tight"):
        assert sim.preemptions > 0
        if interval < 1:
            assert waiting.max() > 0


@pytest.mark.parametrize("name", ["plain", "hybrid-tight"])
def test_sampling_leaves_the_records_as_they_were(tmp_path, name):
    off, _ = simulate_to_folder(conversations(), PROFILES[name], tmp_path / "off", scrape_interval=None)
    simulate_to_folder(conversations(), PROFILES[name], tmp_path / "on", scrape_interval=0.01)
    assert not (tmp_path / "off" / server.SERVER_METRICS_FILE).exists()
    assert not off.server["scraped"] and off.server["timeline"] is None and off.server["note"]
    for name in (results.CALLS_FILE, results.TASKS_FILE):
        assert (tmp_path / "on" / name).read_bytes() == (tmp_path / "off" / name).read_bytes(), name


def test_without_prefix_caching_no_lookup_is_counted(tmp_path):
    _, _, _, samples = simulated(tmp_path, plain(caching=False))
    assert samples[-1]["prefix_cache_queries"] == samples[-1]["prefix_cache_hits"] == 0
    assert samples[-1]["prompt_tokens"] > 0


def test_a_run_cut_off_at_the_drain_deadline_ends_its_samples_there(tmp_path):
    tasks = (Task("short", (Call(100, 5),)), Task("long", (Call(200, 3000),), arrival=0.5))
    folder = tmp_path / "sim"
    summary, outcome = simulate_to_folder(Workload(tasks), plain(), folder, drain=1.0, scrape_interval=0.3)
    samples = server.read_samples(folder)
    assert outcome.stop_reason == "drain_timeout"
    assert [s["t"] for s in samples] == pytest.approx([0.0, 0.3, 0.6, 0.9, 1.2, 1.5])
    assert samples[-1]["t"] == 1.5 and samples[-1]["num_requests_running"] == 1  # the long call, cut off


def test_the_interval_must_be_positive_and_have_somewhere_to_go():
    for bad in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError, match="scrape_interval must be > 0"):
            SimDriver(conversations(), plain(), ListSink(), scrape_interval=bad, on_scrape=lambda t, v: None)
    with pytest.raises(ValueError, match="go together"):
        SimDriver(conversations(), plain(), ListSink(), scrape_interval=1.0)


def test_the_summary_has_a_live_runs_server_section_and_server_tasks(tmp_path):
    folder, summary, outcome, samples = simulated(tmp_path, PROFILES["tight"], interval=0.25)
    section = summary.server
    calls = [c for c in results.read_calls(folder) if c.ok]
    tasks = list(results.iter_tasks(folder))
    assert section["scraped"] and section["interval_s"] == 0.25 and section["tasks"] == len(tasks)
    assert section["files"] == [server.SERVER_METRICS_FILE, server.SERVER_TASKS_FILE]
    # the calls' cached tokens, as a live run counts them from each response's usage
    usage = section["usage_cached_tokens"]
    assert usage["calls_ok"] == usage["calls_reporting"] == len(calls)
    assert usage["cached_tokens"] == sum(c.cached_tokens for c in calls) > 0
    assert usage["prompt_tokens"] == sum(c.input_tokens for c in calls)
    # the timeline: the samples' means and maxima, the counters' increase
    timeline = section["timeline"]
    assert timeline["samples"] == len(samples)
    waiting = [s["num_requests_waiting"] for s in samples]
    assert timeline["num_requests_waiting"]["max"] == max(waiting) > 0
    assert timeline["num_preemptions_delta"] == samples[-1]["num_preemptions"] - samples[0]["num_preemptions"] > 0
    # one row per task, its load a time-weighted mean of what the twin held while it ran
    rows = server.read_task_rows(folder)
    assert [r["task_id"] for r in rows] == [t.task_id for t in tasks]
    busiest = max(rows, key=lambda r: r["running_mean"])
    assert 0 < busiest["running_mean"] <= max(s["num_requests_running"] for s in samples)
    assert all(0.0 <= r["kv_cache_usage_mean"] <= 1.0 for r in rows)
    assert section["per_task"]["cache_hit_share"]["count"] == sum(r["cache_hit_share"] is not None for r in rows)


@pytest.mark.parametrize("name", ["plain", "tight", "hybrid", "hybrid-tight"])
def test_samples_taken_inside_a_run_of_decode_steps_are_those_of_stepping_one_by_one(tmp_path, name):
    # The fast path advances its decode group many steps at once, planned past the scrapes; a scrape
    # falling inside such a run reads the tokens of the run's steps that ended before it and the blocks
    # of those begun, as it would stepping one by one.
    _, _, fast, fast_samples = simulated(tmp_path / "fast", PROFILES[name], interval=0.05)
    _, _, slow, slow_samples = simulated(tmp_path / "slow", PROFILES[name], interval=0.05, fast_decode=False)
    assert fast.twin.steps == slow.twin.steps and fast.twin.fast_chunks > 0
    assert len(fast_samples) == len(slow_samples) > 20
    keys = ["t", *KEYS]
    assert [[s[k] for k in keys] for s in fast_samples] == [[s[k] for k in keys] for s in slow_samples]
