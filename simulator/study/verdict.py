"""What a study's results mean for its exit code with ``--fail-on-slo``: the configs that missed the SLO."""

from __future__ import annotations

from .model import Study


def slo_misses(study: Study) -> list[str]:
    """One line per config that missed the SLO: at the ranking load (a repeat there that did not hold
    every SLO target), or, without sweep points there, a capacity search in which no rate held; and one
    per config whose capacity missed the SLO on held-out traffic (`capacity.holdout`)."""
    missed = []
    for c in study.configs:
        at = [p for p in c.points if p.source == "sweep" and p.load is not None and c.at_load is not None
              and abs(p.load - c.at_load) <= 1e-9 * max(1.0, c.at_load)]
        if at:
            bad = [p for p in at if p.slo_met is False]
            if bad:
                missed.append(f"{c.name} at {c.at_load:g} ({study.axis_unit or 'load'}) in {len(bad)} of {len(at)} "
                              "repeats")
        elif c.capacity is not None and c.capacity.status == "below_range":
            missed.append(f"{c.name}: no rate of its capacity search held")
        check = c.holdout
        if check is not None and check.verdict in ("missed", "held_below"):
            missed.append(f"{c.name}: {check.answer}")
    return missed
