"""`agentload calibrate`: fit a server profile's step-time coefficients to a real server (or check the
fit on a twin) by running a designed sweep of request bursts."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from ..calibration.pipeline import MeasuredSweep, SweepMeasure
    from ..sim.profile import ServerProfile


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        help="fit a server profile's step-time coefficients by measuring a sweep on a server",
        description="Run a sweep of request bursts (prefill: one request of growing prompt, after a pause, "
        "after one of the same length, of a prompt already cached, and bursts of several at once; decode: "
        "growing batches at short and long context, single requests at more contexts; loaded: short calls "
        "and long prefills sent while streams decode; measured: TTFT and end-to-end latency) against a "
        "server, fit the step-time coefficients (among them the cost of a step of a size not run lately) "
        "and the request's handling outside the engine (the API server's one-at-a-time work "
        "per request and per streamed token, and plain latency) by non-negative least squares with the "
        "twin as the model, and write the calibrated profile. The base profile gives the scheduler and KV "
        "settings, which must match how the server was started. See docs/server-twin.md.",
    )
    parser.add_argument("-p", "--profile", required=True, metavar="PROFILE",
                        help="base profile (preset name or YAML file) with the server's settings")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--target", metavar="URL", help="server to measure, e.g. http://127.0.0.1:8000")
    source.add_argument("--twin", action="store_true",
                        help="measure the twin of the base profile itself (checks that the fit recovers it)")
    source.add_argument("--power-from", nargs="+", metavar="DIR",
                        help="fit the profile's power model (idle and busy watts per GPU, joules per token) to "
                        "the NVML samples of these live runs' result folders (run with target.gpu_metrics: "
                        "true), instead of its step times")
    parser.add_argument("--model", help="model name to send (default: the server's first)")
    parser.add_argument("--vocab-size", type=int, default=32000,
                        help="the model's vocabulary size: prompt token ids are drawn below it (tiny test model: 1024)")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="the calibrated profile (YAML) to write (default: none; the fit is printed)")
    parser.add_argument("--name", help="name of the calibrated profile (default: <base>-calibrated)")
    parser.add_argument("--max-concurrency", type=int,
                        help="largest burst of the decode sweep (and most streams under the loaded points' calls)")
    parser.add_argument("--max-prompt", type=int, help="longest prompt of the sweep")
    parser.add_argument("--repeat", type=int, default=3, help="measurements per point, reduced by --statistic")
    parser.add_argument("--statistic", choices=("median", "min"), default="median",
                        help="how a point's repeats are reduced: median, or min (the server's own cost "
                        "when other processes share its CPUs and only ever add delay)")
    parser.set_defaults(func=calibrate_command)


def calibrate_command(args: argparse.Namespace) -> int:
    import statistics

    from ..calibration.drift import trend_text
    from ..calibration.pipeline import calibrate, on_twin
    from ..calibration.report import calibrate_comments, profile_text
    from ..calibration.sweep import design_sweep
    from ..errors import InputError
    from ..redact import mask_url
    from ..sim.profile import load_profile

    base = load_profile(args.profile)
    if args.power_from:
        return _calibrate_power(args, base)
    if args.repeat < 1:
        raise InputError("must be at least 1", field="--repeat")
    points = design_sweep(base, max_concurrency=args.max_concurrency, max_prompt=args.max_prompt)
    if not points:
        raise InputError("the sweep is empty with these limits", field="--max-prompt")
    conditions = "exact"
    if args.twin:
        source = f"twin of {base.name}"
        calibration = calibrate(base, points, on_twin(base))
    else:
        source = mask_url(args.target)
        reduce = statistics.median if args.statistic == "median" else min
        load_before = _load_average()

        def shown(measured: MeasuredSweep) -> None:
            nonlocal conditions
            _show_rounds(measured)
            usable = measured.usable
            conditions = (f"{args.statistic} of {args.repeat} repeats, rounds' trend {trend_text(measured.trend)}, "
                          f"load average {load_before} before and {_load_average()} after")
            if usable.skipped:
                conditions += f", {len(usable.skipped)} of {usable.designed} points not measured"

        calibration = calibrate(base, points, _measure_live(args, base, reduce), reduce=reduce,
                                server=mask_url(args.target), on_measured=shown)
    result = calibration.result
    print(f"calibration of {base.name} against {source} ({conditions}): {len(result.points)} sweep points")
    print(calibration.report_text())
    if args.output:
        name = args.name or f"{base.name}-calibrated"
        profile = calibration.profile.model_copy(update={
            "name": name, "source": f"agentload calibrate ({conditions}) against {source}",
            "description": base.description if base.calibrated else f"{base.description} (calibrated)".strip()})
        comments = calibrate_comments(result.rms_relative_error, calibration.measured.usable.skipped_text())
        with open(args.output, "w", encoding="utf-8") as out:
            out.write(profile_text(profile, comments))
        print(f"wrote {args.output}", file=sys.stderr)
    return 0


def _calibrate_power(args: argparse.Namespace, base: ServerProfile) -> int:
    """The base profile's power model fitted to the NVML samples of the --power-from folders; the fit
    printed, and with -o the profile written with it."""
    from pathlib import Path

    from ..calibration.power import fit_power, read_intervals
    from ..calibration.report import profile_text

    folders = [Path(folder) for folder in args.power_from]
    fit = fit_power(read_intervals(folders), source=f"agentload calibrate --power-from {' '.join(args.power_from)}")
    print(f"power calibration of {base.name} from {len(folders)} run(s)")
    print(fit.report())
    if args.output:
        profile = base.model_copy(update={"name": args.name or f"{base.name}-power", "power": fit.power})
        with open(args.output, "w", encoding="utf-8") as out:
            out.write(profile_text(profile, [f"Power model fitted by `agentload calibrate --power-from` "
                                             f"(rms {fit.rms_w:.1f} W over {fit.intervals:,} intervals)."]))
        print(f"wrote {args.output}", file=sys.stderr)
    return 0


def _measure_live(args: argparse.Namespace, base: ServerProfile,
                  reduce: Callable[[list[float]], float]) -> SweepMeasure:
    """The sweep measured on --target (a server set up as `base` says), the rounds, each measurement
    missed and why, and every point's measurements (reduced by `reduce`) shown on stderr."""
    from ..calibration.pipeline import on_server
    from ..live.client import Target

    def round_done(n: int) -> None:
        print(f"  round {n} of {args.repeat} done", file=sys.stderr)

    target = Target(base_url=args.target, model=args.model, vocab_size=args.vocab_size)

    def measure(points):
        def missed(index: int, round_number: int, why: str) -> None:
            print(f"  not measured in round {round_number}: {points[index].label()}: {why}", file=sys.stderr)

        measurements = on_server(target, base, repeat=args.repeat, on_round=round_done, on_missed=missed)(points)
        for point, s in zip(points, measurements.samples):
            taken = [v for v in s if v is not None]
            value = f"{reduce(taken) * 1e3:10.3f} ms" if taken else "  not measured"
            spread = "  ".join("missed" if v is None else f"{v * 1e3:.1f}" for v in s)
            print(f"  {point.label():34s} {value}   (each: {spread})", file=sys.stderr)
        return measurements

    return measure


def _show_rounds(measured: MeasuredSweep) -> None:
    """The rounds' relative times on stderr, with a warning when the server drifted over them."""
    from ..calibration.drift import drift_warning

    print(f"  {measured.rounds_text()}", file=sys.stderr)
    warning = drift_warning(measured.trend)
    if warning:
        print(f"warning: {warning}; calibrate again on a quieter machine, or with more --repeat", file=sys.stderr)


def _load_average() -> str:
    """The 1-minute load average of this machine ('n/a' where the OS has none): a calibration on a
    shared machine is only as good as the machine was quiet."""
    import os

    try:
        return f"{os.getloadavg()[0]:.2f}"
    except (AttributeError, OSError):
        return "n/a"
