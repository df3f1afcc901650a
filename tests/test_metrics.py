"""Histograms, result files and the summary: encoded histograms decode to the same counts, field names
follow `vllm bench serve`, the window excludes warm-up, SLO goodput counts the right items, and a
summary rebuilt from the JSONL records matches the one written at the end."""

from __future__ import annotations

import json

import numpy as np
import pytest

from simulator.errors import InputError
from simulator.metrics import histograms as H
from simulator.metrics import results
from simulator.metrics.records import CallRecord, TaskRecord
from simulator.metrics.results import ResultWriter, Window
from simulator.metrics.slo import PercentileTarget, Slo
from simulator.metrics.summary import rebuild, summarize

VLLM_FIELDS = ["completed", "total_input_tokens", "total_output_tokens", "request_throughput",
               "output_throughput", "total_token_throughput"] + [
    f"{stat}_{metric}_ms" for metric in ("ttft", "tpot", "itl", "e2el")
    for stat in ("mean", "median", "std", "p50", "p90", "p95", "p99", "p99.9")]


def call(task: str, index: int, send: float, ttft: float, latency: float, out: int = 11, ok: bool = True,
         error: str | None = None, cls: str = "default") -> CallRecord:
    return CallRecord(task_id=task, task_class=cls, call_index=index, attempt=0, intended_send=send,
                      actual_send=send, end=send + latency, ok=ok, ttft=ttft if ok else None,
                      itl_count=out - 1 if ok else 0, itl_mean=(latency - ttft) / (out - 1) if ok else None,
                      input_tokens=100, output_tokens=out if ok else 0, requested_output_tokens=out,
                      error_class=error)


def task(task_id: str, arrival: float, end: float, cls: str = "default", ok: bool = True, parent=None) -> TaskRecord:
    return TaskRecord(task_id=task_id, task_class=cls, arrival=arrival, end=end, ok=ok, calls=1, calls_planned=1,
                      time_in_calls=(end - arrival) / 2, time_in_gaps=(end - arrival) / 4, client_lag=0.0,
                      parent_id=parent, time_in_ttft=(end - arrival) / 8)


def test_histograms_round_trip_through_encoding():
    rng = np.random.default_rng(7)
    values = rng.lognormal(mean=-3, sigma=1.0, size=5000)
    hist = {"ttft": H.from_seconds(values), "empty": H.new_histogram(), "e2el": H.from_seconds(values * 10)}
    encoded = H.encode_all(hist)
    assert set(encoded) == {"ttft", "e2el"}
    decoded = H.decode_all(json.loads(json.dumps(encoded)))
    for name in encoded:
        assert decoded[name].get_total_count() == hist[name].get_total_count() == 5000
        for p in (50, 99, 99.9):
            assert decoded[name].get_value_at_percentile(p) == hist[name].get_value_at_percentile(p)
    # 3 significant digits: the p50 is within 0.1% of the exact one
    exact = float(np.percentile(values, 50)) * 1e6
    assert abs(hist["ttft"].get_value_at_percentile(50) - exact) / exact < 2e-3


def test_summary_uses_vllm_field_names_and_counts():
    calls = [call("a", 0, 0.0, 0.1, 0.5), call("a", 1, 1.0, 0.2, 0.7), call("b", 0, 0.5, 0.3, 0.3, ok=False, error="http_5xx")]
    tasks = [task("a", 0.0, 1.7), task("b", 0.5, 0.8, ok=False)]
    summary, hist = summarize(calls, tasks, planned={"tasks": 2, "calls": 3, "subtasks": 0})
    for name in VLLM_FIELDS:
        assert name in summary, name
    assert summary["completed"] == 2 and summary["failed"] == 1
    assert summary["total_output_tokens"] == 22 and summary["total_input_tokens"] == 200
    assert summary["median_ttft_ms"] == pytest.approx(100, rel=1e-3)
    assert summary["p99_ttft_ms"] == pytest.approx(200, rel=1e-3)
    assert summary["duration"] == pytest.approx(1.7)
    assert summary["request_throughput"] == pytest.approx(2 / 1.7)
    assert summary["errors"] == {"http_5xx": 1}
    assert summary["calls"]["planned"] == 3 and summary["calls"]["ok"] == 2 and summary["calls"]["not_done"] == 1
    assert summary["tasks"]["completed"] == 1 and summary["tasks"]["failed"] == 1
    assert summary["tasks"]["throughput_per_hour"] == pytest.approx(3600 / 1.7)
    assert hist["ttft"].get_total_count() == 2
    # the ITL histogram without live gaps: each call's mean gap, weighted by its count
    assert hist["itl"].get_total_count() == 20


def test_window_leaves_warmup_out_of_figures_but_keeps_records():
    calls = [call("a", 0, 0.5, 0.9, 1.0), call("b", 0, 2.0, 0.1, 0.2)]
    tasks = [task("a", 0.5, 1.5), task("b", 2.0, 2.2)]
    summary, hist = summarize(calls, tasks, window=Window(1.0, None))
    assert summary["completed"] == 1 and summary["calls"]["excluded_by_window"] == 1
    assert summary["p99_ttft_ms"] == pytest.approx(100, rel=1e-3)
    assert summary["tasks"]["completed"] == 1 and summary["tasks"]["excluded_by_window"] == 1
    assert hist["task_completion"].get_total_count() == 1


def test_slo_goodput_counts_items_within_the_bound():
    calls = [call("t", i, float(i), ttft, 1.0) for i, ttft in enumerate([0.1, 0.2, 0.3, 0.9])]
    tasks = [task(f"t{i}", float(i), float(i) + d, cls="x" if i % 2 else "y") for i, d in enumerate([5, 10, 20, 40])]
    slo = Slo(ttft_ms=PercentileTarget(p99=250), task_s=PercentileTarget(p50=12, p90=30))
    summary, _ = summarize(calls, tasks, slo=slo)
    assert summary["slo"]["calls_meeting_ttft"] == pytest.approx(0.5)
    assert summary["slo"]["ttft_ms"]["met"] is False
    # per-task bound is the highest percentile's: 30 s -> 3 of 4 tasks
    assert summary["tasks"]["slo_met_share"] == pytest.approx(0.75)
    assert summary["tasks"]["goodput_per_hour"] == pytest.approx(3 * 3600 / summary["duration"])
    assert summary["slo"]["task_s"]["percentiles"]["p50"]["met"] is True
    assert set(summary["tasks"]["by_class"]) == {"x", "y"}
    assert summary["tasks"]["by_class"]["y"]["goodput_per_hour"] == pytest.approx(2 * 3600 / summary["duration"])


def test_slo_target_needs_a_bound():
    with pytest.raises(ValueError):
        PercentileTarget()
    assert PercentileTarget.model_validate({"p99.9": 5, "p50": 1}).item_bound() == 5


def test_writer_streams_records_and_summary_rebuilds_from_them(tmp_path):
    calls = [call("a", 0, 0.0, 0.1, 0.5), call("a", 1, 1.0, 0.2, 0.7), call("b", 0, 0.3, 0.0, 0.1, ok=False, error="cancelled")]
    tasks = [task("a", 0.0, 1.7), task("b", 0.3, 0.4, ok=False)]
    with ResultWriter(tmp_path, Window()) as writer:
        writer.write_run_info({"window": {"start": 0.0, "end": None}, "planned": {"tasks": 3, "calls": 5},
                               "settings": {"slo": {"ttft_ms": {"p99.9": 150}}}})
        for c in calls:
            writer.call(c, [0.04] * 10 if c.ok else [])
        for t in tasks:
            writer.task(t)
        assert writer.counters.calls_ok == 2 and writer.counters.errors == {"cancelled": 1}
    assert results.read_calls(tmp_path) == calls
    assert results.read_tasks(tmp_path) == tasks
    itl = H.load(tmp_path / results.HISTOGRAMS_FILE)["itl"]
    assert itl.get_total_count() == 20
    rebuilt = rebuild(tmp_path)
    direct, _ = summarize(calls, tasks, itl=itl, planned={"tasks": 3, "calls": 5},
                          slo=Slo(ttft_ms=PercentileTarget(p999=150)))
    assert rebuilt["partial"] is True
    for key in VLLM_FIELDS + ["calls", "errors"]:
        assert rebuilt[key] == direct[key], key
    assert rebuilt["slo"]["calls_meeting_ttft"] == pytest.approx(0.5)
    assert rebuilt["tasks"]["not_started"] == 1


def test_reader_tolerates_a_line_cut_by_a_crash_but_not_a_bad_middle_line(tmp_path):
    good = json.dumps(results.record_dict(call("a", 0, 0.0, 0.1, 0.5)))
    (tmp_path / results.CALLS_FILE).write_text(good + "\n" + good[:40])
    assert len(results.read_calls(tmp_path)) == 1
    (tmp_path / results.CALLS_FILE).write_text(good[:40] + "\n" + good + "\n")
    with pytest.raises(InputError) as err:
        results.read_calls(tmp_path)
    assert err.value.line == 1 and "calls.jsonl" in str(err.value)
