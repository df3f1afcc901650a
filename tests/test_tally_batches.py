"""The call histograms of a `RunTally` are recorded in batches (`histograms.record_many_seconds`):
they end exactly as recording each value on its own with `histograms.record_seconds` leaves them (every
bucket, total count, min and max, the encoded form), counts above one included (the approximate ITL);
whatever reads them (`hist`, packing and merging a tally) sees every value counted so far."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from simulator.metrics import histograms as H
from simulator.metrics import tally as tally_module
from simulator.metrics.records import CallRecord
from simulator.metrics.results import Window
from simulator.metrics.slo import PercentileTarget, Slo
from simulator.metrics.tally import CALL_HISTOGRAMS, RunTally
from simulator.scale import merge

WINDOW = Window(0.5, None)
SLO = Slo(ttft_ms=PercentileTarget(p50=30))


def same(a, b) -> None:
    """Two histograms equal bucket for bucket, in total, min, max and encoded form."""
    assert list(a.counts) == list(b.counts)
    assert (a.get_total_count(), a.get_min_value(), a.get_max_value()) == \
        (b.get_total_count(), b.get_min_value(), b.get_max_value())
    assert a.encode() == b.encode()


def seconds(rng: np.random.Generator, n: int) -> np.ndarray:
    """Durations over the whole range: below a microsecond (clamped up), halves of a microsecond (rounded
    to even), past a day (clamped down), negative, and lognormal ones between."""
    values = rng.lognormal(-4, 2.5, n)
    values[::17] = rng.integers(0, 2_000_000, values[::17].size) / 1e6 + 0.5e-6
    values[::29] = rng.uniform(0, 1e-6, values[::29].size)
    values[::31] = 2 * 86400.0
    values[::37] = -0.25
    values[::41] = 0.0
    return values


def test_many_values_recorded_at_once_equal_them_recorded_one_by_one():
    rng = np.random.default_rng(11)
    values = seconds(rng, 20_000)
    counts = rng.integers(1, 5000, values.size)
    for weights in (None, counts):
        one = H.new_histogram()
        many = H.new_histogram()
        H.record_seconds(one, 0.25)  # something there before: its min and max are kept
        H.record_seconds(many, 0.25)
        for k, value in enumerate(values.tolist()):
            H.record_seconds(one, value, 1 if weights is None else int(weights[k]))
        H.record_many_seconds(many, values[:7_000], None if weights is None else weights[:7_000])
        H.record_many_seconds(many, values[7_000:].tolist(), None if weights is None else weights[7_000:].tolist())
        H.record_many_seconds(many, [])
        same(many, one)


def test_a_duration_that_is_not_a_number_fails_as_it_did_one_by_one():
    with pytest.raises(ValueError):
        H.record_seconds(H.new_histogram(), float("nan"))
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError):
            H.record_many_seconds(H.new_histogram(), [0.1, bad])
    with pytest.raises(ValueError):
        H.record_many_seconds(H.new_histogram(), [0.1, 0.2], [1])


def calls(seed: int, n: int) -> list[CallRecord]:
    """Call records: some before the window, some failed, some without a first token or with one token,
    durations over the histograms' whole range, mean gaps counted up to thousands of times."""
    rng = np.random.default_rng(seed)
    durations = seconds(rng, 4 * n)
    out = []
    for i in range(n):
        send = float(rng.uniform(0, 10))
        ttft, latency, lag, gap = (abs(float(v)) for v in durations[4 * i: 4 * i + 4])
        tokens = int(rng.choice([0, 1, 2, int(rng.integers(3, 5000))]))
        ok = rng.random() > 0.1
        first = ok and i % 13 != 0
        out.append(CallRecord(
            task_id=f"t{i // 3}", task_class="x", call_index=i % 3, attempt=0, intended_send=send,
            actual_send=send + lag, end=send + lag + latency + ttft, ok=ok, ttft=ttft if first else None,
            itl_count=max(0, tokens - 1) if ok else 0, itl_mean=gap if ok and i % 11 else None,
            input_tokens=10, output_tokens=tokens if ok else 0, error_class=None if ok else "http_5xx"))
    return out


def one_by_one(records: list[CallRecord]) -> dict:
    """The call histograms as the tally recorded them before batches: a value at a time."""
    hist = {name: H.new_histogram() for name in CALL_HISTOGRAMS}
    for c in records:
        if not WINDOW.contains(c.intended_send):
            continue
        H.record_seconds(hist["client_lag"], c.client_lag)
        if not c.ok:
            continue
        if c.ttft is not None:
            H.record_seconds(hist["ttft"], c.ttft)
        if c.tpot is not None:
            H.record_seconds(hist["tpot"], c.tpot)
        H.record_seconds(hist["e2el"], c.latency)
        if c.itl_count and c.itl_mean is not None:
            H.record_seconds(hist["itl_approx"], c.itl_mean, c.itl_count)
    return hist


@pytest.mark.parametrize("batch", [7, 1000, tally_module.BATCH])
def test_the_tallys_batched_histograms_equal_those_recorded_one_by_one(monkeypatch, batch):
    monkeypatch.setattr(tally_module, "BATCH", batch)
    records = calls(5, 3000)
    expected = one_by_one(records)
    assert expected["itl_approx"].get_total_count() > expected["e2el"].get_total_count()  # counts above one
    tally = RunTally(WINDOW, SLO).feed(records, [])
    assert set(tally.hist) == set(expected)
    for name, histogram in expected.items():
        assert histogram.get_total_count() > 0
        same(tally.hist[name], histogram)
    hists = tally.histograms()
    same(hists["itl"], expected["itl_approx"])
    same(hists["ttft"], expected["ttft"])


def test_packing_and_merging_a_tally_record_its_gathered_values_first():
    records = calls(8, 2000)
    expected = one_by_one(records)
    packs = []
    for shard in range(2):
        tally = RunTally(WINDOW, SLO).feed(records[shard::2], [])
        assert any(tally._pending.values())  # values gathered, not yet in its histograms
        packed = merge.pack(tally)
        assert not set(packed) & merge.BUFFERS
        packs.append(pickle.loads(pickle.dumps(packed)))
    target = RunTally(WINDOW, SLO).feed(records[:10], [])  # values of its own waiting when merged into
    merge.merge_into(target, packs[0])
    merge.merge_into(target, packs[1])
    with_first = one_by_one(records[:10])
    for name, histogram in expected.items():
        histogram.add(with_first[name])
        same(target.hist[name], histogram)
    merged = merge.merged(WINDOW, SLO, packs)
    for name, histogram in one_by_one(records).items():
        same(merged.hist[name], histogram)
