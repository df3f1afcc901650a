"""`agentload run SCENARIO`: replay a scenario live, show progress, print and save the summary."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from rich.console import Console
from rich.live import Live


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run",
        help="replay a scenario against a server (or the built-in emulator) and measure it",
        description="Replay a scenario file live. Without a `target` in the scenario, the built-in "
        "emulator is started and used. Ctrl-C stops the run cleanly and keeps partial results.",
    )
    parser.add_argument("scenario", help="scenario YAML file (see docs/scenario.md)")
    parser.add_argument("-o", "--output", metavar="DIR", help="result folder (default: run.output/<name>-<time>)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a scenario setting, e.g. --set run.max_tasks=5 (repeatable)")
    parser.add_argument("--no-progress", action="store_true", help="no live progress display")
    parser.set_defaults(func=run_command)


def event_loop_runner() -> asyncio.Runner:
    """An asyncio runner on uvloop when it is installed."""
    try:
        import uvloop
    except ImportError:
        return asyncio.Runner()
    return asyncio.Runner(loop_factory=uvloop.new_event_loop)


def run_command(args: argparse.Namespace) -> int:
    from .. import scenario as scenario_mod
    from ..live.runner import result_folder, run_scenario
    from ..report.progress import ProgressView
    from ..report.terminal import print_summary

    scenario = scenario_mod.load(args.scenario, args.overrides)
    workload = scenario_mod.load_workload(scenario)
    folder = result_folder(scenario, args.output)
    console = Console(stderr=True)
    tasks, calls, subtasks = workload.counts()
    console.print(f"agentload: {scenario.display_name()}: {tasks} tasks, {calls} calls, {subtasks} sub-agents; "
                  f"target: {scenario.target.base_url if scenario.target else 'built-in emulator'}; "
                  f"results: {folder}")
    view = ProgressView()
    show = not args.no_progress and console.is_terminal
    with event_loop_runner() as runner, Live(view, console=console, refresh_per_second=4,
                                             transient=False) if show else _Null() as _:
        summary, outcome = runner.run(run_scenario(scenario, workload, Path(folder), on_progress=view.update))
    print_summary(summary, Console())
    if outcome.stop_reason == "interrupted":
        print("agentload: interrupted; partial results saved", file=sys.stderr)
        return 130
    return 0


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
