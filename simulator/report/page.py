"""What a report is made of, before it is written as HTML, PNG or CSV: sections holding figures
(matplotlib figures) and tables whose cells keep the number they show and where it came from.

A cell that shows a figure of a result file carries its source: the folder's index in the report and
the path of keys in that folder's summary.json (or in study.json), so the HTML page can say in its DOM
which figure each cell shows, and a test can check the page against the files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

from matplotlib.figure import Figure


@dataclass(frozen=True)
class Cell:
    """One table cell: the text shown, and for a figure, its value and where it comes from."""

    text: str
    value: Optional[float] = None
    source: Optional[tuple[Union[str, int], ...]] = None
    """Keys (and list indices) from the top of the file (summary.json or study.json) down to this figure."""
    folder: int = 0
    """Which of the report's folders the figure comes from (0 for a run or a study)."""
    scale: float = 1.0
    """The text shows value × scale (100 for a share shown in %)."""
    tone: str = ""
    """'good', 'bad', 'warn', 'mark' (highlighted without a verdict: a ratio far from 1) or '' (how the
    page colours the cell)."""


CellLike = Union[Cell, str]


@dataclass
class Table:
    """A table: a header, rows of cells (plain strings are text cells), the columns that hold numbers."""

    title: str
    columns: Sequence[str]
    rows: list[list[CellLike]] = field(default_factory=list)
    numeric_from: int = 1
    """Columns from this index on are numbers (right-aligned)."""
    note: str = ""
    bold_rows: tuple[int, ...] = ()
    text_columns: tuple[int, ...] = ()
    """Columns at or past `numeric_from` that hold text all the same (a message, a note)."""
    wrap_text: bool = False
    """Let text cells wrap, so that a table of several long texts fits the page's width."""

    def is_numeric(self, col: int) -> bool:
        """Whether column `col` holds numbers (right-aligned)."""
        return col >= self.numeric_from and col not in self.text_columns

    def cell(self, row: int, col: int) -> Cell:
        """The cell at (row, col) as a `Cell`."""
        value = self.rows[row][col]
        return value if isinstance(value, Cell) else Cell(value)


@dataclass
class Chart:
    """A figure: its file name (for --png), a title, the matplotlib figure and a caption."""

    name: str
    title: str
    figure: Figure
    caption: str = ""


@dataclass
class Section:
    """A part of the page: figures, tables and notes under a title."""

    title: str
    charts: list[Chart] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    anchor: str = ""


@dataclass
class KeyFigure:
    """A headline figure shown large at the top of the page."""

    label: str
    cell: Cell
    hint: str = ""


@dataclass
class Report:
    """A whole report: what it is of, its warnings, headline figures and sections."""

    kind: str
    """'run', 'comparison' or 'study'."""
    title: str
    subtitle: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    key_figures: list[KeyFigure] = field(default_factory=list)
    sections: list[Section] = field(default_factory=list)

    def charts(self) -> list[Chart]:
        """Every figure of the report, in page order."""
        return [chart for section in self.sections for chart in section.charts]
