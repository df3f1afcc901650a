"""The sizing answer (`simulator.study.model.Sizing`): the fewest replicas that carry a task rate within
the SLO, read from the fleet configs' capacities and their confidence intervals.

A config carries the rate when its capacity's interval lies at or above it: the interval's lower bound
is at least the rate (where the search went past its range without a failure, every repeat held the SLO
at the rate or higher). It does not when the interval lies below (its upper bound, or where no rate
held the lowest rate that failed, is under the rate). An interval that straddles the rate leaves it
unsure, and one repeat gives no interval at all: such a config is never the answer. The fleet configs
of one router (the same policy and settings, `FleetResult.router`) form a group, and the group's
answer is its config with the fewest replicas that carries the rate; the study's answer is the fewest
over every group (a tie: the lower $ per task at the rate).
"""

from __future__ import annotations

from typing import Optional, Sequence

from .ranking import plain as number
from .model import CapacityResult, ConfigResult, Sizing, SizingGroup, SizingRow
from .schema import SECONDS_PER, CostSpec, SizingSpec


UNIT_SHORT = {"second": "s", "minute": "min", "hour": "h"}


def sizing(spec: Optional[SizingSpec], configs: Sequence[ConfigResult], cost: Optional[CostSpec],
           confidence: Optional[float]) -> Optional[Sizing]:
    """The sizing answer for the fleet configs among `configs` (None: no sizing asked)."""
    if spec is None:
        return None
    rate = spec.rate_per_s
    asked = f"{number(spec.rate)} tasks/{UNIT_SHORT[spec.per]}"
    rows = [_row(c, rate, spec.per, cost) for c in configs if c.fleet is not None]
    groups: dict[str, list[SizingRow]] = {}
    for row in rows:
        groups.setdefault(row.router or "", []).append(row)
    out_groups = [_group(router, members, asked) for router, members in groups.items()]
    carrying = [r for r in rows if r.carries == "yes"]
    best = min(carrying, key=lambda r: (r.replicas, r.cost_per_task_at_rate if r.cost_per_task_at_rate is not None
                                        else float("inf"), rows.index(r))) if carrying else None
    if not rows:
        answer = "no fleet config in the study: sizing compares fleets of one router by their replica count"
    elif best is None:
        answer = f"no fleet config carries {asked} within the SLO: {_none_why(rows)}"
    else:
        answer = (f"{best.replicas} replicas ({best.gpus} GPUs, config {best.config}, router {best.router}) carry "
                  f"{asked} within the SLO: {best.reason}")
    return Sizing(rate=spec.rate, per=spec.per, rate_per_s=rate, rate_per_min=rate * 60, confidence=confidence,
                  rows=rows, groups=out_groups, fewest=best.config if best else None,
                  replicas=best.replicas if best else None, gpus=best.gpus if best else None,
                  cost_per_task_at_rate=best.cost_per_task_at_rate if best else None, answer=answer)


def carries(cap: Optional[CapacityResult], rate: float, per: str = "minute") -> tuple[str, str]:
    """('yes' | 'no' | 'unsure' | 'unknown', why) for a capacity against `rate` tasks per second (see
    the module doc); the why in tasks per `per`."""
    if cap is None:
        return "unknown", "no capacity search"
    scale, unit = SECONDS_PER[per], f"tasks/{UNIT_SHORT[per]}"
    if cap.ci_per_s is not None and all(v is not None for v in cap.ci_per_s):
        low, high = cap.ci_per_s
        ci = f"capacity CI {number(low * scale)}–{number(high * scale)} {unit}"
        if low >= rate:
            return "yes", f"{ci}, at or above the rate"
        if high < rate:
            return "no", f"{ci}, below the rate"
        return "unsure", f"{ci} straddles the rate"
    lows = [s.low for s in cap.repeats]
    if cap.status == "above_range" and lows and all(v is not None for v in lows):
        held = min(lows)  # type: ignore[type-var]
        if held >= rate:  # type: ignore[operator]
            return "yes", f"every repeat held the SLO at {number(held * scale)} {unit} or more (above the range searched)"
    if cap.status == "below_range" and cap.at_most_per_s is not None and cap.at_most_per_s < rate:
        return "no", f"no rate held; {number(cap.at_most_per_s * scale)} {unit} failed"
    if cap.rate_per_s is not None:
        return "unknown", (f"capacity {number(cap.rate_per_s * scale)} {unit} from {cap.estimates} repeat: no "
                           "confidence interval (capacity.repeats 2 or more)")
    return "unknown", f"no capacity ({(cap.status or 'not found').replace('_', ' ')})"


def _row(config: ConfigResult, rate: float, per: str, cost: Optional[CostSpec]) -> SizingRow:
    """A fleet config against the rate (tasks per second)."""
    fleet = config.fleet
    assert fleet is not None
    verdict, why = carries(config.capacity, rate, per)
    price = None
    if verdict == "yes" and cost is not None and cost.gpu_hour is not None:
        price = cost.gpu_hour * fleet.gpus / (rate * 3600)
    return SizingRow(config=config.name, router=fleet.router, replicas=fleet.replicas, gpus=fleet.gpus,
                     carries=verdict, reason=why, cost_per_task_at_rate=price)  # type: ignore[arg-type]


def _group(router: str, rows: list[SizingRow], asked: str) -> SizingGroup:
    """The configs of one router by replica count, and the fewest that carry the rate (`asked`, in words)."""
    ordered = sorted(rows, key=lambda r: r.replicas)
    best = next((r for r in ordered if r.carries == "yes"), None)
    if best is not None:
        answer = f"{best.replicas} replicas (config {best.config}): {best.reason}"
    else:
        answer = f"none carries {asked}: {_none_why(ordered)}"
    return SizingGroup(router=router, configs=[r.config for r in ordered], fewest=best.config if best else None,
                       replicas=best.replicas if best else None, answer=answer)


def _none_why(rows: Sequence[SizingRow]) -> str:
    """Why no config of `rows` is the answer, from their verdicts."""
    counts = {v: sum(1 for r in rows if r.carries == v) for v in ("no", "unsure", "unknown")}
    parts = []
    if counts["no"]:
        parts.append(f"{counts['no']} below it")
    if counts["unsure"]:
        parts.append(f"{counts['unsure']} whose interval straddles it (more repeats narrow it)")
    if counts["unknown"]:
        parts.append(f"{counts['unknown']} without an interval")
    most = max(rows, key=lambda r: r.replicas)
    return (", ".join(parts) or "none measured") + f"; the largest, {most.config} ({most.replicas} replicas): {most.reason}"
