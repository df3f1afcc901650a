"""A report's figures as PNG files (``--png DIR``), for papers and slides: the same matplotlib figures
the HTML page shows, one file per figure, named after it."""

from __future__ import annotations

from pathlib import Path

from . import plots
from .page import Report

DPI = 160


@plots.in_style
def write_png(report: Report, folder: Path) -> list[Path]:
    """Write every figure of the report into `folder` (made when missing); returns the files."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for chart in report.charts():
        path = folder / f"{chart.name}.png"
        chart.figure.savefig(path, format="png", dpi=DPI, facecolor="white", metadata={"Software": None})
        written.append(path)
    return written
