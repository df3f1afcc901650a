"""A study's config space (`simulator.study.model.SpaceResult`), in the terminal and in the report alike:
how it was searched, each candidate run live with the twin's predicted value beside the measured one,
and the rank correlation between them; the report adds every candidate the twin ran."""

from __future__ import annotations

from typing import Any, Iterator, Optional

from .cells import BOUND_SIGNS, figure, number
from .page import Cell, Table
from ..study.model import SpaceLive, SpaceResult, Study

NOTE = ("Predicted: the study's objective for the candidate on the twin (the space's profile with its settings), "
        "ranked among the space's candidates; measured: the same objective of the candidate's live config, ranked "
        "among the live candidates. The rank correlation (Spearman's) describes these few candidates: +1 when the "
        "twin put them in the measured order, -1 in the reverse one; it tests nothing, and with 2 candidates it is "
        "only their order.")


def how(space: SpaceResult) -> str:
    """How the space was searched, in a sentence."""
    kept = f"; {space.infeasible:,} infeasible (not simulated)" if space.infeasible else ""
    size = f" of {space.space_size:,}" if space.space_size is not None else ""
    if space.method == "grid":
        text = f"grid: {space.evaluations or 0:,}{size} candidates on the twin{kept}"
    else:
        text = (f"{space.method} search: {space.evaluations or 0:,} candidates simulated on the twin{size} (budget "
                f"{space.budget or 0:,}), {space.trials or 0:,} trials ({space.repeated or 0:,} proposing one "
                f"again){kept}; seed {space.seed}")
    if len(space.objectives) > 1:
        text += f"; Pareto front of {', '.join(space.objectives)}: {len(space.front):,} candidates"
    best = ", ".join(space.top)
    return text + (f"; best {len(space.top)} run live: {best}" if space.live else f"; best {len(space.top)}: {best}")


def lines(study: Study) -> list[str]:
    """The space in a few lines: how it was searched, each live candidate's predicted value beside its
    measured one, and the rank correlation between them."""
    space = study.space
    if space is None:
        return []
    out = [f"config space: {how(space)}"]
    for c in space.live:
        unit = f" {c.unit}" if c.unit else ""
        out.append(f"  {c.name}: predicted {_bounded(c.predicted_value, c.predicted_bound)}{unit} (rank "
                   f"{c.predicted_rank or '-'} on the twin), measured {_bounded(c.measured_value, c.measured_bound)}"
                   f"{unit} (rank {c.measured_rank or '-'} live{_as(c)})")
    if space.rank_correlation is not None:
        out.append(f"  {space.rank_correlation.statement}")
    return out


def _as(live: SpaceLive) -> str:
    """', as config NAME' when another config's run measured the candidate (the base's, for a candidate
    that adds no server flag)."""
    return f", as config {live.config}: the same server" if live.config and live.config != live.name else ""


def _bounded(value: Optional[float], bound: str) -> str:
    """A value, '≥ ' or '≤ ' before it where it only bounds the figure."""
    return number(value) if value is None else BOUND_SIGNS.get(bound, "") + number(value)


def _cell(data: dict[str, Any], path: tuple, bound: str) -> Cell:
    """The figure at `path`, marked '≥' or '≤' where it only bounds the value."""
    cell = figure(data, path)
    sign = BOUND_SIGNS.get(bound, "")
    return Cell(sign + cell.text, value=cell.value, source=cell.source) if sign and cell.value is not None else cell


def notes(study: Study) -> list[str]:
    """The report's sentences under the space's tables: how it was searched, and the rank correlation."""
    space = study.space
    if space is None:
        return []
    out = [f"Config space: {how(space)}."]
    if space.rank_correlation is not None:
        out.append(f"Config space: {space.rank_correlation.statement}.")
    return out


def live_table(study: Study, data: dict[str, Any]) -> Optional[Table]:
    """The candidates run live: predicted beside measured, each with its rank."""
    space = study.space
    if space is None or not space.live:
        return None
    unit = space.live[0].unit or ""
    suffix = f" ({unit})" if unit else ""
    table = Table("Config space: the twin's prediction against the live runs",
                  ("candidate", f"predicted{suffix}", "rank on the twin", f"measured{suffix}", "rank live"),
                  numeric_from=1, note=NOTE)
    for j, c in enumerate(space.live):
        base = ("space", "live", j)
        table.rows.append([c.name + _as(c), _cell(data, (*base, "predicted_value"), c.predicted_bound),
                           figure(data, (*base, "predicted_rank")),
                           _cell(data, (*base, "measured_value"), c.measured_bound), figure(data, (*base, "measured_rank"))])
    return table


def candidates_table(study: Study, data: dict[str, Any]) -> Optional[Table]:
    """Every candidate, best first on the twin (the infeasible last, with why)."""
    space = study.space
    if space is None or not space.candidates:
        return None
    several = len(space.objectives) > 1
    objective_columns = tuple(f"predicted {o}" for o in space.objectives) if several else ("predicted",)
    columns = ("rank", "candidate", *objective_columns, *(("on the front",) if several else ()), "trial", "note")
    table = Table(f"Config space: every candidate on the twin ({how(space)})", columns, numeric_from=2,
                  text_columns=(len(columns) - 1,) + ((len(columns) - 3,) if several else ()))
    order = sorted(range(len(space.candidates)), key=lambda j: (space.candidates[j].predicted_rank is None,
                                                                 space.candidates[j].predicted_rank or 0, j))
    for j in order:
        c = space.candidates[j]
        base = ("space", "candidates", j)
        values = ([figure(data, (*base, "predicted_values", o)) for o in space.objectives] if several
                  else [_cell(data, (*base, "predicted_value"), c.predicted_bound)])
        note = Cell(f"infeasible: {c.infeasible}", tone="warn") if c.infeasible else Cell("")
        table.rows.append([figure(data, (*base, "predicted_rank")), c.name, *values,
                           *((Cell("yes" if c.on_front else "no"),) if several else ()),
                           figure(data, (*base, "trial")), note])
    return table


def csv_columns(space: SpaceResult) -> list[str]:
    """study_space.csv's header: the candidate, its settings, the twin's figures, the live run's."""
    keys = list(dict.fromkeys(k for c in space.candidates for k in c.settings))
    several = [f"predicted_{o}" for o in space.objectives] if len(space.objectives) > 1 else []
    return ["candidate", *keys, "predicted_value", "predicted_bound", "predicted_rank", *several, "on_front",
            "infeasible", "trial", "measured_value", "measured_bound", "measured_rank"]


def csv_rows(space: SpaceResult) -> Iterator[list[Any]]:
    """study_space.csv's rows, one per candidate, study.json's values as they are."""
    keys = list(dict.fromkeys(k for c in space.candidates for k in c.settings))
    live = {c.name: c for c in space.live}
    several = space.objectives if len(space.objectives) > 1 else []
    for c in space.candidates:
        run = live.get(c.name)
        yield [c.name, *(c.settings.get(k) for k in keys), c.predicted_value, c.predicted_bound, c.predicted_rank,
               *(c.predicted_values.get(o) for o in several), c.on_front, c.infeasible, c.trial,
               run.measured_value if run else None, run.measured_bound if run else None,
               run.measured_rank if run else None]
