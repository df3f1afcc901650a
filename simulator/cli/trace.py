"""`agentload trace inspect|convert|compare`: look at a trace, turn it into the native format, compare two."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any, Optional

from ..errors import InputError

if TYPE_CHECKING:
    from ..model.stats import WorkloadStats
    from ..workload import Workload


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `trace` command group."""
    parser = subparsers.add_parser(
        "trace", help="inspect, convert and compare traces",
        description="Look at recorded traces of any supported format (detected from content): what they hold "
        "(inspect), the same as agentload's native JSONL (convert), and how closely one resembles another "
        "(compare). See docs/trace-format.md.")
    sub = parser.add_subparsers(dest="trace_command", metavar="ACTION", required=True)

    inspect = sub.add_parser(
        "inspect", help="counts, distributions, prefix reuse and arrivals of a trace",
        description="Read traces as one workload and print its counts (tasks, calls, sub-tasks), the "
        "distributions of calls per task, input, appended and output tokens, gaps and task duration "
        "(mean, p50, p90, p99, max), the share of input tokens served from prefix blocks seen before "
        "(within a task and across tasks), and the arrivals: span, rate, the inter-arrival coefficient of "
        "variation and the index of dispersion over 1 s, 10 s and 60 s.")
    inspect.add_argument("paths", nargs="+", metavar="PATH", help="trace files or folders (read as one workload)")
    add_input_options(inspect)
    inspect.add_argument("--json", action="store_true", help="print JSON instead of tables")
    inspect.set_defaults(func=_inspect)

    convert = sub.add_parser(
        "convert", help="write traces in the native JSONL format",
        description="Read traces of any supported format (merged into one workload) and write them as one "
        "native JSONL file (docs/trace-format.md), which every command reads fastest; what the importer "
        "noted (records joined into sessions, records skipped) is printed.")
    convert.add_argument("paths", nargs="+", metavar="IN", help="trace files or folders (merged into one output)")
    convert.add_argument("-o", "--output", required=True, metavar="FILE", help="the native JSONL file to write")
    add_input_options(convert)
    convert.set_defaults(func=_convert)

    compare = sub.add_parser(
        "compare", help="how closely trace B resembles trace A (KS distances, ratios B/A)",
        description="Compare two workloads marginal by marginal: the Kolmogorov-Smirnov distance and the ratio "
        "B/A of percentiles of calls per task, tokens, gaps and task duration, and the ratios of the arrivals' "
        "dispersion; e.g. a generated workload against the trace its model was fitted to.")
    compare.add_argument("a", metavar="A", help="reference trace (file or folder)")
    compare.add_argument("b", metavar="B", help="trace compared with A")
    compare.add_argument("--on-error", choices=("raise", "skip"), default="raise", help="bad records: stop or skip")
    _append_only_option(compare)
    compare.add_argument("--json", action="store_true", help="print JSON instead of tables")
    compare.set_defaults(func=_compare)


class _Formats:
    """`--format` choices, looked up only when used, so a broken importer cannot break every command."""

    def __contains__(self, name: object) -> bool:
        from ..traces import formats

        return name in formats()

    def __iter__(self):
        from ..traces import formats

        return iter(formats())


def add_input_options(parser: argparse.ArgumentParser) -> None:
    """The options of every command that reads traces: format, bad records, append-only prefixes."""
    parser.add_argument("--format", choices=_Formats(), default=None, metavar="FORMAT",
                        help="trace format, one of %(choices)s (default: detected from content)")
    parser.add_argument("--on-error", choices=("raise", "skip"), default="raise", help="bad records: stop or skip")
    _append_only_option(parser)


def _append_only_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--assume-append-only", action="store_true",
        help="for traces without hash ids: assume each call's prompt is the previous prompt + output + what was "
             "appended (an agent loop's context), and derive prefix hash ids from the token counts",
    )


def _inspect(args: argparse.Namespace) -> int:
    from ..model.stats import workload_stats
    from ..traces import load

    stats = workload_stats(load(args.paths, args.format, args.on_error, args.assume_append_only))
    if args.json:
        print(json.dumps(stats.to_dict(), indent=2))
    else:
        _print_stats(stats)
    return 0


def _convert(args: argparse.Namespace) -> int:
    from ..traces import load, native

    workload = load(args.paths, args.format, args.on_error, args.assume_append_only)
    try:
        native.write(workload, args.output)
    except OSError as exc:
        raise InputError(f"cannot write: {exc.strerror or exc}", file=args.output) from None
    tasks, calls, subtasks = workload.counts()
    print(f"wrote {args.output}: native format v{native.VERSION}, {tasks} tasks, {calls} calls, {subtasks} sub-tasks")
    for note in _notes(workload):
        print(f"  note: {note}")
    return 0


def _compare(args: argparse.Namespace) -> int:
    from ..model.fidelity import compare_workloads
    from ..traces import load

    a = load([args.a], None, args.on_error, args.assume_append_only)
    b = load([args.b], None, args.on_error, args.assume_append_only)
    comparison = compare_workloads(a, b)
    if args.json:
        print(json.dumps({"a": args.a, "b": args.b, **comparison.to_dict()}, indent=2))
        return 0
    from rich.console import Console

    console = Console()
    console.print(f"A = {args.a}\nB = {args.b}")
    for table in comparison.tables():
        console.print(table)
    return 0


def _notes(workload: Workload) -> list[str]:
    return [f"{p.source} ({p.format}): {n}" for p in workload.provenance for n in p.notes]


def _print_stats(stats: WorkloadStats) -> None:
    from rich.console import Console
    from rich.table import Table

    from ..model.stats import LABELS, MARGINALS

    console = Console()
    counts = Table(title="Workload")
    counts.add_column("tasks", justify="right")
    counts.add_column("calls", justify="right")
    counts.add_column("sub-tasks", justify="right")
    counts.add_column("sources")
    sources = ", ".join(f"{p['source']} ({p['format']})" for p in stats.provenance) or "-"
    counts.add_row(str(stats.tasks), str(stats.calls), str(stats.subtasks), sources)
    console.print(counts)

    dist = Table(title="Distributions")
    dist.add_column("", no_wrap=True)
    for col in ("count", "mean", "p50", "p90", "p99", "max"):
        dist.add_column(col, justify="right")
    for name in MARGINALS:
        d = getattr(stats, name)
        dist.add_row(LABELS[name], str(d.count), *(_num(getattr(d, f)) for f in ("mean", "p50", "p90", "p99", "max")))
    console.print(dist)

    reuse = stats.prefix_reuse
    prefix = Table(title="Prefix reuse (share of input tokens served from blocks seen before)")
    prefix.add_column("within task", justify="right")
    prefix.add_column("across tasks", justify="right")
    prefix.add_column("input with hash ids", justify="right")
    prefix.add_row(_pct(reuse.within_task), _pct(reuse.across_tasks), _pct(reuse.hashed_input_share))
    console.print(prefix)

    arr = stats.arrivals
    arrivals = Table(title="Arrivals (top-level tasks)")
    for col in ("span (s)", "rate (tasks/s)", "inter-arrival CV", *(f"IoD {w}" for w in arr.index_of_dispersion)):
        arrivals.add_column(col, justify="right")
    arrivals.add_row(_num(arr.span_s), _num(arr.rate_per_s), _num(arr.interarrival_cv),
                     *(_num(v) for v in arr.index_of_dispersion.values()))
    console.print(arrivals)

    notes = [f"{p['source']} ({p['format']}): {n}" for p in stats.provenance for n in p["notes"]]
    for note in notes:
        console.print(f"note: {note}", markup=False, highlight=False)


def _num(value: Optional[Any]) -> str:
    if value is None:
        return "-"
    value = float(value)
    if abs(value) >= 1000 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:.3g}" if abs(value) < 1 else f"{value:.2f}"


def _pct(value: Optional[float]) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"
