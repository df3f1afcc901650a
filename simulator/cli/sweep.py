"""`agentload sweep`: a server (or the emulator, or a twin profile) from light load to saturation, per
task, without a study file (`simulator.study.sweep`)."""

from __future__ import annotations

import argparse

from ._options import count
from ._quick import add_scenario_options, load_scenario
from .report import add_output_options, write_outputs

DEFAULT_POINTS = 5


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "sweep",
        help="sweep a server from light load to saturation, per task, without a study file",
        description="Find how a server behaves from light load to saturation under a workload, as GuideLLM's "
        "default sweep does, per agent task: the workload's tasks run one at a time and then all at once "
        "(the two anchors), then --points arrival rates evenly between their throughputs, each an ordinary "
        "run judged against the SLO. The workload is a scenario file or a trace or workload model described "
        "by flags; the server is the scenario's target (--target), the built-in emulator, or with -p the "
        "twin of a profile. Prints each point per task and the highest rate that held the SLO; the folder "
        "holds two ordinary studies (anchors/ and rates/), which `agentload report` reads.",
    )
    add_scenario_options(parser, live=True)
    parser.add_argument("-p", "--profile", metavar="PROFILE",
                        help="sweep the twin of this server profile (a preset name or a YAML file) instead of a "
                        "live server")
    parser.add_argument("--points", type=count, default=DEFAULT_POINTS, metavar="N",
                        help="arrival rates between the two anchors, both ends included")
    parser.add_argument("--repeats", type=count, default=1, metavar="N", help="runs of each rate (seeds K, K+1, ...)")
    parser.add_argument("-o", "--output", metavar="DIR",
                        help="the sweep's folder (default: RUN.OUTPUT/NAME-sweep, i.e. results/<scenario name>-sweep); "
                        "the same command on the same folder resumes it")
    parser.add_argument("--fail-on-slo", action="store_true",
                        help="exit with code 4 when no rate of the sweep held every SLO target")
    add_output_options(parser, "DIR/rates/report.html")
    parser.set_defaults(func=sweep_command)


def sweep_command(args: argparse.Namespace) -> int:
    """Run the sweep; print its points and verdict."""
    import shlex
    from pathlib import Path

    from rich.console import Console

    from .. import quick
    from .. import scenario as scenario_mod
    from ..metrics.verdict import SLO_MISSED
    from ..report.cells import number
    from ..report.study_terminal import points_grid
    from ..report.terminal import output_console
    from ..study.sweep import RATES, SCENARIO_FILE, run_sweep

    scenario = load_scenario(args, profile=args.profile)
    workload = scenario_mod.load_workload(scenario)
    folder = Path(args.output or Path(scenario.run.output) / f"{scenario.display_name()}-sweep")
    console = Console(stderr=True)
    scenario_file = (folder / SCENARIO_FILE).resolve()
    quick.save(scenario, scenario_file, shlex.join(getattr(args, "argv", []) or []), profile=args.profile)

    def say(line: str) -> None:
        console.print(line, highlight=False, soft_wrap=True, markup=False)

    try:
        sweep = run_sweep(scenario, workload, scenario_file, folder, points=args.points, profile=args.profile,
                          repeats=args.repeats, say=say)
    except KeyboardInterrupt:
        say(f"agentload: sweep interrupted; finished points kept in {folder} (run the same command again to go on)")
        return 130
    out = output_console()
    for table in points_grid(sweep.study).tables(out.width):
        out.print(table)
    out.print(f"one task at a time: {number(sweep.one_at_a_time_per_hour)} tasks/h completed; all at once: "
              f"{number(sweep.all_at_once_per_hour)} tasks/h", highlight=False, soft_wrap=out.width >= 10_000)
    held = [p.offered_per_hour for c in sweep.study.configs for p in c.points
            if p.verdict == "held" and p.offered_per_hour is not None]
    judged = any(p.verdict is not None for c in sweep.study.configs for p in c.points)
    if judged:
        out.print(f"highest rate that held every SLO target: {number(max(held))} tasks/h" if held
                  else "no rate held every SLO target", highlight=False)
    print(f"study.json: {folder / RATES / 'study.json'}")
    write_outputs(args, [folder / RATES])
    if sweep.study.failed_points:
        return 1
    if args.fail_on_slo and judged and not held:
        say(f"agentload: SLO missed at every rate of the sweep (exit code {SLO_MISSED})")
        return SLO_MISSED
    return 0
