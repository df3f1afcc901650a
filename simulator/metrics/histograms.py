"""Latency histograms: HdrHistograms in microseconds with 3 significant digits, saved encoded.

The encoded form (compressed, base64) is HdrHistogram's standard one, so other HdrHistogram tools
read it and histograms from several runs or shards merge with ``add``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np
from hdrh.histogram import HdrHistogram

LOWEST_US = 1
HIGHEST_US = 24 * 3600 * 1_000_000
"""A day: nothing an agent run measures is longer."""
SIGNIFICANT_DIGITS = 3
PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)


def new_histogram() -> HdrHistogram:
    """An empty latency histogram (microseconds)."""
    return HdrHistogram(LOWEST_US, HIGHEST_US, SIGNIFICANT_DIGITS)


def record_seconds(histogram: HdrHistogram, seconds: float, count: int = 1) -> None:
    """Add a duration in seconds (clamped into the histogram's range)."""
    us = int(round(seconds * 1e6))
    histogram.record_value(min(max(us, LOWEST_US), HIGHEST_US), count)


def record_many_seconds(histogram: HdrHistogram, seconds: Sequence[float] | np.ndarray,
                        counts: Sequence[int] | np.ndarray | None = None) -> None:
    """Add many durations in seconds, value k counted `counts[k]` times (once each without `counts`):
    the histogram ends exactly as `record_seconds(histogram, seconds[k], counts[k])` called on each
    leaves it (same counts in every bucket, total count, min and max), at a cost of a few numpy passes
    rather than a Python call per value (the values' buckets are worked out at once, as HdrHistogram's
    `_counts_index_for` does for one, and their counts added to the histogram's counts array)."""
    us = np.rint(np.asarray(seconds, dtype=np.float64) * 1e6)
    if us.size == 0:
        return
    if not np.isfinite(us).all():
        raise ValueError("cannot record a duration that is NaN or infinite")  # as `record_seconds`
    us = np.clip(us, LOWEST_US, HIGHEST_US).astype(np.int64)
    h = histogram
    # bit length of (value | sub_bucket_mask): frexp's exponent, exact below 2**53
    bits = np.frexp((us | h.sub_bucket_mask).astype(np.float64))[1].astype(np.int64)
    bucket = bits - h.unit_magnitude - (h.sub_bucket_half_count_magnitude + 1)
    index = ((bucket + 1) << h.sub_bucket_half_count_magnitude) + (us >> (bucket + h.unit_magnitude)) \
        - h.sub_bucket_half_count
    if counts is None:
        added = np.bincount(index, minlength=h.counts_len).astype(np.uint64)
        total = int(us.size)
    else:
        weights = np.asarray(counts, dtype=np.int64)
        if weights.shape != us.shape:
            raise ValueError(f"{weights.size} counts for {us.size} values")
        added = np.zeros(h.counts_len, dtype=np.uint64)
        np.add.at(added, index, weights.astype(np.uint64))  # exact (integers), repeated buckets added up
        total = int(weights.sum())
    if added.size != h.counts_len:  # clamped values always fall in range
        raise ValueError("a duration outside the histogram's range")
    counts_array = np.ctypeslib.as_array(h.counts)  # the buffer HdrHistogram's own record_value adds to
    if counts_array.shape == added.shape and counts_array.dtype == added.dtype:
        counts_array += added
        h.total_count += total
    else:  # another layout (a decoded histogram's shorter buffer, ...): through record_value, a bucket at a time
        _, first = np.unique(index, return_index=True)
        for k, value in zip(index[first].tolist(), us[first].tolist()):
            h.record_value(value, int(added[k]))
    h.min_value = min(h.min_value, int(us.min()))
    h.max_value = max(h.max_value, int(us.max()))


def from_seconds(values: Iterable[float]) -> HdrHistogram:
    """A histogram of these durations in seconds."""
    histogram = new_histogram()
    record_many_seconds(histogram, list(values))
    return histogram


def mean_std(histogram: HdrHistogram) -> tuple[float, float]:
    """Mean and standard deviation (value units), as HdrHistogram defines them (each count at the middle
    of its bucket), computed over the non-empty buckets only: the library's own loops over every bucket."""
    counts = np.ctypeslib.as_array(histogram.counts)
    index = np.flatnonzero(counts)
    if index.size == 0:
        return 0.0, 0.0
    weights = counts[index].astype(np.float64)
    mids = np.empty(index.size, dtype=np.float64)
    for i, k in enumerate(index.tolist()):
        low = histogram.get_lowest_equivalent_value(histogram.get_value_from_index(k))
        high = histogram.get_highest_equivalent_value(low)
        mids[i] = low + ((high + 1 - low) >> 1)
    mean = float(np.average(mids, weights=weights))
    return mean, float(np.sqrt(np.average((mids - mean) ** 2, weights=weights)))


def stats_ms(histogram: HdrHistogram) -> dict[str, float]:
    """mean, std, median and percentiles of a histogram, in milliseconds (zeros when empty)."""
    empty = histogram.get_total_count() == 0
    mean, std = mean_std(histogram)
    out = {
        "mean": mean / 1000,
        "std": std / 1000,
        "median": 0.0 if empty else histogram.get_value_at_percentile(50.0) / 1000,
        "max": 0.0 if empty else histogram.get_max_value() / 1000,
    }
    for p in PERCENTILES:
        out[percentile_name(p)] = 0.0 if empty else histogram.get_value_at_percentile(p) / 1000
    return out


def percentile_name(p: float) -> str:
    """'p99', 'p99.9' (vLLM's naming)."""
    return f"p{p:g}"


def encode_all(histograms: Mapping[str, HdrHistogram]) -> dict[str, str]:
    """{name: encoded} for every non-empty histogram."""
    return {name: h.encode().decode("ascii") for name, h in histograms.items() if h.get_total_count()}


def decode_all(encoded: Mapping[str, str]) -> dict[str, HdrHistogram]:
    """The inverse of `encode_all`."""
    return {name: HdrHistogram.decode(value) for name, value in encoded.items()}


def save(path: Path, histograms: Mapping[str, HdrHistogram]) -> None:
    """Write histograms.json atomically (a crash never leaves a half-written file)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(encode_all(histograms), indent=1, sort_keys=True))
    tmp.replace(path)


def load(path: Path) -> dict[str, HdrHistogram]:
    """Read a histograms.json."""
    return decode_all(json.loads(path.read_text()))
