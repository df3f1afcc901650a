"""A study's fleets, in the terminal and in the report alike: one table of their size, capacity per GPU
and cost (with the sizing verdict), one of what each router traded between cache hits and balance, one
per task class, and the sizing answer in words. Every column is defined once here (`Column`), and both
views write each cell with `simulator.report.cells.figure` from study.json, so the terminal, the HTML,
the PNG and the CSV show the same text."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

from .cells import figure, number
from .fit import Grid
from .page import Cell, Table
from ..study.model import ConfigResult, Sizing, Study
from ..study.ranking import plain
from ..study.sizing import UNIT_SHORT

Key = Union[str, int]


@dataclass(frozen=True)
class Column:
    """A column of figures: its header and where its figure sits under a row's base path."""

    label: str
    path: tuple[Key, ...]
    scale: float = 1.0
    percent: bool = False

    def cell(self, data: dict[str, Any], base: tuple[Key, ...]) -> Cell:
        """The cell of the row at `base` (its figure, or '-')."""
        return figure(data, (*base, *self.path), unit="%" if self.percent else "", scale=self.scale)


def _pair(data: dict[str, Any], base: tuple[Key, ...], path: tuple[Key, ...], money: bool = False) -> Cell:
    """An interval at `path` as 'low – high' ('-' without one)."""
    low, high = figure(data, (*base, *path, 0)), figure(data, (*base, *path, 1))
    if low.value is None or high.value is None:
        return Cell("-")
    sign = "$" if money else ""
    return Cell(f"{sign}{low.text} – {sign}{high.text}")


def _capacity(data: dict[str, Any], c: ConfigResult, base: tuple[Key, ...]) -> Cell:
    """A capacity in tasks per minute; past the search's range, at least its highest rate held."""
    cell = figure(data, (*base, "capacity", "per_min"))
    cap = c.capacity
    if cell.value is None and cap is not None and cap.status == "above_range" and cap.at_least_per_s:
        low = figure(data, (*base, "capacity", "at_least_per_s"), scale=60.0)
        return Cell(f"≥ {low.text}", value=low.value, source=low.source, scale=60.0)
    if cell.value is None and cap is not None and cap.status == "below_range":
        return Cell("below range", tone="bad")
    return cell


def _per_gpu(data: dict[str, Any], c: ConfigResult, base: tuple[Key, ...]) -> Cell:
    cell = figure(data, (*base, "fleet", "per_gpu_per_min"))
    if cell.value is None and c.fleet is not None and c.fleet.per_gpu_at_least_per_min is not None:
        low = figure(data, (*base, "fleet", "per_gpu_at_least_per_min"))
        return Cell(f"≥ {low.text}", value=low.value, source=low.source)
    return cell


def _money(data: dict[str, Any], path: tuple[Key, ...]) -> Cell:
    cell = figure(data, path)
    return cell if cell.value is None else Cell(f"${cell.text}", value=cell.value, source=cell.source)


CARRIES = {"yes": "yes", "no": "no", "unsure": "unsure", "unknown": "no CI"}
TONES = {"yes": "good", "no": "bad", "unsure": "warn"}

Row = Callable[[dict[str, Any], ConfigResult, tuple[Key, ...]], list[Cell]]


def _size_row(study: Study) -> tuple[list[str], Row]:
    """The size table's header and row maker (the sizing columns only when the study asks for sizing)."""
    sizing = study.sizing
    rate = f" {plain(sizing.rate)}/{_short(sizing.per)}" if sizing else ""
    header = ["config", "router", "replicas", "GPUs", "capacity tasks/min", "its CI", "per GPU tasks/min",
              "its CI", "$/task at capacity"]
    if sizing:
        header += [f"carries{rate}", f"$/task at{rate}"]

    def row(data: dict[str, Any], c: ConfigResult, base: tuple[Key, ...]) -> list[Cell]:
        cells = [Cell(c.name), Cell((c.fleet.router if c.fleet else None) or "-"), figure(data, (*base, "fleet", "replicas")),
                 figure(data, (*base, "fleet", "gpus")), _capacity(data, c, base),
                 _pair(data, base, ("capacity", "ci_per_min")), _per_gpu(data, c, base),
                 _pair(data, base, ("fleet", "per_gpu_ci_per_min")), _money(data, (*base, "cost", "self_hosted_per_task"))]
        if sizing:
            j = next((k for k, r in enumerate(sizing.rows) if r.config == c.name), None)
            if j is None:
                cells += [Cell("-"), Cell("-")]
            else:
                verdict = sizing.rows[j].carries
                cells += [Cell(CARRIES[verdict], tone=TONES.get(verdict, "")),
                          _money(data, ("sizing", "rows", j, "cost_per_task_at_rate"))]
        return cells

    return header, row


TRADE_COLUMNS = (
    Column("prefix-hit share", ("fleet", "prefix_hit_share"), 100.0, True),
    Column("cached share", ("fleet", "cached_share"), 100.0, True),
    Column("imbalance", ("fleet", "imbalance")),
    Column("tasks moved", ("fleet", "moved_share"), 100.0, True),
    Column("moves/task", ("fleet", "moves_per_task")),
    Column("waiting", ("fleet", "waiting_mean")),
    Column("TTFT s/task", ("fleet", "ttft_per_task_s")),
    Column("task p95 s", ("task_p95_s",)),
)
"""The router trade-off's columns, per fleet config."""

CLASS_COLUMNS = (
    Column("tasks", ("tasks",)),
    Column("cached share", ("cached_share",), 100.0, True),
    Column("TTFT s/task", ("ttft_per_task_s",)),
    Column("task p50 s", ("task_p50_s",)),
    Column("task p95 s", ("task_p95_s",)),
)
"""The per task class columns (under a config's ``fleet.by_class.CLASS``)."""

SIZE_NOTE = ("Capacity: the highest offered task rate at which every SLO target held, per minute, with its "
             "confidence interval where repeats give one; per GPU: over the fleet's GPUs (replicas x cost.gpus). "
             "$/task at capacity: the fleet's GPU-hours over the tasks per hour at its capacity; at the rate: over "
             "the sizing rate's tasks per hour. Carries: its capacity's interval lies at or above the rate (yes), "
             "below it (no), straddles it (unsure), or there is no interval (one repeat).")
TRADE_NOTE = ("At each config's ranking points (the same as its task times). Prefix-hit share: the replicas' "
              "prefix-cache hits over queries (their /metrics); cached share: prompt tokens the servers reported "
              "cached over all prompt tokens of the completed tasks; imbalance: most calls on one replica over the "
              "mean (1: even); tasks moved: share of tasks whose calls went to more than one replica; waiting: "
              "requests in a replica's queue, mean over the run and the replicas; TTFT s/task: seconds a task "
              "spent before first tokens (queueing and prefill).")


def _fleets(study: Study) -> list[tuple[int, ConfigResult]]:
    return [(i, c) for i, c in enumerate(study.configs) if c.fleet is not None]


def size_table(study: Study, data: dict[str, Any]) -> Optional[Table]:
    """Each fleet config's size, capacity (per GPU too) and cost, with the sizing verdict."""
    fleets = _fleets(study)
    if not fleets:
        return None
    header, row = _size_row(study)
    table = Table("Fleets: size, capacity per GPU and cost", header, numeric_from=2, note=SIZE_NOTE)
    for i, c in sorted(fleets, key=lambda ic: (ic[1].fleet.router or "", ic[1].fleet.replicas, ic[0])):  # type: ignore[union-attr]
        table.rows.append(row(data, c, ("configs", i)))
    return table


def trade_table(study: Study, data: dict[str, Any]) -> Optional[Table]:
    """Each fleet config's router trade between cache hits and balance."""
    fleets = _fleets(study)
    if not fleets:
        return None
    table = Table("Routers: cache hits against balance", ["config", "policy", "replicas",
                                                           *(col.label for col in TRADE_COLUMNS)],
                  numeric_from=2, note=TRADE_NOTE)
    for i, c in fleets:
        base = ("configs", i)
        table.rows.append([Cell(c.name), Cell(c.fleet.policy or "-"), figure(data, (*base, "fleet", "replicas")),  # type: ignore[union-attr]
                           *(col.cell(data, base) for col in TRADE_COLUMNS)])
    return table


def class_table(study: Study, data: dict[str, Any]) -> Optional[Table]:
    """Each fleet config's figures per task class."""
    rows = [(i, c, name) for i, c in _fleets(study) for name in c.fleet.by_class]  # type: ignore[union-attr]
    if not rows:
        return None
    table = Table("Routers per task class", ["config", "policy", "task class", *(col.label for col in CLASS_COLUMNS)],
                  numeric_from=3)
    for i, c, name in rows:
        base = ("configs", i, "fleet", "by_class", name)
        table.rows.append([Cell(c.name), Cell(c.fleet.policy or "-"), Cell(name),  # type: ignore[union-attr]
                           *(col.cell(data, base) for col in CLASS_COLUMNS)])
    return table


def rate_text(sizing: Sizing) -> str:
    """The sizing rate as given: '40 tasks/min'."""
    return f"{plain(sizing.rate)} tasks/{_short(sizing.per)}"


def sizing_lines(study: Study) -> list[str]:
    """The sizing answer in words: the study's, then each router's."""
    sizing = study.sizing
    if sizing is None:
        return []
    confidence = f" ({100 * sizing.confidence:g}% confidence)" if sizing.confidence else ""
    lines = [f"sizing for {rate_text(sizing)}{confidence}: {sizing.answer}"]
    if sizing.cost_per_task_at_rate is not None:
        lines.append(f"  at that rate its {sizing.gpus} GPUs cost ${number(sizing.cost_per_task_at_rate)} a task")
    if len(sizing.groups) > 1:
        lines += [f"  router {g.router}: {g.answer}" for g in sizing.groups]
    return lines


def tables(study: Study, data: dict[str, Any]) -> list[Table]:
    """The fleet tables the study has (none without a fleet config)."""
    return [t for t in (size_table(study, data), trade_table(study, data), class_table(study, data)) if t]


def grids(study: Study) -> list[Grid]:
    """The same tables for the terminal (cells' texts as the report writes them)."""
    data = study.model_dump(mode="json")
    return [Grid.of(table) for table in tables(study, data)]


def _short(per: str) -> str:
    return UNIT_SHORT.get(per, per)


def note_lines(study: Study) -> Sequence[str]:
    """What the fleet tables' figures are, for the terminal (the report puts them under each table)."""
    return [f"fleets: {SIZE_NOTE}", f"routers: {TRADE_NOTE}"] if _fleets(study) else []
