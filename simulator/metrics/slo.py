"""Service-level objectives: percentile targets per call (TTFT, TPOT) and per task (completion time).

A target is a set of percentile bounds, e.g. ``{p99: 2000}`` for "p99 at most 2000 ms". A run meets a
target when every measured percentile is within its bound. For goodput, one item (a call, a task)
meets the target when its own value is within the *per-item bound*: `max` if given, else the bound at
the highest percentile listed.
"""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

PERCENTILE_KEYS = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "p99.9": 99.9}


class PercentileTarget(BaseModel):
    """Upper bounds on percentiles of one measure (in the unit its field name says)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)

    p50: Optional[float] = Field(None, gt=0)
    p90: Optional[float] = Field(None, gt=0)
    p95: Optional[float] = Field(None, gt=0)
    p99: Optional[float] = Field(None, gt=0)
    p999: Optional[float] = Field(None, gt=0, alias="p99.9")
    max: Optional[float] = Field(None, gt=0, description="Per-item bound used for goodput (default: the highest percentile's bound).")

    @model_validator(mode="after")
    def _not_empty(self) -> "PercentileTarget":
        if not self.bounds() and self.max is None:
            raise ValueError("give at least one of p50, p90, p95, p99, p99.9, max")
        return self

    def bounds(self) -> dict[str, float]:
        """{percentile key ('p99', 'p99.9', ...): bound} for the percentiles given."""
        values = {"p50": self.p50, "p90": self.p90, "p95": self.p95, "p99": self.p99, "p99.9": self.p999}
        return {k: v for k, v in values.items() if v is not None}

    def item_bound(self) -> float:
        """The bound one item must meet to count as good."""
        if self.max is not None:
            return self.max
        bounds = self.bounds()
        return bounds[max(bounds, key=PERCENTILE_KEYS.__getitem__)]


class Slo(BaseModel):
    """What the run is judged against: per call TTFT and TPOT (ms), per task completion time (s)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    ttft_ms: Optional[PercentileTarget] = None
    """Time to first token of each call, milliseconds."""
    tpot_ms: Optional[PercentileTarget] = None
    """Time per output token after the first, of each call, milliseconds."""
    task_s: Optional[PercentileTarget] = None
    """Task completion time (intended arrival to last byte of it and its sub-tasks), seconds."""
