"""The capacity search and its CI, the ranking's verdicts (and what one repeat cannot claim), load points,
cost and the quality comparison: the study's arithmetic, on inputs whose answers are known."""

from __future__ import annotations

import math

import pytest

from simulator.scenario import RunSpec
from simulator.study import cost, quality
from simulator.study.capacity import combine, search
from simulator.study.figures import TaskTokens
from simulator.study.load import LoadPoint, apply
from simulator.transforms import task_rate
from simulator.study.capacity import HELD, MISSED, UNTESTABLE
from simulator.study.ranking import Value, rank
from simulator.study.schema import ApiPrices, CostSpec, QualitySpec
from simulator.workload import Call, Task, Workload


def threshold_probe(capacity: float, log: list[float], testable: float = math.inf):
    """A server that holds the SLO up to `capacity`, under a workload that can test rates up to `testable`."""
    def probe(rate: float) -> str:
        log.append(rate)
        if rate > capacity:
            return MISSED
        return HELD if rate <= testable else UNTESTABLE
    return probe


def test_search_brackets_then_bisects_to_the_precision():
    log: list[float] = []
    s = search(threshold_probe(13.0, log), low=2.0, high=8.0, precision=0.02, max_probes=30)
    assert s.status == "ok"
    assert s.low <= 13.0 < s.high and s.high <= s.low * 1.02
    # bracketing went up from high by doubling: 2 (held), 8 (held), 16 (failed)
    assert log[:3] == [2.0, 8.0, 16.0]
    assert abs(s.estimate - 13.0) / 13.0 < 0.01


def test_search_goes_down_when_low_fails_and_reports_ranges():
    s = search(threshold_probe(0.3, []), low=2.0, high=8.0, precision=0.05, max_probes=30)
    assert s.status == "ok" and s.low <= 0.3 < s.high
    below = search(threshold_probe(1e-9, []), low=2.0, high=8.0, precision=0.05, max_probes=4)
    assert below.status == "below_range" and below.low is None and below.estimate is None
    # an SLO no load meets: halving stops at the lowest rate allowed, well before the probe budget
    log: list[float] = []
    floor = search(threshold_probe(1e-9, log), low=2.0, high=8.0, precision=0.05, max_probes=30, min_rate=0.2)
    assert floor.status == "below_range" and log == [2.0, 1.0, 0.5, 0.25]
    above = search(threshold_probe(1e9, []), low=2.0, high=8.0, precision=0.05, max_probes=4)
    assert above.status == "above_range" and above.high is None


def test_search_stops_at_a_failed_point():
    calls = []

    def probe(rate):
        calls.append(rate)
        return None if len(calls) == 2 else (HELD if rate < 5 else MISSED)

    s = search(probe, low=1.0, high=4.0, precision=0.05, max_probes=30)
    assert s.status == "failed" and len(calls) == 2


def test_capacity_ci_holds_the_bracket_and_the_spread_of_repeats():
    one = combine([search(threshold_probe(10.0, []), 1.0, 4.0, 0.04, 40)], confidence=0.9)
    s = one.searches[0]
    # one repeat: no confidence interval; the bisection's half-width is reported as its resolution
    assert one.ci is None and one.rate == pytest.approx(s.estimate)
    assert one.to_dict()["ci_per_s"] is None and one.to_dict()["resolution_per_s"] == pytest.approx((s.high - s.low) / 2)
    searches = [search(threshold_probe(c, []), 1.0, 4.0, 0.01, 40, repeat=i) for i, c in enumerate((9.0, 10.0, 11.0))]
    many = combine(searches, confidence=0.9)
    assert many.rate == pytest.approx(10.0, rel=0.01)
    low, high = many.ci
    assert low < 9.0 and high > 11.0  # t interval of 3 repeats (t=2.92) around their mean, plus resolution
    assert many.to_dict()["per_min"] == pytest.approx(many.rate * 60)


def test_a_rate_the_workload_cannot_test_bounds_the_search_and_is_no_capacity():
    # a server that would hold up to 100/s, a workload whose arrivals are a burst above 6/s: the search
    # stops below the untestable rates and says the capacity is at least the highest rate tested
    log: list[float] = []
    s = search(threshold_probe(100.0, log, testable=6.0), low=2.0, high=8.0, precision=0.05, max_probes=30)
    assert s.status == "above_range" and s.estimate is None
    assert s.low <= 6.0 < s.ceiling <= s.low * 1.05 and max(log) == 8.0
    capacity = combine([s], 0.9)
    assert capacity.rate is None and capacity.at_least == s.low and capacity.untestable_from == s.ceiling
    # a server that fails below the untestable rates is bracketed as usual
    s = search(threshold_probe(3.0, [], testable=6.0), low=2.0, high=8.0, precision=0.05, max_probes=30)
    assert s.status == "ok" and s.low <= 3.0 < s.high


def test_load_rate_rescales_arrivals_and_window_and_keeps_the_tasks():
    tasks = tuple(Task(id=f"t{i}", calls=(Call(10, 5),), arrival=10.0 + 2.0 * i) for i in range(11))
    workload = Workload(tasks)
    assert task_rate(workload) == pytest.approx(0.5)
    loaded = apply(workload, RunSpec(warmup=20.0, cooldown=4.0), LoadPoint("rate", 2.0), 0.5)
    assert loaded.offered_rate == pytest.approx(2.0)
    arrivals = [t.arrival for t in loaded.workload.tasks]
    assert arrivals[0] == 10.0 and arrivals[1] == pytest.approx(10.5) and len(arrivals) == 11
    assert loaded.run.warmup == pytest.approx(12.5) and loaded.run.cooldown == pytest.approx(1.0)
    closed = apply(workload, RunSpec(), LoadPoint("max_in_flight", 3), 0.5)
    assert closed.run.max_in_flight == 3 and closed.workload is workload
    assert LoadPoint("rate", 1 / 3).label() == "rate-0.333333"


def test_ranking_calls_overlapping_samples_within_noise():
    values = {
        "a": Value(100.0, [99.0, 100.0, 101.0]),
        "b": Value(99.5, [98.0, 100.5, 100.0]),
        "c": Value(50.0, [49.0, 50.0, 51.0]),
    }
    order, comparisons = rank(values, "goodput", 0.9)
    assert order == ["a", "b", "c"]
    first, second = comparisons
    assert first.tested and first.significant is False and "within noise" in first.verdict
    assert second.significant and second.ci[0] > 0 and second.verdict.startswith("b ahead of c")


def test_one_repeat_gives_no_interval_and_no_significance():
    # capacities 9.77 and 9.5 tasks/s from one repeat each: the order is the measured one, untested
    values = {"fp16-state": Value(9.77 * 3600, [9.77 * 3600], resolution=0.1 * 3600),
              "mtp1": Value(9.5 * 3600, [9.5 * 3600], resolution=0.1 * 3600)}
    for v in values.values():
        assert v.with_ci(0.9).ci is None
    order, (comparison,) = rank(values, "goodput", 0.9)
    assert order == ["fp16-state", "mtp1"]
    assert comparison.tested is False and comparison.significant is None and comparison.ci is None
    assert "not tested for significance" in comparison.verdict and "ahead of" in comparison.verdict
    assert "e+" not in comparison.verdict and "+972 tasks/h" in comparison.verdict


def test_a_bound_is_not_ranked_as_settled_against_a_value_it_may_pass():
    values = {"a": Value(50.0, [50.0, 50.0, 50.0]), "b": Value(40.0, [40.0, 40.0, 40.0], bound="at_least")}
    _, (comparison,) = rank(values, "goodput", 0.9)
    assert comparison.tested is False and "not settled" in comparison.verdict


def test_ranking_of_lower_is_better_percentiles():
    fast = [1.0 + 0.01 * i for i in range(3)]
    slow = [2.0 + 0.01 * i for i in range(3)]
    values = {"slow": Value(2.01, slow), "fast": Value(1.01, fast)}
    order, (cmp,) = rank(values, "p95_task", 0.9)
    assert order == ["fast", "slow"] and cmp.significant and cmp.difference == pytest.approx(1.0)


def test_cost_per_task_both_ways():
    spec = CostSpec(gpu_hour=6.0, gpus=2, api=ApiPrices(input=3.0, cached_input=0.3, output=15.0))
    assert cost.self_hosted_per_task(spec, 120.0) == pytest.approx(0.1)
    tokens = TaskTokens(tasks=2, input=2_000_000, cached=1_000_000, output=100_000)
    # (1M x 3 + 1M x 0.3 + 0.1M x 15) / 1e6 = 4.8 dollars for 2 tasks
    assert cost.api_per_task(spec, tokens) == pytest.approx(2.4)
    assert cost.self_hosted_per_task(CostSpec(api=spec.api), 120.0) is None


def test_api_tokens_count_what_the_previous_turn_sent_as_cached():
    from simulator.workload import SubTask

    first = Call(64, 10, hash_ids=(1, 2, 3, 4), block_size=16)
    second = Call(96, 20, hash_ids=(1, 2, 3, 4, 5, 6), block_size=16)  # the first's 64 tokens again + 32 new
    third = Call(80, 5, hash_ids=(1, 2, 9, 9, 9), block_size=16)  # shares 2 blocks with the second
    sub = Task(id="s", calls=(Call(40, 4, hash_ids=(1, 2), block_size=16),))  # a sub-agent's own first call
    task = Task(id="t", calls=(first, second, third), subtasks=(SubTask(after_call=0, task=sub),))
    planned = cost.api_tokens(Workload((task, Task(id="u", calls=(Call(8, 1),)))))
    t = planned["t"]
    assert (t.input, t.cached, t.output) == (64 + 96 + 80 + 40, 0 + 64 + 32 + 0, 10 + 20 + 5 + 4)
    total = cost.api_tokens_of(planned, ["t", "u", "gone"])
    assert total.tasks == 2 and total.input == t.input + 8 and total.cached == t.cached


def test_quality_compare_flags_changed_outputs_and_moved_logprobs():
    spec = QualitySpec()
    base = [quality.ProbeOutput(["a", "b", "c"], [-1.0, -2.0, -3.0], "tokens")] * 2
    same = [quality.ProbeOutput(["a", "b", "c"], [-1.0, -2.0, -3.0], "tokens")] * 2
    other = [quality.ProbeOutput(["a", "b", "c"], [-1.1, -2.0, -3.0], "tokens"),
             quality.ProbeOutput(["a", "x", "y"], [-1.5, -0.5, -0.1], "tokens")]
    assert quality.compare(base, same, spec)["status"] == "same"
    result = quality.compare(base, other, spec)
    assert result["status"] == "flagged" and result["reason"] == "outputs" and result["identical_share"] == 0.5
    assert result["mean_common_prefix_tokens"] == 2.0
    # |d| over the common prefixes: 0.1, 0, 0 (first probe), 0.5 (second)
    assert result["mean_abs_logprob_delta"] == pytest.approx(0.15)
    # half the outputs identical is enough at flag_below 0.5, but the log probabilities moved too far
    half = QualitySpec(flag_below=0.5)
    assert quality.compare(base, other, half)["reason"] == "logprobs"
    assert quality.compare(base, other, QualitySpec(flag_below=0.5, logprob_tolerance=None))["status"] == "same"
    assert quality.compare(base, other, QualitySpec(flag_below=0.5, logprob_tolerance=0.2))["status"] == "same"

    # identical outputs whose log probabilities moved a little (as bfloat16 does) are flagged; a
    # hair's breadth below the tolerance is not
    nudged = [quality.ProbeOutput(["a", "b", "c"], [-1.003, -2.003, -3.003], "tokens")] * 2
    result = quality.compare(base, nudged, spec)
    assert (result["status"], result["reason"], result["identical_share"]) == ("flagged", "logprobs", 1.0)
    assert result["mean_abs_logprob_delta"] == pytest.approx(0.003)
    barely = [quality.ProbeOutput(["a", "b", "c"], [-1.0009, -2.0009, -3.0009], "tokens")] * 2
    assert quality.compare(base, barely, spec)["status"] == "same"
    # text without log probabilities: outputs only
    text = [quality.ProbeOutput(list("abc"), None, "characters")] * 2
    result = quality.compare(text, text, spec)
    assert result["status"] == "same" and result["mean_abs_logprob_delta"] is None and result["note"]
    assert quality.compare([], other, spec)["status"] == "failed"


def test_gpu_figures_are_measured_where_nvml_is_there_and_said_absent_otherwise():
    from simulator.study.gpu import open_sampler

    assert open_sampler("off") == (None, "GPU figures off (gpu: off)")
    sampler, note = open_sampler("auto")
    if sampler is None:  # no nvidia-ml-py, driver or GPU here: the study says so
        assert note.startswith("GPU figures absent: ")
        return
    sampler.start()
    figures = sampler.stop()
    sampler.close()
    assert figures.gpus >= 1 and figures.memory_used_max_bytes > 0 and figures.energy_j >= 0
