"""`agentload compare A B`: two result folders side by side (a run and a simulation, two configs)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "compare",
        help="two result folders side by side: per-call and per-task percentiles with the ratio B/A",
        description="Print the figures of two result folders (from `agentload run` or `agentload "
        "simulate`) side by side with their ratio B/A: throughput, per-call TTFT, TPOT, ITL and end to "
        "end, per-task completion time and its breakdown, per task class, cache hits and errors.",
    )
    parser.add_argument("a", metavar="A", help="reference result folder (e.g. the real run)")
    parser.add_argument("b", metavar="B", help="result folder compared with A (e.g. its simulation)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.set_defaults(func=compare_command)


def compare_command(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ..metrics.summary import load_summary
    from ..report.compare import compare_summaries, compare_table

    a, b = Path(args.a), Path(args.b)
    rows = compare_summaries(load_summary(a), load_summary(b))
    if args.json:
        print(json.dumps({"a": str(a), "b": str(b), "rows": rows}, indent=1))
    else:
        Console().print(compare_table(rows, str(a), str(b)))
    return 0
