"""`agentload compare A B [C ...]`: result folders side by side (a run and a simulation, several configs)."""

from __future__ import annotations

import argparse
from pathlib import Path

from .report import add_output_options, write_outputs


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "compare",
        help="result folders side by side: per-call and per-task percentiles with the ratio to the first",
        description="Print the figures of two or more result folders (from `agentload run` or `agentload "
        "simulate`) side by side with the ratio of each to the first (A): throughput, per-call TTFT, TPOT, "
        "ITL and end to end, per-task completion time and its breakdown, per task class, cache hits and "
        "errors, how the judged tasks ended; a folder with partial results (a run stopped by its drain limit "
        "or a signal, or rebuilt after a crash) is marked PARTIAL; ratios more than 10% from 1 are "
        "highlighted as worth a look, not as better or worse; a simulation's band (the range of its draws from "
        "the calibration's fit) in brackets beside its figures, and a ratio marked ~ where the two figures are "
        "within the band; and a warning when the folders did not replay the same workload, run settings or SLO.",
    )
    parser.add_argument("a", metavar="A", help="reference result folder (e.g. the real run)")
    parser.add_argument("others", nargs="+", metavar="B", help="result folder(s) compared with A (e.g. its simulation)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    add_output_options(parser, "comparison.html")
    parser.set_defaults(func=compare_command)


def compare_command(args: argparse.Namespace) -> int:
    from ..report.compare import print_comparison
    from ..report.terminal import output_console

    folders = [Path(args.a), *(Path(f) for f in args.others)]
    print_comparison(folders, args.json, output_console())
    write_outputs(args, folders)
    return 0
