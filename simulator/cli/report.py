"""`agentload report DIR...`: a run's summary again from its result folder, several folders side by
side, or a study; and the same as an HTML page (``--html``), PNG figures (``--png``) and CSV files
(``--csv``). `add_output_options` and `write_outputs` give `run`, `simulate` and `compare` the same
options."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Optional, Sequence

AUTO = "auto"
"""What ``--html`` without a path stands for: the default page path."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report",
        help="the report of a result folder, of several side by side, or of a study: terminal, HTML, PNG, CSV",
        description="One result folder (from `agentload run` or `simulate`): print its summary from "
        "summary.json (rebuilt from calls.jsonl and tasks.jsonl when the run crashed). Several folders: "
        "their figures side by side with the ratio to the first, and a warning when they did not replay "
        "the same workload. A study folder (with study.json): its ranking. --html, --png and --csv write "
        "the same as a self-contained page, figures and tables.",
    )
    parser.add_argument("folders", nargs="+", metavar="DIR", help="result folder(s), or one study folder")
    parser.add_argument("--json", action="store_true", help="print the summary (or the compared rows) as JSON")
    add_output_options(parser, "DIR/report.html for one folder or a study, comparison.html for several")
    parser.set_defaults(func=report_command)


def add_output_options(parser: argparse.ArgumentParser, html_default: str) -> None:
    """--html [OUT], --png DIR and --csv DIR, as every command that ends with a result folder has them."""
    group = parser.add_argument_group("report files")
    group.add_argument("--html", nargs="?", const=AUTO, metavar="OUT",
                       help=f"write the report as one self-contained HTML page (default path: {html_default})")
    group.add_argument("--png", metavar="DIR", help="write the report's figures as PNG files into DIR")
    group.add_argument("--csv", metavar="DIR", help="write the calls, tasks and summary (or the compared "
                       "figures, or the study's points) as CSV files into DIR")


def write_outputs(args: argparse.Namespace, folders: Sequence[Path], *, html_default: Optional[Path] = None) -> list[Path]:
    """Write what --html, --png and --csv asked for, for one result folder, several, or a study folder;
    returns the files written (and prints where they are)."""
    if not (args.html or args.png or args.csv):
        return []
    from ..report import build

    folders = [Path(f) for f in folders]
    report = build.build_report(folders)
    written: list[Path] = []
    if args.html:
        out = Path(args.html) if args.html != AUTO else (html_default or build.default_html_path(folders))
        written.append(build.html(report, out))
    if args.png:
        written += build.png(report, Path(args.png))
    if args.csv:
        written += build.csv(folders, Path(args.csv))
    from ..report.terminal import output_console

    console = output_console(stderr=True)
    for path in written:
        console.print(f"wrote {path}", highlight=False, soft_wrap=True, markup=False)
    return written


def report_command(args: argparse.Namespace) -> int:
    from ..study.model import is_study_folder

    folders = [Path(f) for f in args.folders]
    if len(folders) == 1 and is_study_folder(folders[0]):
        _print_study(folders[0], args.json)
    elif len(folders) == 1:
        _print_run(folders[0], args.json)
    else:
        _print_comparison(folders, args.json)
    write_outputs(args, folders)
    return 0


def _print_run(folder: Path, as_json: bool) -> None:
    from ..metrics.summary import load_summary
    from ..report.terminal import print_summary

    summary = load_summary(folder)
    summary.result_dir = str(folder)
    if as_json:
        print(json.dumps(summary.to_dict(), indent=1))
    else:
        print_summary(summary)


def _print_comparison(folders: Sequence[Path], as_json: bool) -> None:
    from ..report.compare import print_comparison
    from ..report.terminal import output_console

    print_comparison(folders, as_json, output_console())


def _print_study(folder: Path, as_json: bool) -> None:
    from ..report.study_terminal import print_study
    from ..report.terminal import output_console
    from ..study.model import load_study

    study, data = load_study(folder)
    if as_json:
        print(json.dumps(data, indent=1))
        return
    print_study(study, output_console())
