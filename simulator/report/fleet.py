"""The summary's ``fleet`` section shown: a table of the replicas (each cell pointing at the figure of
summary.json it shows, so the HTML report can take the same cells) and the fleet's line (calls served
against the client's, prefix-hit share, imbalance, task moves, replicas that died). The terminal prints
both (`print_fleet`), the table split to the console's width without cutting a number."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from .cells import figure, number
from .fit import Grid
from .page import Cell, Table

REPLICA_COLUMNS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("served", "served (/metrics)", {}),
    ("client_calls", "answered (client)", {}),
    ("call_share", "share", {"unit": "%", "scale": 100.0}),
    ("prefix_hit_share", "prefix-hit share", {"unit": "%", "scale": 100.0}),
    ("waiting_mean", "waiting mean", {}),
    ("waiting_max", "waiting max", {}),
    ("kv_usage_mean", "KV mean", {"unit": "%", "scale": 100.0}),
    ("kv_usage_max", "KV max", {"unit": "%", "scale": 100.0}),
)
"""The replica table's figures: the `ReplicaFigures` field, its column label, how it is shown."""


def replica_table(summary: Mapping[str, Any], folder: int = 0) -> Optional[Table]:
    """One row per replica of summary.json's ``fleet`` (None without one): calls it served by its own
    /metrics and calls the client saw it answer, its share, prefix-cache hit share, requests waiting
    and KV-cache usage (mean and max over the scrapes), and whether it was up to the end."""
    fleet = summary.get("fleet")
    if not isinstance(fleet, Mapping):
        return None
    table = Table(f"Fleet replicas (router policy: {fleet.get('policy') or '-'})",
                  ("replica", *(label for _, label, _ in REPLICA_COLUMNS), "state"),
                  text_columns=(len(REPLICA_COLUMNS) + 1,))
    for i, replica in enumerate(fleet.get("replicas") or []):
        state = str(replica.get("state") or "up")
        cells: list[Any] = [Cell(str(replica.get("name", i)))]
        cells += [figure(summary, ("fleet", "replicas", i, key), folder=folder, **shown)
                  for key, _, shown in REPLICA_COLUMNS]
        cells.append(Cell(state, tone="bad" if state != "up" else ""))
        table.rows.append(cells)
    return table


def fleet_line(summary: Mapping[str, Any]) -> str:
    """The fleet in one line: calls the replicas served against those the client got an answer to (and
    whether every answered call is in a replica's count), the fleet's prefix-cache hit share, the
    imbalance between replicas and how often tasks moved between them; then each replica that died."""
    fleet = summary.get("fleet")
    if not isinstance(fleet, Mapping):
        return ""
    served, client = fleet.get("served"), fleet.get("client_calls")
    accounted = fleet.get("accounted")
    verdict = {True: "all accounted", False: "NOT all accounted", None: "not every replica has /metrics"}[accounted]
    hit = fleet.get("prefix_hit_share")
    moves = fleet.get("moves") or {}
    parts = [
        f"fleet: replicas served {number(served)} calls, the client got answers to {number(client)} ({verdict})",
        f"prefix-hit share {'-' if hit is None else f'{100 * hit:.1f}%'}",
        f"imbalance {number(fleet.get('imbalance'))} (most calls on one replica over the mean)",
        f"task moves: {number(moves.get('moved'))} of {number(moves.get('tasks'))} tasks moved, "
        f"{number(moves.get('moves'))} moves",
    ]
    lines = ["; ".join(parts)]
    for replica in fleet.get("replicas") or []:
        if replica.get("state") not in (None, "up"):
            lines.append(f"replica {replica.get('name')} {replica.get('state')}: {replica.get('note') or ''}".rstrip(": "))
    return "\n".join(lines)


def print_fleet(summary: Any, console: Any) -> None:
    """Print the ``fleet`` section of a fleet run's summary (nothing for a run without one)."""
    data = summary.to_dict() if hasattr(summary, "to_dict") else summary
    table = replica_table(data)
    if table is None:
        return
    for part in Grid.of(table).tables(console.width):
        console.print(part)
    console.print(fleet_line(data), highlight=False, soft_wrap=True, markup=False)
