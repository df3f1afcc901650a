"""`agentload study STUDY.yaml`: server configs compared under the same agent load (docs/study.md)."""

from __future__ import annotations

import argparse

from .report import add_output_options, write_outputs


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "study",
        help="compare server configs under agent load: sweep, capacity within the task SLO, cost, quality",
        description="Run a study file: every config (servers agentload launches, existing URLs, the built-in "
        "emulator, or twin profiles) meets the same seeded workload at each load point and in a capacity "
        "search; prints the table and writes study.json in the study folder. Started again on the same "
        "folder, a study keeps the points it finished and runs the rest. See docs/study.md.",
    )
    parser.add_argument("study", help="study YAML file")
    parser.add_argument("-o", "--output", metavar="DIR", help="study folder (default: the file's `output`, "
                        "else results/<name>)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a study setting, e.g. --set repeats=3 (repeatable)")
    parser.add_argument("--twin", action="store_true",
                        help="run every config on the twin (its profile, or twin.profile plus its overlay)")
    parser.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                        help="run independent points (twin configs', the built-in emulator's) as Ray tasks at once "
                        "on the cluster at ADDRESS (default: RAY_ADDRESS, a local `ray start`, else a new local one); "
                        "the folder and study.json are as without. Needs pip install 'agentload[ray]'; see docs/study.md")
    parser.add_argument("--fail-on-slo", action="store_true",
                        help="exit with code 4 when a config missed the SLO at the ranking load (without a sweep: "
                        "when no rate of its capacity search held)")
    add_output_options(parser, "STUDY_DIR/report.html")
    parser.set_defaults(func=study_command)


def study_command(args: argparse.Namespace) -> int:
    """Run the study, print its table; exit 1 when points failed, 4 with --fail-on-slo when a config
    missed the SLO, 130 when interrupted."""
    from pathlib import Path

    from rich.console import Console

    from ..metrics.verdict import SLO_MISSED
    from ..report.study_terminal import print_study
    from ..report.terminal import output_console
    from ..study import schema
    from ..study.model import STUDY_FILE, save_study
    from ..study.result import build
    from ..study.runner import StudyRunner
    from ..study.state import StudyState
    from ..study.verdict import slo_misses

    spec = schema.load(args.study, args.overrides)
    folder = Path(args.output or spec.output or Path("results") / spec.display_name())
    runner = StudyRunner(spec, folder, twin_only=args.twin, ray=args.ray)
    console = Console(stderr=True)
    console.print(f"agentload study {spec.display_name()}: {len(runner.configs)} configs; folder {folder}",
                  highlight=False, soft_wrap=True)
    for note in spec.notes:
        console.print(f"agentload: note: {note}", highlight=False, soft_wrap=True)

    def write(state: StudyState) -> None:
        save_study(folder, build(state))

    try:
        final = runner.run(write)
    except KeyboardInterrupt:
        console.print(f"agentload: study interrupted; finished points kept in {folder} (run it again to go on)")
        return 130
    study = build(final)
    print_study(study, output_console())
    print(f"study.json: {folder / STUDY_FILE}")
    write_outputs(args, [folder])
    if study.failed_points:
        return 1
    if args.fail_on_slo:
        missed = slo_misses(study)
        if missed:
            console.print("agentload: SLO missed: " + "; ".join(missed) + f" (exit code {SLO_MISSED})",
                          highlight=False, soft_wrap=True, markup=False)
            return SLO_MISSED
    return 0
