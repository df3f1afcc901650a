"""The views of the summary's ``energy`` section (`simulator.metrics.energy`): one table of its figures,
on the report's page and, as text, in the terminal, with the same rows and the same note."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from rich.text import Text

from ..metrics.summary import Summary
from .cells import figure
from .fit import Grid
from .page import Table

TITLE = "Energy"
ROWS = (
    ("joules_per_task", "joules per completed task", "J"),
    ("joules_per_output_token", "joules per output token", "J"),
    ("mean_power_w", "mean power", "W"),
    ("joules", "energy", "J"),
    ("window_s", "measured over", "s"),
)
"""The section's figures as every view shows them: key, label, unit."""


def note(summary: Summary) -> str:
    """Where the joules come from and what they cover."""
    energy = summary.energy
    if energy is None:
        return ""
    source = energy.source + (f" ({energy.assumptions})" if energy.assumptions else "")
    return (f"From the {source}; all the GPUs used from the window's start to the last counted end, over the "
            "window's completed tasks and output tokens.")


def energy_parts(summary: Summary, width: int) -> list[Any]:
    """The terminal's view: the report's table as text (`Grid.of`), then its note (nothing when the run
    has no energy figures)."""
    table = energy_table(summary, summary.to_dict())
    if table is None:
        return []
    return [*Grid.of(table).tables(width), Text(table.note)]


def energy_table(summary: Summary, data: Mapping[str, Any]) -> Optional[Table]:
    """The report's table of the section, each cell pointing at its figure in summary.json `data` (None:
    the run has no energy figures)."""
    if summary.energy is None:
        return None
    return Table(TITLE, ("figure", "value"), note=note(summary),
                 rows=[[label, figure(data, ("energy", key), unit=unit)] for key, label, unit in ROWS])
