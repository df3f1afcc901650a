"""`agentload compare A B [C ...]`: result folders side by side (a run and a simulation, several configs)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .report import add_output_options, write_outputs


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "compare",
        help="result folders side by side: per-call and per-task percentiles with the ratio to the first",
        description="Print the figures of two or more result folders (from `agentload run` or `agentload "
        "simulate`) side by side with the ratio of each to the first (A): throughput, per-call TTFT, TPOT, "
        "ITL and end to end, per-task completion time and its breakdown, per task class, cache hits and "
        "errors; and a warning when the folders did not replay the same workload, run settings or SLO.",
    )
    parser.add_argument("a", metavar="A", help="reference result folder (e.g. the real run)")
    parser.add_argument("others", nargs="+", metavar="B", help="result folder(s) compared with A (e.g. its simulation)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    add_output_options(parser, "comparison.html")
    parser.set_defaults(func=compare_command)


def compare_command(args: argparse.Namespace) -> int:
    from ..metrics import results
    from ..metrics.summary import load_summary
    from ..report.compare import compare_many, compare_table, workload_warnings
    from ..report.folder_data import folder_labels
    from ..report.terminal import output_console

    folders = [Path(args.a), *(Path(f) for f in args.others)]
    rows = compare_many([load_summary(f) for f in folders])
    labels = folder_labels(folders)
    warnings = workload_warnings([results.read_json(f, results.RUN_FILE) or {} for f in folders], labels)
    if args.json:
        out: dict = {"folders": [str(f) for f in folders], "warnings": warnings, "rows": rows}
        if len(folders) == 2:  # the two-folder shape: a, b and ratio b/a in each row
            out.update(a=str(folders[0]), b=str(folders[1]))
            for row in rows:
                row.update(a=row["values"][0], b=row["values"][1], ratio=row["ratios"][1])
        print(json.dumps(out, indent=1))
    else:
        console = output_console()
        console.print(compare_table(rows, [str(f) for f in folders]))
        for warning in warnings:
            console.print(f"warning: {warning}", style="yellow", highlight=False, markup=False)
    write_outputs(args, folders)
    return 0
