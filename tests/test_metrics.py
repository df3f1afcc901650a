"""Histograms, result files and the summary: encoded histograms decode to the same counts, field names
follow `vllm bench serve` and summary.json keeps its keys and their order, the window excludes warm-up,
SLO goodput counts the right items, a summary rebuilt from the JSONL records matches the one written at
the end, and a summary.json (whole or partial) loads back to the same JSON."""

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
from simulator.metrics.summary import SimulationStats, Summary, load_summary, rebuild, summarize
from simulator.pipeline.plan import RunPlan
from simulator.pipeline.record import Outcome, Recorder
from simulator.task_run import DriverResult
from simulator.workload import Workload

VLLM_FIELDS = ["completed", "total_input_tokens", "total_output_tokens", "request_throughput",
               "output_throughput", "total_token_throughput"] + [
    f"{stat}_{metric}_ms" for metric in ("ttft", "tpot", "itl", "e2el")
    for stat in ("mean", "median", "std", "p50", "p90", "p95", "p99", "p99.9")]

# summary.json's layout, key for key and in order (what readers of older result folders rely on)
TOP_KEYS = (["agentload_summary", "partial", "stop_reason", "duration", "window", "completed", "failed"]
            + VLLM_FIELDS[1:6] + ["total_cached_tokens"] + VLLM_FIELDS[6:]
            + ["client_lag_ms", "errors", "error_messages", "calls", "tasks", "slo"])
CALL_KEYS = ["attempts", "ok", "failed_attempts", "cancelled", "excluded_by_window", "planned", "not_done"]
TASK_KEYS = ["judged", "completed", "failed", "cancelled", "not_started", "finished_all", "sub_tasks_finished",
             "excluded_by_window", "throughput_per_hour", "completion_time_s", "breakdown_s", "by_class", "planned",
             "goodput_per_hour", "slo_met_share"]
CLASS_KEYS = ["completed", "failed", "cancelled", "throughput_per_hour", "completion_time_s", "goodput_per_hour"]
TIME_KEYS = ["mean", "std", "median", "max", "p50", "p90", "p95", "p99", "p99.9"]
BREAKDOWN_KEYS = ["total", "in_calls", "ttft", "decode", "gaps", "client_lag", "other"]
SLO_KEYS = ["ttft_ms", "tpot_ms", "task_s", "calls_meeting_ttft", "calls_meeting_tpot", "calls_meeting_all",
            "call_goodput"]


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
    assert summary.completed == 2 and summary.failed == 1
    assert summary.ttft.median == summary["median_ttft_ms"]
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


def judged_plan(tasks: int, by_class: dict[str, int] | None = None) -> dict:
    """run.json's planned counts of a run meaning to start `tasks` tasks, all in the window."""
    return {"tasks": tasks, "calls": tasks, "subtasks": 0, "judged": tasks,
            "judged_by_class": by_class or {"default": tasks}}


def test_tasks_cancelled_by_the_drain_count_against_the_task_slo():
    # 17 tasks meant to run; 11 completed within 45 s, 6 cut off by run.drain: a p90 of 60 s is missed
    # (the 90th percentile of 17 tasks is the 15th, as HdrHistogram ranks it: among those that never
    # completed), not "44.1 ok"
    done = [task(f"t{i}", float(i), float(i) + 20 + 2 * i) for i in range(11)]
    cut = [task(f"c{i}", 11.0 + i, 80.0, ok=False) for i in range(6)]
    cut = [TaskRecord(**{**results.record_dict(t), "error_class": "cancelled"}) for t in cut]
    summary, _ = summarize([], done + cut, slo=Slo(task_s=PercentileTarget(p90=60)), planned=judged_plan(17),
                           partial=True, stop_reason="drain_timeout")
    tasks, check = summary.tasks, summary.slo.task_s
    assert (tasks.judged, tasks.completed, tasks.failed, tasks.cancelled, tasks.not_started) == (17, 11, 0, 6, 0)
    assert tasks.not_completed == 6 and (check.judged, check.not_completed) == (17, 6)
    assert check.met is False and check.percentiles["p90"].measured is None
    assert tasks.slo_met_share == pytest.approx(11 / 17)
    # the class's counts are the same partition: cancelled tasks are not failed ones
    assert (tasks.by_class["default"].failed, tasks.by_class["default"].cancelled) == (0, 6)
    # with fewer missing, the percentile is a completed task's: 1 of 17 cut off, p90 is the 15th of all,
    # the 15th fastest completed (38 s)
    summary, _ = summarize([], done + [task(f"d{i}", 11.0 + i, 40.0 + i) for i in range(5)] + cut[:1],
                           slo=Slo(task_s=PercentileTarget(p90=60)), planned=judged_plan(17))
    assert summary.slo.task_s.met is True and summary.slo.task_s.percentiles["p90"].measured == pytest.approx(38.0, rel=1e-3)


def test_tasks_a_stop_kept_from_starting_count_against_the_task_slo():
    # Ctrl-C after one task of seven completed: six never started, the task SLO is missed
    summary, _ = summarize([], [task("t0", 0.0, 1.1)], slo=Slo(task_s=PercentileTarget(p90=90)),
                           planned=judged_plan(7), partial=True, stop_reason="interrupted")
    assert (summary.tasks.judged, summary.tasks.completed, summary.tasks.not_started) == (7, 1, 6)
    assert summary.slo.task_s.met is False and summary.slo.task_s.not_completed == 6
    assert summary.tasks.by_class["default"].not_started == 6


def test_slo_target_needs_a_bound():
    with pytest.raises(ValueError):
        PercentileTarget()
    assert PercentileTarget.model_validate({"p99.9": 5, "p50": 1}).item_bound() == 5


def test_writer_streams_records_and_summary_rebuilds_from_them(tmp_path):
    calls = [call("a", 0, 0.0, 0.1, 0.5), call("a", 1, 1.0, 0.2, 0.7), call("b", 0, 0.3, 0.0, 0.1, ok=False, error="cancelled")]
    tasks = [task("a", 0.0, 1.7), task("b", 0.3, 0.4, ok=False)]
    with ResultWriter(tmp_path, Window()) as writer:
        results.write_json(tmp_path, results.RUN_FILE, {"window": {"start": 0.0, "end": None},
                                                        "planned": {"tasks": 3, "calls": 5},
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
    rebuilt, _ = rebuild(tmp_path)
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


def layout_records() -> tuple[list[CallRecord], list[TaskRecord]]:
    """Calls with cached tokens, a failure and a cancellation; two task classes and a sub-task."""
    calls = [call("a", 0, 0.0, 0.1, 0.5, cls="x"), call("a", 1, 1.0, 0.2, 0.7, cls="x"),
             call("b", 0, 0.5, 0.3, 0.4, cls="y"), call("c", 0, 0.6, 0.0, 0.1, ok=False, error="http_5xx"),
             call("c", 0, 0.8, 0.0, 0.1, ok=False, error="cancelled"), call("a-sub", 0, 0.2, 0.05, 0.2, cls="x")]
    calls = [c if not c.ok else CallRecord(**{**results.record_dict(c), "cached_tokens": 64}) for c in calls]
    tasks = [task("a", 0.0, 1.7, cls="x"), task("b", 0.5, 0.9, cls="y"), task("c", 0.6, 0.9, ok=False),
             task("a-sub", 0.2, 0.4, cls="x", parent="a")]
    return calls, tasks


def test_summary_json_keeps_its_keys_and_their_order():
    calls, tasks = layout_records()
    slo = Slo(ttft_ms=PercentileTarget(p99=250), tpot_ms=PercentileTarget(p50=20, p99=60),
              task_s=PercentileTarget(p90=1.5))
    summary, _ = summarize(calls, tasks, slo=slo, planned={"tasks": 4, "calls": 6, "subtasks": 1})
    data = summary.to_dict()
    assert list(data) == TOP_KEYS
    assert list(data["window"]) == ["start", "end"] and list(data["client_lag_ms"]) == ["mean", "p50", "p99", "max"]
    assert list(data["calls"]) == CALL_KEYS and list(data["tasks"]) == TASK_KEYS
    assert list(data["tasks"]["completion_time_s"]) == TIME_KEYS
    assert list(data["tasks"]["breakdown_s"]) == BREAKDOWN_KEYS
    assert list(data["tasks"]["by_class"]) == ["default", "x", "y"]
    assert all(list(entry) == CLASS_KEYS for entry in data["tasks"]["by_class"].values())
    assert list(data["slo"]) == SLO_KEYS
    assert list(data["slo"]["tpot_ms"]) == ["percentiles", "item_bound", "met"]
    assert list(data["slo"]["tpot_ms"]["percentiles"]) == ["p50", "p99"]
    assert list(data["slo"]["tpot_ms"]["percentiles"]["p99"]) == ["bound", "measured", "met"]
    # values from the records
    ok = [c for c in calls if c.ok]
    assert data["total_cached_tokens"] == 64 * len(ok)
    assert data["duration"] == pytest.approx(max(c.end for c in calls))
    assert data["errors"] == {"http_5xx": 1, "cancelled": 1}
    assert data["calls"]["not_done"] == 6 - len({(c.task_id, c.call_index) for c in ok})
    assert data["tasks"]["not_started"] == 4 - 3 and data["tasks"]["sub_tasks_finished"] == 1
    done = [t for t in tasks if t.ok and t.parent_id is None]
    assert data["tasks"]["breakdown_s"]["decode"] == pytest.approx(
        sum(t.time_in_calls - t.time_in_ttft for t in done) / len(done))
    assert data["slo"]["calls_meeting_ttft"] == pytest.approx(sum(c.ttft <= 0.25 for c in ok) / len(ok))
    # HdrHistogram's percentiles are nearest-rank: the value at or above that share of the counts
    p50 = float(np.percentile([c.latency for c in ok], 50, method="inverted_cdf"))
    assert data["p50_e2el_ms"] == pytest.approx(1000 * p50, rel=1e-3)


def test_parts_left_out_are_not_written():
    calls, tasks = layout_records()
    calls = [CallRecord(**{**results.record_dict(c), "cached_tokens": None}) for c in calls]
    data = summarize(calls, tasks)[0].to_dict()
    assert list(data) == [k for k in TOP_KEYS if k != "total_cached_tokens"]
    left_out = ("judged", "not_started", "planned", "goodput_per_hour", "slo_met_share")
    assert list(data["calls"]) == CALL_KEYS[:-2] and list(data["tasks"]) == [k for k in TASK_KEYS if k not in left_out]
    assert data["slo"] == {} and "goodput_per_hour" not in data["tasks"]["by_class"]["x"]


def test_a_summary_json_loads_back_to_the_same_json(tmp_path):
    calls, tasks = layout_records()
    summary, _ = summarize(calls, tasks, slo=Slo(ttft_ms=PercentileTarget(p99=250)), planned={"tasks": 4, "calls": 6})
    summary.scenario, summary.result_dir = "layout", str(tmp_path)
    summary.server = {"scraped": False, "interval_s": None, "note": "no /metrics"}
    results.write_json(tmp_path, results.SUMMARY_FILE, summary.to_dict())
    written = (tmp_path / results.SUMMARY_FILE).read_text()
    loaded = load_summary(tmp_path)
    assert json.dumps(loaded.to_dict(), indent=1) == written
    assert loaded.ttft.p99_9 == summary["p99.9_ttft_ms"] and loaded.slo.ttft_ms.percentiles["p99"].bound == 250
    # a summary.json with a few figures, or keys this version does not know, loads and dumps as it was
    partial = {"p50_ttft_ms": 20.0, "tasks": {"by_class": {"x": {"completed": 2}}}, "newer_figure": 1}
    loaded = Summary.model_validate(partial)
    assert loaded.to_dict() == partial and loaded.ttft.p50 == 20.0 and loaded.tasks.by_class["x"].completed == 2
    (tmp_path / results.SUMMARY_FILE).write_text(json.dumps({"tasks": {"completed": "many"}}))
    with pytest.raises(InputError, match="bad summary"):
        load_summary(tmp_path)


def test_the_recorder_finishes_the_folder_as_every_executor_does(tmp_path):
    calls, tasks = layout_records()
    window, planned = Window(0.0, None), {"tasks": 4, "calls": 6, "subtasks": 1}
    plan = RunPlan(workload=Workload(()), folder=tmp_path, window=window, planned=planned)
    recorder = Recorder(plan)
    recorder.describe(simulated=True)
    with recorder.writer() as writer:
        for c in calls:
            writer.call(c)
        for t in tasks:
            writer.task(t)
    info = results.read_json(tmp_path, results.RUN_FILE)
    assert list(info) == ["simulated", "started_at", "window", "planned", "fingerprint"]
    assert info["planned"] == planned
    summary = recorder.finish(Outcome(DriverResult("completed", 4, 0, 1.0), None,
                                      simulation=SimulationStats(profile="p", steps=3)))
    assert list(summary.to_dict())[-2:] == ["simulation", "result_dir"]
    assert json.loads((tmp_path / results.SUMMARY_FILE).read_text()) == json.loads(json.dumps(summary.to_dict()))
    assert summary.to_dict() == {**summarize(calls, tasks, planned=planned)[0].to_dict(),
                                 "simulation": {"profile": "p", "steps": 3}, "result_dir": str(tmp_path)}
    assert H.load(tmp_path / results.HISTOGRAMS_FILE)["task_completion[x]"].get_total_count() == 1
