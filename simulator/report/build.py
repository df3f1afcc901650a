"""From folders to report files: which report the folders make (one run, several side by side, or a
study), and writing it as HTML, PNG and CSV. The commands call this; the pages are built in
`run_report`, `compare_report` and `study_report`."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .page import Report
from ..study.model import is_study_folder, load_study


def build_report(folders: Sequence[Path]) -> Report:
    """The report of a study folder, of one result folder, or of several side by side."""
    from .folder_data import load_folder, load_folders

    folders = [Path(f) for f in folders]
    if len(folders) == 1 and is_study_folder(folders[0]):
        from .study_report import build_study_report

        study, data = load_study(folders[0])
        return build_study_report(study, data, folders[0])
    if len(folders) == 1:
        from .run_report import build_run_report

        return build_run_report(load_folder(folders[0]))
    from .compare_report import build_compare_report

    return build_compare_report(load_folders(folders))


def default_html_path(folders: Sequence[Path]) -> Path:
    """report.html in the one folder (a run or a study), comparison.html here for several."""
    return Path(folders[0]) / "report.html" if len(folders) == 1 else Path("comparison.html")


def html(report: Report, path: Path) -> Path:
    """Write the page; returns its path."""
    from .html_page import write_html

    return write_html(report, path)


def png(report: Report, folder: Path) -> list[Path]:
    """Write the figures; returns their paths."""
    from .png import write_png

    return write_png(report, folder)


def csv(folders: Sequence[Path], out: Path) -> list[Path]:
    """Write the CSV files of a study, of one result folder, or of several; returns their paths."""
    from . import csv_export
    from .folder_data import folder_labels

    folders = [Path(f) for f in folders]
    if len(folders) == 1 and is_study_folder(folders[0]):
        return csv_export.write_study(load_study(folders[0])[0], out)
    if len(folders) == 1:
        return csv_export.write_run(folders[0], out)
    from ..metrics.summary import load_summary

    return csv_export.write_comparison([load_summary(f) for f in folders], folder_labels(folders), out)
