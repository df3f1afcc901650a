"""`agentload run SCENARIO`: replay a scenario live, show progress, print and save the summary."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live

from .report import add_output_options, write_outputs

from ..metrics.verdict import DEFAULT_MAX_FAILED_SHARE


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run",
        help="replay a scenario against a server (or the built-in emulator) and measure it",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Replay a scenario file live. Without a `target` in the scenario, the built-in emulator\n"
        "is started and used. Before the arrivals start, the target is checked (its model list and one\n"
        "tiny call). Ctrl-C, SIGTERM and SIGHUP stop the run cleanly and keep partial results.",
        epilog="exit codes:\n"
        "  0      completed: failed attempts within --max-failed-share and, with --fail-on-slo,\n"
        "         every SLO target met\n"
        "  1      more call attempts failed than --max-failed-share allows\n"
        "  2      bad input: scenario, trace or setting (no result folder)\n"
        "  3      the target failed the preflight check: unreachable, wrong model, authentication\n"
        "         (no result folder)\n"
        "  4      with --fail-on-slo: an SLO target was missed\n"
        "  128+N  stopped by signal N: 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP (partial results and\n"
        "         summary saved)",
    )
    parser.add_argument("scenario", help="scenario YAML file (see docs/scenario.md)")
    parser.add_argument("-o", "--output", metavar="DIR", help="result folder (default: run.output/<name>-<time>)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a scenario setting, e.g. --set run.max_tasks=5 (repeatable)")
    parser.add_argument("--no-progress", action="store_true", help="no live progress display")
    parser.add_argument("--max-failed-share", type=_share, default=DEFAULT_MAX_FAILED_SHARE, metavar="X",
                        help="exit with code 1 when more than this share of call attempts failed "
                        f"(cancelled ones not counted; default {DEFAULT_MAX_FAILED_SHARE:g}; 0: any failure)")
    parser.add_argument("--fail-on-slo", action="store_true",
                        help="exit with code 4 when the run missed a target of the scenario's SLO")
    parser.add_argument("--no-preflight", action="store_true",
                        help="skip the check of the target before the run (its model list and one tiny call)")
    parser.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                        help="spread the run's tasks over shards on a Ray cluster: ADDRESS (e.g. auto, "
                        "head:6379), else RAY_ADDRESS or a new local one; run.workers sets the shards "
                        "(default auto). Needs pip install 'agentload[ray]'; see docs/scale-out.md")
    add_output_options(parser, "RESULT_DIR/report.html")
    parser.set_defaults(func=run_command)


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not a share between 0 and 1")
    return value


def run_command(args: argparse.Namespace) -> int:
    from .. import scenario as scenario_mod
    from ..live.client import PreflightError
    from ..live.runner import RunAborted, result_folder, run_scenario
    from ..metrics.verdict import PREFLIGHT_FAILED, SIGNALLED, verdict
    from ..report.progress import ProgressView
    from ..report.terminal import print_summary

    scenario = scenario_mod.load(args.scenario, args.overrides)
    workload = scenario_mod.load_workload(scenario)
    folder = result_folder(scenario, args.output)
    console = Console(stderr=True)
    console.print(banner(scenario, workload, folder), highlight=False, soft_wrap=True)
    view = ProgressView()
    show = not args.no_progress and console.is_terminal
    signals: list[int] = []

    def checked(found: dict) -> None:
        console.print(f"agentload: preflight ok: model {found['model']}, one-token call in "
                      f"{1000 * found['latency_s']:.0f} ms", highlight=False, soft_wrap=True)

    sharded = args.ray is not None or scenario.run.workers is not None
    if sharded:  # over Ray (simulator.scale): the same arguments and result, plus where Ray is
        import functools

        from ..scale.runner import run_sharded

        run_scenario = functools.partial(run_sharded, address=args.ray or None)  # noqa: F811
    try:
        # asyncio's own loop, not uvloop: its reads go through the socket objects, which keep the
        # kernel's receive stamps (`simulator.rx_stamps`)
        with asyncio.Runner() as runner, Live(view, console=console, refresh_per_second=4,
                                                 transient=False) if show else _Null() as _:
            summary, outcome = runner.run(run_scenario(
                scenario, workload, Path(folder), on_progress=view.update, preflight=not args.no_preflight,
                on_preflight=checked, on_signal=signals.append))
    except PreflightError as exc:
        console.print(f"agentload: error: preflight: {exc}", highlight=False, soft_wrap=True, markup=False)
        return PREFLIGHT_FAILED
    except RunAborted as exc:
        console.print(f"agentload: {exc}; nothing measured", highlight=False, soft_wrap=True)
        return SIGNALLED + exc.signum
    print_summary(summary)
    if sharded:
        from ..scale.report import print_shards

        print_shards(summary, Console())
    write_outputs(args, [Path(folder)])
    result = verdict(summary, max_failed_share=args.max_failed_share, fail_on_slo=args.fail_on_slo,
                     signum=signals[0] if signals else None)
    if sharded:
        from ..scale.report import lost_verdict

        result = lost_verdict(summary, result)
    if result.reason:
        console.print(f"agentload: {result.reason} (exit code {result.code})", highlight=False, soft_wrap=True,
                      markup=False)
    return result.code


def banner(scenario: Any, workload: Any, folder: Any) -> str:
    """The line printed before a run: what is replayed against what, how long its arrivals last, about
    how long it will take, and where the results go (URL credentials masked)."""
    from ..live.runner import run_length
    from ..redact import mask_url
    from ..workload import describe_seconds

    tasks, calls, subtasks = workload.counts()
    length = run_length(workload, scenario.run)
    span = length.last_arrival - length.first_arrival
    cut = f" (run.duration starts {length.tasks} of them)" if length.tasks < tasks else ""
    return (f"agentload: {scenario.display_name()}: {tasks} tasks{cut}, {calls} calls, {subtasks} sub-agents; "
            f"arrivals over {describe_seconds(span)}, run of at least {describe_seconds(length.estimate)} "
            f"(arrivals, then tool/think time; the server's time comes on top); "
            f"target: {mask_url(scenario.target.base_url) if scenario.target else 'built-in emulator'}; "
            f"results: {folder}")


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
