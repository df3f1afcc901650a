"""`agentload run SCENARIO`: replay a scenario live, show progress, print and save the summary."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ._options import add_verdict_options
from ._quick import add_scenario_options, load_scenario, save_if_asked
from .report import add_output_options, write_outputs


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run",
        help="replay a scenario against a server (or the built-in emulator) and measure it",
        description="Replay a scenario live: a scenario file, or a trace or workload model described by flags "
        "(--trace, --target, --rate, --concurrency, --burstiness, --slo, ...; vllm bench serve's names work too). "
        "Without a target, the built-in emulator is started and used. Before the arrivals start, the target is "
        "checked (its model list and one tiny call). Ctrl-C, SIGTERM and SIGHUP stop the run cleanly and keep "
        "partial results.",
        epilog="exit codes:\n"
        "  0      completed: failed attempts within --max-failed-share and, with\n"
        "         --fail-on-slo, every SLO target met\n"
        "  1      more call attempts failed than --max-failed-share allows\n"
        "  2      bad input: scenario, trace or setting (no result folder)\n"
        "  3      the target failed the preflight check: unreachable, wrong model,\n"
        "         authentication (no result folder)\n"
        "  4      with --fail-on-slo: an SLO target was missed\n"
        "  128+N  stopped by signal N: 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP (partial\n"
        "         results and summary saved)",
    )
    add_scenario_options(parser, live=True)
    parser.add_argument("-o", "--output", metavar="DIR",
                        help="the result folder to write (default: RUN.OUTPUT/NAME-YYYYmmdd-HHMMSS, i.e. "
                        "results/<scenario name>-<time>)")
    parser.add_argument("--no-progress", action="store_true", help="no live progress display")
    add_verdict_options(parser)
    parser.add_argument("--no-preflight", action="store_true",
                        help="skip the check of the target before the run (its model list and one tiny call)")
    parser.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                        help="spread the run's tasks over shards on a Ray cluster: ADDRESS (e.g. auto, "
                        "head:6379), else RAY_ADDRESS or a new local one; run.workers sets the shards "
                        "(default auto). Needs pip install 'agentload[ray]'; see docs/scale-out.md")
    add_output_options(parser, "RESULT_DIR/report.html")
    parser.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    import asyncio

    from rich.console import Console
    from rich.live import Live

    from .. import scenario as scenario_mod
    from ..live.client import PreflightError
    from ..pipeline.live import LiveExecutor
    from ..live.stopper import RunAborted
    from ..metrics.verdict import PREFLIGHT_FAILED, SIGNALLED, verdict
    from ..report.progress import ProgressView
    from ..pipeline.execute import execute_async
    from ..pipeline.plan import plan_run, result_folder
    from ..report.terminal import print_summary

    scenario = load_scenario(args)
    workload = scenario_mod.load_workload(scenario)
    save_if_asked(args, scenario)
    folder = result_folder(scenario, args.output)
    console = Console(stderr=True)
    console.print(banner(scenario, workload, folder), highlight=False, soft_wrap=True)
    view = ProgressView()
    show = not args.no_progress and console.is_terminal
    signals: list[int] = []

    def checked(found: dict) -> None:
        console.print(f"agentload: preflight ok: model {found['model']}, one-token call in "
                      f"{1000 * found['latency_s']:.0f} ms", highlight=False, soft_wrap=True)

    options = dict(on_progress=view.update, preflight=not args.no_preflight, on_preflight=checked,
                   on_signal=signals.append)
    sharded = args.ray is not None or scenario.run.workers is not None
    if sharded and scenario.fleet is not None:
        from ..errors import InputError

        raise InputError("a fleet runs from this process: leave out --ray and run.workers", file=scenario.source,
                         path="fleet")
    if sharded:  # over Ray (simulator.scale): the same result, plus where Ray ran it
        from ..pipeline.sharded import ShardedExecutor

        executor = ShardedExecutor(address=args.ray or None, **options)
    elif scenario.fleet is not None:  # replicas behind a router (simulator.fleet)
        from ..fleet.launch import fleet_text
        from ..pipeline.fleet_live import FleetLiveExecutor

        executor = FleetLiveExecutor(on_fleet=lambda fleet: console.print(
            f"agentload: fleet up: {fleet_text(fleet)}", highlight=False, soft_wrap=True, markup=False), **options)
    else:
        executor = LiveExecutor(**options)
    plan = plan_run(scenario, workload, Path(folder))
    try:
        # asyncio's own loop, not uvloop: its reads go through the socket objects, which keep the
        # kernel's receive stamps (`simulator.rx_stamps`)
        with asyncio.Runner() as runner, Live(view, console=console, refresh_per_second=4,
                                                 transient=False) if show else _Null() as _:
            summary, _ = runner.run(execute_async(plan, executor))
    except PreflightError as exc:
        console.print(f"agentload: error: preflight: {exc}; no result folder was made", highlight=False,
                      soft_wrap=True, markup=False)
        return PREFLIGHT_FAILED
    except RunAborted as exc:
        console.print(f"agentload: {exc}; nothing measured, no result folder was made", highlight=False,
                      soft_wrap=True)
        return SIGNALLED + exc.signum
    print_summary(summary)
    if sharded:
        from ..scale.report import print_shards

        print_shards(summary, Console())
    if summary.fleet is not None:
        from ..report.fleet import print_fleet
        from ..report.terminal import output_console

        print_fleet(summary, output_console())
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
    """The lines printed before a run: what is replayed against what (the built-in emulator with the
    timing it runs, and a warning when that is a zero-latency server), how long its arrivals last, about
    how long it will take, and where the results will go once the target passed its checks (URL
    credentials masked)."""
    from ..emulator.settings import describe_timing, is_zero_latency
    from ..live.run_length import run_length, scenario_run_length
    from ..redact import mask_url
    from ..workload import describe_seconds

    tasks, calls, subtasks = workload.counts()
    emulator = scenario.emulator if scenario.target is None and scenario.fleet is None else None
    length = scenario_run_length(scenario, workload) if scenario.fleet is None else run_length(workload, scenario.run)
    span = length.last_arrival - length.first_arrival
    cut = f" (run.duration starts {length.tasks} of them)" if length.tasks < tasks else ""
    if emulator is None:
        estimate = (f"run of at least {describe_seconds(length.estimate)} "
                    "(arrivals, then tool/think time; the server's time comes on top)")
        if scenario.fleet is None:
            target = mask_url(scenario.target.base_url)
        else:
            from ..fleet.launch import fleet_spec_text

            target = fleet_spec_text(scenario.fleet)
    else:
        estimate = (f"run of about {describe_seconds(length.estimate)} (arrivals, tool/think time and each "
                    "call's time on the idle emulator; queueing under load comes on top)")
        target = f"built-in emulator, {describe_timing(emulator)}"
    line = (f"agentload: {scenario.display_name()}: {tasks} tasks{cut}, {calls} calls, {subtasks} sub-agents; "
            f"arrivals over {describe_seconds(span)}, {estimate}; target: {target}; "
            f"results will go to {folder}")
    if emulator is not None and is_zero_latency(emulator):
        line += ("\nagentload: warning: ZERO-LATENCY SERVER: the emulator answers every call at once, so its "
                 "times measure agentload and this machine, not a server (leave out the zero timing for the "
                 "default timing, or set emulator.profile)")
    return line


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
