"""study.json's `space`: the config space's candidates with the twin's predicted values, those run live
with their measured values, and the rank correlation between the two (Spearman's, over the live
candidates: a description of those few, not a test)."""

from __future__ import annotations

import math
from typing import Mapping, Optional

from scipy import stats

from .model import RankCorrelation, SpaceCandidate, SpaceLive, SpaceResult
from .ranking import UNITS, Value, order_of
from .search import objectives_of, space_size
from .state import StudyState


def space_result(state: StudyState, measured_order: list[str], measured: Mapping[str, Value],
                 predicted: Mapping[str, Mapping[str, Value]]) -> Optional[SpaceResult]:
    """The space section: `measured_order` and `measured` are the study's ranking and objective values of
    its own configs, `predicted` each objective's values of the space's candidates on the twin (the
    study's objective and every one of `space.objectives`)."""
    space, spec = state.space, state.spec.space
    if space is None or spec is None:
        return None
    objective = state.spec.objective
    objectives = objectives_of(state.spec)
    values = predicted[objective]
    order = order_of({n: v.value for n, v in values.items()}, objective)
    several = len(objectives) > 1
    candidates = [SpaceCandidate(
        name=c.name, settings=c.settings, predicted_value=values[c.name].value if c.name in values else None,
        predicted_rank=order.index(c.name) + 1 if c.name in values else None,
        predicted_bound=values[c.name].bound if c.name in values else "exact",
        predicted_values={o: predicted[o][c.name].value for o in objectives} if several and c.name in values else {},
        infeasible=space.infeasible.get(c.name),
        trial=space.trials.index(c.name) if c.name in space.trials else None,
        on_front=(c.name in space.front) if several else None) for c in space.candidates]
    ran = {n: space.live[n] for n in space.top if space.live.get(n) in state.runs}  # candidate: its live config
    live_order = [n for n in measured_order if n in ran.values()]  # the study's own ranking of them
    live = [SpaceLive(name=n, config=config, predicted_rank=order.index(n) + 1 if n in values else None,
                      measured_rank=live_order.index(config) + 1 if config in live_order else None,
                      predicted_value=values[n].value if n in values else None,
                      predicted_bound=values[n].bound if n in values else "exact",
                      measured_value=measured[config].value if config in measured else None,
                      measured_bound=measured[config].bound if config in measured else "exact", unit=UNITS[objective])
            for n, config in ran.items()]
    size = (math.prod(len(v) for v in spec.grid.values()) if spec.grid is not None else space_size(spec))
    return SpaceResult(
        method=spec.method, grid=spec.grid,
        settings=spec.model_dump(mode="json")["settings"] if spec.settings is not None else None,
        objectives=objectives, top_k=spec.top_k, profile=space.profile, budget=spec.budget,
        seed=spec.seed if spec.method != "grid" else None, evaluations=len(space.runs),
        trials=len(space.trials) if spec.method != "grid" else None,
        repeated=len(space.trials) - len(set(space.trials)) if spec.method != "grid" else None,
        infeasible=len(space.infeasible), space_size=size, candidates=candidates, front=list(space.front),
        top=list(space.top), live=live, rank_correlation=rank_correlation(live, objective) if live else None)


def _unsettled(live: list[SpaceLive], side: str) -> list[str]:
    """The candidates whose place in the order of their `side` values ('predicted' or 'measured') a bound
    leaves open: next to a neighbour it could pass ('at least' below it, 'at most' above it)."""
    valued = sorted((c for c in live if getattr(c, f"{side}_value") is not None),
                    key=lambda c: getattr(c, f"{side}_value"), reverse=True)
    out = []
    for high, low in zip(valued, valued[1:]):
        if getattr(high, f"{side}_bound") == "at_most" or getattr(low, f"{side}_bound") == "at_least":
            out += [high.name, low.name]
    return out


def rank_correlation(live: list[SpaceLive], objective: str) -> RankCorrelation:
    """Spearman's rho of the predicted against the measured values of the live candidates with both."""
    pairs = [(c.predicted_value, c.measured_value) for c in live
             if c.predicted_value is not None and c.measured_value is not None]
    n = len(pairs)
    what = f"predicted against measured {objective}"
    if n < 2:
        return RankCorrelation(objective=objective, n=n, statement=f"no rank correlation ({what}): {n} live "
                               "candidate(s) with both values, it needs 2")
    predicted, measured = zip(*pairs)
    if len(set(predicted)) == 1 or len(set(measured)) == 1:
        side = "predicted" if len(set(predicted)) == 1 else "measured"
        return RankCorrelation(objective=objective, n=n, statement=f"no rank correlation ({what}): the {n} "
                               f"candidates' {side} values are all equal")
    rho = round(float(stats.spearmanr(predicted, measured).statistic), 6)  # float noise off: 1, not 0.9999999999999999
    if n == 2:
        order = "in the measured order" if rho > 0 else "in the reverse of the measured order"
        statement = (f"rank correlation {rho:+.0f} over 2 candidates ({what}): the twin put them {order}; "
                     "with 2 candidates it is only their order")
    else:
        statement = (f"rank correlation {rho:+.2f} over {n} candidates (Spearman, {what}; +1: the twin's order "
                     "is the measured one, -1: its reverse); it describes these candidates, it tests nothing")
    loose = sorted({name for side in ("predicted", "measured") for name in _unsettled(live, side)})
    if loose:
        statement += (f"; {', '.join(loose)}: a value that only bounds the figure (a capacity above its search's "
                      "range) leaves its place in that order unsettled")
    return RankCorrelation(objective=objective, n=n, rho=rho, statement=statement)
