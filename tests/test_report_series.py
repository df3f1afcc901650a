"""The numbers behind the report's figures: CDF points of an HdrHistogram, counts in flight per time
bin, /metrics series binned, the breakdown of task time, and the workload fingerprint."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.metrics import histograms as H
from simulator.metrics.folder import fingerprint
from simulator.metrics.records import TaskRecord
from simulator.metrics.results import Window
from simulator.metrics.summary import summarize
from simulator.report import series
from simulator.report.folder_data import Scrapes, TaskColumns
from simulator.workload import Call, Provenance, Task, Workload


def test_cdf_points_are_the_histograms_percentiles():
    rng = np.random.default_rng(1)
    h = H.from_seconds(rng.lognormal(-3, 1.2, 50_000))
    every, every_share = series.cdf(h, 1000.0, max_points=10**6)
    values, shares = series.cdf(h, 1000.0)
    assert every.size > series.MAX_CDF_POINTS >= values.size - 2
    for xs, ps, tolerance in ((every, every_share, 0.0), (values, shares, 0.02)):
        assert np.all(np.diff(xs) > 0) and ps[-1] == 1.0
        for p in (50.0, 90.0, 99.0, 99.9):
            at = xs[np.searchsorted(ps, p / 100 - 1e-12)]  # the first point at or past the percentile
            assert at == pytest.approx(h.get_value_at_percentile(p) / 1000, rel=tolerance, abs=1e-12)
    assert values[-1] == h.get_max_value() / 1000  # thinning keeps the largest value


def test_in_flight_means_and_peaks_per_bin():
    # [0, 2), [1, 3), [1.5, 1.6): one, then two, three for a tenth of a second, two, one, none
    occ = series.occupancy([0.0, 1.0, 1.5], [2.0, 3.0, 1.6], np.array([0.0, 1.0, 2.0, 3.0, 4.0]))
    assert occ.mean.tolist() == pytest.approx([1.0, 2.1, 1.0, 0.0])
    assert occ.peak.tolist() == [1.0, 3.0, 1.0, 0.0]
    back_to_back = series.occupancy([0.0, 1.0], [1.0, 2.0], np.array([0.0, 2.0]))
    assert back_to_back.peak.tolist() == [1.0]  # an end and a start at the same time overlap nowhere


def test_scrape_series_are_binned_and_the_hit_share_taken_from_counter_increases(tmp_path):
    path = tmp_path / "server_metrics.jsonl"
    lines = [f'{{"t": {t}, "num_requests_waiting": {t % 4}, "prefix_cache_queries": {100 * t}, '
             f'"prefix_cache_hits": {25 * t}}}' for t in range(1000)]
    path.write_text("\n".join(lines) + "\n")
    scrapes = Scrapes.read(path)
    t, v = series.series(scrapes, "num_requests_waiting", np.linspace(0, 1000, 11))
    assert t.size == 10 and v.tolist() == pytest.approx([1.5] * 10)
    _, share = series.hit_share_series(scrapes, np.linspace(0, 1000, 11))
    assert share.tolist() == pytest.approx([0.25] * 10)
    assert series.series(scrapes, "kv_cache_usage_perc") is None


def test_breakdown_per_class_adds_up_to_the_summarys():
    tasks = [TaskRecord(f"t{i}", "ab"[i % 2], arrival=float(i), end=float(i) + 10 + i, ok=i != 3, calls=3,
                        calls_planned=3, time_in_calls=2.0 + i, time_in_gaps=5.0, client_lag=0.1, time_in_ttft=0.5)
             for i in range(6)]
    summary, _ = summarize([], tasks, window=Window(1.0, None))
    columns = TaskColumns.read(tasks)
    counted = series.counted(columns, Window(1.0, None))
    assert counted.tolist() == [False, True, True, False, True, True]
    parts = series.breakdown(columns, counted)
    for key, _ in series.BREAKDOWN_PARTS:
        assert parts[key] == pytest.approx(getattr(summary.tasks.breakdown_s, key))
    by_class = series.breakdown_by_class(columns, Window(1.0, None))
    assert set(by_class) == {"a", "b"} and by_class["a"]["total"] == pytest.approx((12 + 14) / 2)


def test_fingerprint_follows_the_tasks_not_where_they_came_from():
    def workload(tokens: int, source: str) -> Workload:
        return Workload((Task("t", (Call(100, tokens, hash_ids=(1, 2), block_size=16),)),), (Provenance(source, "native"),))

    settings = {"run": {"seed": 0, "output": "a", "scrape_interval": 1.0}, "slo": {"task_s": {"p90": 5}}}
    same = fingerprint(workload(10, "here.jsonl"), settings)
    assert same == fingerprint(workload(10, "elsewhere.jsonl"), {**settings, "run": {"seed": 0, "output": "b"}})
    assert same["workload"] != fingerprint(workload(11, "here.jsonl"), settings)["workload"]
    assert same["run"] != fingerprint(workload(10, "x"), {**settings, "run": {"seed": 1}})["run"]
    assert same["slo"] != fingerprint(workload(10, "x"), {**settings, "slo": {}})["slo"]
