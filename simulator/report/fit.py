"""Terminal tables that fit the screen without cutting a cell: a table wider than the console is split
into several, each repeating the key columns (a row's label) and taking as many of the other columns as
fit, in order. A number is never folded, cut or ellipsised; only a column marked as text may wrap, and
only when it alone would not fit beside the key columns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence, Union

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from .page import Table as PageTable

CellText = Union[str, Text]


@dataclass
class Grid:
    """A table's content: a title, columns (label, justify), rows of cell texts, and how it is drawn."""

    title: str
    columns: Sequence[tuple[str, str]]
    """(label, 'left' | 'right')."""
    rows: list[list[CellText]] = field(default_factory=list)
    keep: int = 1
    """The first columns repeated in every part of a split table (a row's label)."""
    text_columns: tuple[int, ...] = ()
    """Columns of free text (messages), which may wrap; all others keep their width whole."""
    row_styles: dict[int, str] = field(default_factory=dict)
    """Rich styles of some rows, by index."""
    caption: str = ""
    box_style: box.Box = box.HEAVY_HEAD

    @classmethod
    def of(cls, table: "PageTable", keep: int = 1) -> "Grid":
        """A report table's cells for the terminal, their texts as the report writes them."""
        grid = cls(table.title, [(label, "right" if table.is_numeric(k) else "left")
                                 for k, label in enumerate(table.columns)], keep=keep)
        for r in range(len(table.rows)):
            grid.add(*(table.cell(r, k).text for k in range(len(table.columns))))
        return grid

    def add(self, *cells: CellText, style: str = "") -> None:
        """Append one row (with a style)."""
        if style:
            self.row_styles[len(self.rows)] = style
        self.rows.append(list(cells))

    def table(self, columns: Sequence[int], title: str) -> Table:
        """A rich table of the given columns."""
        table = Table(title=title or None, title_justify="left", box=self.box_style,
                      caption=self.caption or None, caption_justify="left")
        for i in columns:
            label, justify = self.columns[i]
            wrap = i in self.text_columns  # the split keeps other columns at their width: nothing folds
            table.add_column(label, justify=justify, no_wrap=not wrap, overflow="fold")  # type: ignore[arg-type]
        for r, row in enumerate(self.rows):
            table.add_row(*(row[i] for i in columns), style=self.row_styles.get(r))
        return table

    def tables(self, width: int) -> list[Table]:
        """The table as one, or split into several that each fit `width` columns."""
        every = list(range(len(self.columns)))
        if _width(self.table(every, self.title)) <= width:
            return [self.table(every, self.title)]
        keep, rest = every[: self.keep], every[self.keep:]
        parts: list[list[int]] = []
        for i in rest:
            if parts and _width(self.table(keep + parts[-1] + [i], self.title)) <= width:
                parts[-1].append(i)
            else:
                parts.append([i])
        return [self.table(keep + part, self.title if n == 0 else f"{self.title} (cont.)")
                for n, part in enumerate(parts)]


_MEASURE = Console(width=100_000, file=None, color_system=None)


def _width(table: Table) -> int:
    """Columns the table takes at its natural width."""
    return Measurement.get(_MEASURE, _MEASURE.options, table).maximum


def print_grid(console: Console, grid: Grid) -> None:
    """Print `grid` on `console`, split to fit its width."""
    for table in grid.tables(console.width):
        console.print(table)
