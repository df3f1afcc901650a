"""A shard's `RunTally` packed to travel between processes, and tallies merged into one.

What travels is the tally's counters and its HdrHistograms in their standard encoded form (compressed,
a few kB each), never the samples. Merging adds counters and histograms (HdrHistogram's ``add``), so
the merged histograms equal those of one tally fed every shard's records.

Packing walks the tally's attributes by type (numbers, counters, histograms, the tally's own small
dataclasses, dicts of those) and refuses any other type, so a field added to `RunTally` later either
merges by these rules or fails loudly here, never silently.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any, Iterable, Mapping

from hdrh.histogram import HdrHistogram

from ..metrics.results import Window
from ..metrics.slo import Slo
from ..metrics.tally import RunTally

SETTINGS = frozenset({"window", "slo", "_task_bound", "_ttft_bound", "_tpot_bound"})
"""What every shard's tally shares (from the run's settings): not merged."""
BUFFERS = frozenset({"_pending", "_itl_weights"})
"""Values a tally gathers before they go into its histograms: packing and merging record them first
(`RunTally.flush`), so they are empty then and not packed."""
LATEST = frozenset({"latest_end"})
"""Numbers merged by taking the largest (the others add up)."""

Packed = dict[str, Any]


def pack(tally: RunTally) -> Packed:
    """A tally's state in a form that pickles small: histograms encoded, dataclasses as dicts."""
    tally.flush()
    return {name: _pack(value, name) for name, value in vars(tally).items()
            if name not in SETTINGS and name not in BUFFERS}


def _pack(value: Any, name: str) -> Any:
    if value is None or isinstance(value, (int, float)):
        return value
    if isinstance(value, HdrHistogram):
        return ("hdr", value.encode())
    if isinstance(value, Counter):
        return ("counter", dict(value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return ("fields", type(value), {f.name: _pack(getattr(value, f.name), f.name)
                                        for f in dataclasses.fields(value)})
    if isinstance(value, dict):
        return ("dict", {key: _pack(item, name) for key, item in value.items()})
    raise TypeError(f"RunTally.{name}: cannot merge a {type(value).__name__}; teach simulator.scale.merge")


def merge_into(tally: RunTally, packed: Packed) -> RunTally:
    """Add a packed tally's counts and histograms to `tally` (of the same run settings); returns it."""
    tally.flush()
    for name, value in packed.items():
        setattr(tally, name, _merge(getattr(tally, name), value, name))
    return tally


def _merge(current: Any, packed: Any, name: str) -> Any:
    if packed is None:
        return current
    if isinstance(packed, (int, float)):
        if current is None:
            return packed
        return max(current, packed) if name in LATEST else current + packed
    kind = packed[0]
    if kind == "hdr":
        current.add(HdrHistogram.decode(packed[1]))
    elif kind == "counter":
        current.update(packed[1])
    elif kind == "fields":
        for field, value in packed[2].items():
            setattr(current, field, _merge(getattr(current, field), value, field))
    elif kind == "dict":
        for key, value in packed[1].items():
            if key not in current:
                current[key] = _empty(value)
            current[key] = _merge(current[key], value, name)
    else:
        raise ValueError(f"not a packed tally value: {kind!r}")
    return current


def _empty(packed: Any) -> Any:
    """A zero value of the packed value's type (a class of tasks one shard saw first)."""
    kind = packed[0] if isinstance(packed, tuple) else None
    if kind == "fields":
        return packed[1]()
    if kind == "hdr":
        from ..metrics.histograms import new_histogram  # noqa: PLC0415

        return new_histogram()
    raise ValueError(f"cannot start an empty value from {packed!r:.80}")


def merged(window: Window, slo: Slo, packs: Iterable[Mapping[str, Any]]) -> RunTally:
    """One tally of the run's settings holding every packed tally's counts and histograms."""
    tally = RunTally(window, slo)
    for packed in packs:
        merge_into(tally, dict(packed))
    return tally
