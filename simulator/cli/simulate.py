"""`agentload simulate SCENARIO --profile P` (or a trace and flags instead of SCENARIO): predict a scenario on
the server twin, print and save the summary; the exit code as `run`'s (`simulator.metrics.verdict`)."""

from __future__ import annotations

import argparse

from ._options import SIMULATE_EXIT_CODES, add_verdict_options, whole_number
from ._quick import add_scenario_options, load_scenario, save_if_asked
from .report import add_output_options, write_outputs

DEFAULT_DRAWS = 8
"""`simulator.sim.band.DEFAULT_DRAWS`, here without importing the twin at every start of the command line
(tests/test_band.py holds the two equal)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="predict a scenario on the SimPy twin of a server profile (no server needed)",
        description="Replay a scenario's workload in simulated time on the server twin of a profile "
        "(a preset name or a profile YAML file) and write the same result folder and summary as "
        "`agentload run`. The scenario is a file, or a trace or workload model described by flags (--trace, "
        "--rate, --concurrency, --burstiness, --slo, ...). The scenario's target and emulator settings are "
        "ignored.",
        epilog=SIMULATE_EXIT_CODES,
    )
    add_scenario_options(parser, live=False)
    parser.add_argument("-p", "--profile", metavar="PROFILE",
                        help="server profile: a preset name (list them with `agentload profiles`) or a YAML file; "
                        "required unless the scenario has a `fleet`, whose replicas are then its profile's twins "
                        "(fleet.profile, else its emulator's)")
    parser.add_argument("-o", "--output", metavar="DIR",
                        help="the result folder to write (default: RUN.OUTPUT/NAME-sim-YYYYmmdd-HHMMSS, i.e. "
                        "results/<scenario name>-sim-<time>)")
    parser.add_argument("--approx-itl", action="store_true",
                        help="build the ITL histogram from each call's ITL mean (faster on big runs) "
                        "instead of every gap")
    parser.add_argument("--band-draws", type=whole_number, default=DEFAULT_DRAWS, metavar="N",
                        help="simulations on profiles drawn from the calibration's fit beside the nominal one, "
                        "whose range is the band printed and saved with the task-level figures (default "
                        f"{DEFAULT_DRAWS}: 1 + {DEFAULT_DRAWS} simulations in all; 0: no band; an uncalibrated "
                        "profile has none)")
    add_verdict_options(parser)
    add_output_options(parser, "RESULT_DIR/report.html")
    parser.set_defaults(func=simulate_command)

    profiles = subparsers.add_parser(
        "profiles", help="list the server-profile presets of the twin",
        description="List the server-profile presets that `agentload simulate -p`, `calibrate -p`, a "
        "scenario's emulator.profile and a study's twin configs take by name, with their description and "
        "whether (and how well) they were calibrated against a real server.")
    profiles.set_defaults(func=profiles_command)


def simulate_command(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rich.console import Console

    from .. import scenario as scenario_mod
    from ..metrics.verdict import verdict
    from ..pipeline.execute import execute
    from ..pipeline.plan import plan_run, result_folder
    from ..report.coverage import coverage_lines
    from ..report.terminal import band_lines, print_summary
    from ..errors import InputError
    from ..sim.profile import load_profile
    from ..pipeline.twin import TwinExecutor

    profile = load_profile(args.profile) if args.profile is not None else None
    scenario = load_scenario(args, profile=args.profile)
    fleet = scenario.fleet
    if profile is None:
        name = fleet.twin_profile() if fleet is not None else None
        if name is None:
            raise InputError("no server profile to simulate: give -p PROFILE" + (
                " or the fleet's `profile`" if fleet is not None else ""), file=scenario.source,
                path="fleet.profile" if fleet is not None else None)
        profile = load_profile(name)
    workload = scenario_mod.load_workload(scenario)
    save_if_asked(args, scenario)
    folder = result_folder(scenario, args.output, kind="sim")
    plan = plan_run(scenario, workload, folder)
    console = Console(stderr=True)
    tasks, calls, subtasks = workload.counts()
    on = (f"{fleet.replicas} replicas of profile {profile.name} behind the {fleet.router.policy} router model"
          if fleet is not None else f"profile {profile.name}")
    console.print(f"agentload: {scenario.display_name()}: {tasks} tasks, {calls} calls, {subtasks} sub-agents; "
                  f"simulated on {on}"
                  f"{'' if profile.calibrated else ' (uncalibrated)'}; results: {folder}")
    if fleet is not None:
        from ..pipeline.fleet_twin import FleetTwinExecutor

        executor: object = FleetTwinExecutor(fleet, profile, keep_gaps=not args.approx_itl)
    else:
        executor = TwinExecutor(profile, keep_gaps=not args.approx_itl, band_draws=args.band_draws)
    summary, _ = execute(plan, executor)  # type: ignore[arg-type]
    print_summary(summary)
    sim = summary.simulation
    console.print(f"simulated {sim.simulated_seconds:.1f} s in {sim.wall_seconds:.2f} s of wall time; "
                  f"{sim.steps} engine steps, {sim.preemptions} preemptions")
    console.print(f"profile {profile.name}: {sim.uncertainty}", highlight=False)
    for line in coverage_lines(sim):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    no_band = ("no band: not computed for a fleet" if fleet is not None
               else "no band: switched off (--band-draws 0)" if not args.band_draws else None)
    for line in band_lines(sim.band) if no_band is None else [no_band]:
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    write_outputs(args, [Path(folder)])
    result = verdict(summary, max_failed_share=args.max_failed_share, fail_on_slo=args.fail_on_slo)
    if result.reason:
        console.print(f"agentload: {result.reason} (exit code {result.code})", highlight=False, soft_wrap=True,
                      markup=False)
    return result.code


def profiles_command(args: argparse.Namespace) -> int:
    from ..sim.profile import load_profile, preset_names

    for name in preset_names():
        profile = load_profile(name)
        record = profile.calibration
        mark = ("  [uncalibrated]" if not profile.calibrated
                else f"  [calibrated: {record.rms_relative_error:.1%} rms]" if record is not None else "")
        print(f"{name:36s} {profile.description}{mark}")
    return 0
