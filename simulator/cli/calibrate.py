"""`agentload calibrate`: fit a server profile's step-time coefficients to a real server (or check the
fit on a twin) by running a designed sweep of request bursts."""

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        help="fit a server profile's step-time coefficients by measuring a sweep on a server",
        description="Run a sweep of request bursts (prefill: one request of growing prompt; decode: "
        "growing batches at short and long context) against a server, fit the step-time coefficients by "
        "non-negative least squares and write the calibrated profile. The base profile gives the "
        "scheduler and KV settings, which must match how the server was started.",
    )
    parser.add_argument("-p", "--profile", required=True, metavar="PROFILE",
                        help="base profile (preset name or YAML file) with the server's settings")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--target", metavar="URL", help="server to measure, e.g. http://127.0.0.1:8000")
    source.add_argument("--twin", action="store_true",
                        help="measure the twin of the base profile itself (checks that the fit recovers it)")
    parser.add_argument("--model", help="model name to send (default: the server's first)")
    parser.add_argument("-o", "--output", metavar="FILE", help="write the calibrated profile YAML here")
    parser.add_argument("--name", help="name of the calibrated profile (default: <base>-calibrated)")
    parser.add_argument("--max-concurrency", type=int, help="largest burst of the decode sweep")
    parser.add_argument("--max-prompt", type=int, help="longest prompt of the sweep")
    parser.add_argument("--repeat", type=int, default=3, help="measurements per point; the median is fitted")
    parser.set_defaults(func=calibrate_command)


def calibrate_command(args: argparse.Namespace) -> int:
    import statistics

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
    if args.twin:
        measured = [measure_on_twin(p, base) for p in points]
        source = f"twin of {base.name}"
    else:
        measured = _measure_live(args.target, args.model, points, args.repeat, statistics.median)
        source = args.target
    result = fit(points, measured, base)
    print(f"calibration of {base.name} against {source}: {len(points)} sweep points")
    print(fit_report(result))
    if args.output:
        name = args.name or f"{base.name}-calibrated"
        _write_profile(args.output, result.profile.model_copy(update={
            "name": name, "source": f"agentload calibrate against {source}",
            "description": f"{base.description} (calibrated)".strip()}), result.rms_relative_error)
        print(f"wrote {args.output}", file=sys.stderr)
    return 0


def _measure_live(url, model, points, repeat, reduce) -> list[float]:
    """Each point's burst sent `repeat` times to the server; the reduced value of TTFT or mean ITL."""
    import asyncio
    import time

    from ..behaviour import CallRequest
    from ..errors import InputError
    from ..live.client import Client, Target
    from ..workload import Call

    async def burst(client, index, point, attempt) -> float:
        call = Call(point.input_tokens, point.output_tokens)
        requests = [CallRequest(f"calibrate-{index}-{attempt}-{i}", "calibrate", 0, call)
                    for i in range(point.concurrency)]
        now = time.perf_counter() - client.t0
        done = await asyncio.gather(*(client.send(r, now) for r in requests))
        records = [record for record, _ in done]
        failed = [r for r in records if not r.ok]
        if failed:
            raise InputError(f"calibration call failed: {failed[0].error_class}: {failed[0].error_message}",
                             file=url)
        if point.kind == "prefill":
            return sum(r.ttft for r in records) / len(records)
        itl = [r.itl_mean for r in records if r.itl_mean is not None]
        return sum(itl) / len(itl)

    async def run() -> list[float]:
        async with Client(Target(base_url=url, model=model), time.perf_counter()) as client:
            await burst(client, -1, points[0], 0)  # warm-up
            values = []
            for index, point in enumerate(points):
                values.append(reduce([await burst(client, index, point, a) for a in range(repeat)]))
                print(f"  {point.label():34s} {values[-1] * 1e3:10.3f} ms", file=sys.stderr)
            return values

    return asyncio.run(run())


def _write_profile(path: str, profile, rms: float) -> None:
    import yaml

    data = profile.model_dump(mode="json", exclude_none=True)
    header = (f"# Calibrated by `agentload calibrate` (rms relative error of the fit {rms:.2%}).\n"
              "# Scheduling overhead is folded into the fixed and per-sequence terms.\n")
    with open(path, "w", encoding="utf-8") as out:
        out.write(header + yaml.safe_dump(data, sort_keys=False))
