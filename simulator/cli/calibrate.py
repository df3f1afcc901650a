"""`agentload calibrate`: fit a server profile's step-time coefficients to a real server (or check the
fit on a twin) by running a designed sweep of request bursts."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from ..live.calibration import UsableSweep
    from ..sim.calibrate import SweepPoint
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
    from ..errors import InputError
    from ..sim.calibrate import design_sweep, fit, fit_report, measure_on_twin
    from ..sim.profile import load_profile

    base = load_profile(args.profile)
    if args.repeat < 1:
        raise InputError("must be at least 1", field="--repeat")
    points = design_sweep(base, max_concurrency=args.max_concurrency)
    if args.max_prompt:
        points = [p for p in points if p.input_tokens <= args.max_prompt]
    if not points:
        raise InputError("the sweep is empty with these limits", field="--max-prompt")
    trend = None
    skipped = ""
    if args.twin:
        measured = [measure_on_twin(p, base) for p in points]
        source = f"twin of {base.name}"
        conditions = "exact"
    else:
        from ..live.calibration import trend_text

        load_before = _load_average()
        usable, trend = _measure_live(args, points, base)
        points, measured, skipped = usable.points, usable.values, usable.skipped_text()
        source = args.target
        conditions = (f"{args.statistic} of {args.repeat} repeats, rounds' trend {trend_text(trend)}, load average "
                      f"{load_before} before and {_load_average()} after")
        if usable.skipped:
            conditions += f", {len(usable.skipped)} of {usable.designed} points not measured"
    result = fit(points, measured, base)
    print(f"calibration of {base.name} against {source} ({conditions}): {len(points)} sweep points")
    print(fit_report(result))
    if skipped:
        print(skipped)
    if args.output:
        name = args.name or f"{base.name}-calibrated"
        _write_profile(args.output, result.profile.model_copy(update={
            "name": name, "source": f"agentload calibrate ({conditions}) against {source}",
            "calibration": result.profile.calibration.model_copy(update={"drift": trend}),
            "description": base.description if base.calibrated else f"{base.description} (calibrated)".strip()}),
            result.rms_relative_error, skipped)
        print(f"wrote {args.output}", file=sys.stderr)
    return 0


def _measure_live(args: argparse.Namespace, points: list[SweepPoint],
                  base: ServerProfile) -> tuple[UsableSweep, Optional[float]]:
    """The sweep measured on --target (a server set up as `base` says): the points measured, each one's
    repeats reduced by --statistic, and those left out (`usable_sweep`), and the trend of the rounds'
    times (`speed_trend`); the rounds, each measurement missed and why, every point's measurements and
    the rounds' relative times shown on stderr, with a warning when they drifted."""
    import asyncio
    import statistics

    from ..live.calibration import drift_warning, measure_sweep, rounds_text, round_speeds, speed_trend, usable_sweep
    from ..live.client import Target
    from ..redact import mask_url

    missed: dict[int, list[str]] = {}

    def on_missed(index: int, round_number: int, why: str) -> None:
        missed.setdefault(index, []).append(why)
        print(f"  not measured in round {round_number}: {points[index].label()}: {why}", file=sys.stderr)

    target = Target(base_url=args.target, model=args.model, vocab_size=args.vocab_size)
    samples = asyncio.run(measure_sweep(
        target, points, block_size=base.kv_cache.block_size, scheduler=base.scheduler, repeat=args.repeat,
        on_round=lambda n: print(f"  round {n} of {args.repeat} done", file=sys.stderr), on_missed=on_missed))
    reduce = statistics.median if args.statistic == "median" else min
    for point, s in zip(points, samples):
        taken = [v for v in s if v is not None]
        value = f"{reduce(taken) * 1e3:10.3f} ms" if taken else "  not measured"
        spread = "  ".join("missed" if v is None else f"{v * 1e3:.1f}" for v in s)
        print(f"  {point.label():34s} {value}   (each: {spread})", file=sys.stderr)
    usable = usable_sweep(points, samples, missed, reduce, server=mask_url(args.target))
    speeds = round_speeds(samples)
    trend = speed_trend(speeds)
    print(f"  {rounds_text(speeds, trend)}", file=sys.stderr)
    warning = drift_warning(trend)
    if warning:
        print(f"warning: {warning}; calibrate again on a quieter machine, or with more --repeat", file=sys.stderr)
    return usable, trend


def _load_average() -> str:
    """The 1-minute load average of this machine ('n/a' where the OS has none): a calibration on a
    shared machine is only as good as the machine was quiet."""
    import os

    try:
        return f"{os.getloadavg()[0]:.2f}"
    except (AttributeError, OSError):
        return "n/a"


def _write_profile(path: str, profile, rms: float, skipped: str = "") -> None:
    import yaml

    data = profile.model_dump(mode="json", exclude_none=True)
    header = (f"# Calibrated by `agentload calibrate` (rms relative error of the fit {rms:.2%}).\n"
              "# Scheduling overhead is folded into the fixed and per-sequence terms; the API server's\n"
              "# one-at-a-time work per request is frontend_per_request (+ frontend_per_prompt_token per\n"
              "# prompt token), per streamed token frontend_per_output_token; other time outside the engine\n"
              "# request_overhead.\n")
    header += "".join(f"# {line}\n" for line in skipped.splitlines())
    with open(path, "w", encoding="utf-8") as out:
        out.write(header + yaml.safe_dump(data, sort_keys=False))
