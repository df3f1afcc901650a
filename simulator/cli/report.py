"""`agentload report RESULT_DIR`: print a run's summary again from its result folder."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report",
        help="print the summary of a finished (or interrupted) run from its result folder",
        description="Print a run's summary from summary.json; when that is missing (the run crashed) "
        "rebuild it from calls.jsonl and tasks.jsonl.",
    )
    parser.add_argument("result_dir", help="a result folder written by `agentload run`")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.set_defaults(func=report_command)


def report_command(args: argparse.Namespace) -> int:
    from ..metrics.summary import load_summary
    from ..report.terminal import print_summary

    folder = Path(args.result_dir)
    summary = load_summary(folder)
    summary.result_dir = str(folder)
    if args.json:
        print(json.dumps(summary.to_dict(), indent=1))
    else:
        print_summary(summary)
    return 0
