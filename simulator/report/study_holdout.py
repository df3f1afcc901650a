"""A study's held-out capacity check (`simulator.study.model.HoldoutResult`), in the terminal and in the
report alike: one table (each config's capacity and, per share of it checked, the rate and whether the
SLO held on the held-out traffic), each config's answer in a sentence, and what the check is. The
terminal's table is the report's (`Grid.of`), so both show the same text; the CSV holds the same rows."""

from __future__ import annotations

from typing import Any, Iterator, Optional

from .cells import figure
from .fit import Grid
from .page import Cell, Table
from ..study.model import HoldoutResult, Study

POINT_WORDS = {"held": "held", "missed": "MISSED", "untestable": "burst"}
"""A checked rate's verdict in a cell ('burst': held, but too short to test its rate); a failed point: FAILED."""
CHECK_WORDS = {"held": "held", "held_below": "held below", "missed": "MISSED", "untestable": "burst",
               "failed": "FAILED", "not_run": "not run"}
TONES = {"held": "good", "held_below": "warn", "missed": "bad", "untestable": "warn", "failed": "bad"}

NOTE = ("After the search, each config's capacity (its lower bound, ≥, above the search's range) run once on "
        "traffic the search never saw, at each share of it, and judged as the search judges a probe: every SLO "
        "target over every task meant to run, the failed or cancelled share, and the queue's growth where "
        "capacity.max_growth is set. held: at every rate checked; held below: missed at the capacity but held at "
        "a lower share (plan below the capacity); MISSED: held at no rate, or missed below a rate that held. The "
        "capacity is the mean of the repeats' bracket middles, each between a rate that held and one that missed on "
        "its seed, so it can miss on new traffic by that margin alone; the lower shares are the margin a plan needs. One run a rate: a "
        "verdict on that traffic, not a probability.")


def _checked(study: Study) -> list[tuple[int, HoldoutResult]]:
    return [(i, c.holdout) for i, c in enumerate(study.configs) if c.holdout is not None]


def _shares(study: Study) -> list[float]:
    """The shares checked, highest first (the same for every config of a study)."""
    return sorted({r.share for _, h in _checked(study) for r in h.rates}, reverse=True)


def _share_text(share: float) -> str:
    return f"{share:.0%}"


def table(study: Study, data: dict[str, Any]) -> Optional[Table]:
    """One row per config with a check: its capacity, each share's rate and verdict, the check's verdict."""
    checked = _checked(study)
    if not checked:
        return None
    shares = _shares(study)
    columns = ["config", "held-out traffic", "tasks", "capacity tasks/h"]
    for share in shares:
        columns += [f"{_share_text(share)} tasks/h", f"SLO at {_share_text(share)}"]
    columns.append("verdict")
    verdicts = [5 + 2 * k for k in range(len(shares))] + [4 + 2 * len(shares)]
    out = Table("Held-out capacity check", columns, numeric_from=2, text_columns=tuple(verdicts), note=NOTE)
    for i, check in checked:
        base = ("configs", i, "holdout")
        capacity = figure(data, (*base, "capacity_per_hour"))
        if check.bound == "at_least" and capacity.value is not None:
            capacity = Cell(f"≥ {capacity.text}", value=capacity.value, source=capacity.source)
        row: list[Cell | str] = [study.configs[i].name, check.traffic, figure(data, (*base, "tasks")), capacity]
        for share in shares:
            j = next((k for k, r in enumerate(check.rates) if r.share == share), None)
            if j is None:
                row += [Cell("-"), Cell("-")]
                continue
            rate = check.rates[j]
            word = POINT_WORDS.get(rate.verdict or "", "FAILED")
            row += [figure(data, (*base, "rates", j, "per_hour")),
                    Cell(word, tone=TONES.get(rate.verdict or "failed", ""))]
        row.append(Cell(CHECK_WORDS.get(check.verdict, check.verdict), tone=TONES.get(check.verdict, "")))
        out.rows.append(row)
    return out


def grids(study: Study) -> list[Grid]:
    """The same table for the terminal (the cells' texts as the report writes them)."""
    found = table(study, study.model_dump(mode="json"))
    return [Grid.of(found, keep=1)] if found is not None else []


def lines(study: Study) -> list[str]:
    """Each config's check in a sentence."""
    return [f"held-out check, {study.configs[i].name}: {check.answer}" for i, check in _checked(study)]


def note_lines(study: Study) -> list[str]:
    """What the table's figures are, for the terminal (the report puts it under the table)."""
    return [f"held-out check: {NOTE}"] if _checked(study) else []


def warnings(study: Study) -> list[str]:
    """The configs whose capacity did not hold on the held-out traffic, for the top of the report."""
    return [f"{study.configs[i].name}: the capacity did not hold on traffic its search never saw: {check.answer}"
            for i, check in _checked(study) if check.verdict in ("missed", "held_below")]


CSV_COLUMNS = ("config", "traffic", "seed", "split", "tasks", "capacity_per_s", "bound", "share", "rate_per_s",
               "per_hour", "rate_verdict", "status", "folder", "verdict")
"""study_holdout.csv: one row per config and share checked (a config whose check did not run: one row)."""


def csv_rows(study: Study) -> Iterator[list[Any]]:
    """The rows of study_holdout.csv, study.json's values as they are."""
    for i, check in _checked(study):
        name = study.configs[i].name
        head = [check.traffic, check.seed, check.split, check.tasks, check.capacity_per_s, check.bound]
        for rate in check.rates or [None]:
            cells = [None] * 6 if rate is None else [rate.share, rate.rate_per_s, rate.per_hour, rate.verdict,
                                                      rate.status, rate.folder]
            yield [name, *head, *cells, check.verdict]
