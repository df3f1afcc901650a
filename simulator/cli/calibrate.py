"""`agentload calibrate`: fit a server profile's step-time coefficients to a real server (or check the
fit on a twin) by running a designed sweep of request bursts."""

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        help="fit a server profile's step-time coefficients by measuring a sweep on a server",
        description="Run a sweep of request bursts (prefill: one request of growing prompt, after a pause, "
        "of a prompt already cached, and bursts of several at once; decode: growing batches at short and "
        "long context, single requests at more contexts; measured: TTFT and end-to-end latency) against a "
        "server, fit the step-time coefficients and the request's handling outside the engine (the API "
        "server's one-at-a-time work and plain latency) by non-negative least squares with the twin as "
        "the model, and write the calibrated profile. The base profile gives the scheduler and KV "
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
    parser.add_argument("-o", "--output", metavar="FILE", help="write the calibrated profile YAML here")
    parser.add_argument("--name", help="name of the calibrated profile (default: <base>-calibrated)")
    parser.add_argument("--max-concurrency", type=int, help="largest burst of the decode sweep")
    parser.add_argument("--max-prompt", type=int, help="longest prompt of the sweep")
    parser.add_argument("--repeat", type=int, default=3, help="measurements per point, reduced by --statistic")
    parser.add_argument("--statistic", choices=("median", "min"), default="median",
                        help="how a point's repeats are reduced: median, or min (the server's own cost "
                        "when other processes share its CPUs and only ever add delay)")
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
        conditions = "exact"
    else:
        reduce = statistics.median if args.statistic == "median" else min
        load_before = _load_average()
        measured = _measure_live(args.target, args.model, args.vocab_size, points, args.repeat, reduce,
                                 base.kv_cache.block_size)
        source = args.target
        conditions = (f"{args.statistic} of {args.repeat} repeats, load average {load_before} before and "
                      f"{_load_average()} after")
    result = fit(points, measured, base)
    print(f"calibration of {base.name} against {source} ({conditions}): {len(points)} sweep points")
    print(fit_report(result))
    if args.output:
        name = args.name or f"{base.name}-calibrated"
        _write_profile(args.output, result.profile.model_copy(update={
            "name": name, "source": f"agentload calibrate ({conditions}) against {source}",
            "description": base.description if base.calibrated else f"{base.description} (calibrated)".strip()}),
            result.rms_relative_error)
        print(f"wrote {args.output}", file=sys.stderr)
    return 0


def _measure_live(url, model, vocab_size, points, repeat, reduce, block_size, seed=0) -> list[float]:
    """Each point's burst sent `repeat` times to the server, in shuffled rounds; per point, the reduced
    value of its TTFT (prefill) or mean end-to-end latency (decode). A cached point's prompts are made
    of `block_size` blocks (the server's) of their own hash ids, and sent once untimed before the burst."""
    import asyncio
    import os
    import time

    import numpy as np

    from ..behaviour import CallRequest
    from ..errors import InputError
    from ..live.client import Client, Target
    from ..live.prompts import stable_id
    from ..sim.calibrate import cached_prompts
    from ..workload import Call

    def check(done) -> list:
        """The call records of a burst's sends; InputError at the first that failed."""
        records = [record for record, _ in done]
        for r in records:
            if not r.ok:
                raise InputError(f"calibration call failed: {r.error_class}: {r.error_message}", file=url)
        return records

    async def burst(client, index, point, attempt) -> float:
        # The nonce keeps prompts unique across runs against one server: no prefix-cache hits, but
        # for a cached point's own warm-up.
        key = f"calibrate-{nonce}-{index}-{attempt}"
        calls = [Call(point.input_tokens, point.output_tokens)] * point.concurrency
        if point.cached:
            prompts = cached_prompts(point, block_size, first=stable_id(key) & ((1 << 62) - 1))
            calls = [Call(point.input_tokens, point.output_tokens, hash_ids=ids, block_size=block_size)
                     for ids in prompts]
            warm_ups = [CallRequest(f"{key}-warm-{i}", "calibrate", 0,
                                    Call(point.input_tokens, 1, hash_ids=ids, block_size=block_size))
                        for i, ids in enumerate(prompts)]
            now = time.perf_counter() - client.t0
            check(await asyncio.gather(*(client.send(r, now) for r in warm_ups)))
        requests = [CallRequest(f"{key}-{i}", "calibrate", 0, call) for i, call in enumerate(calls)]
        if point.idle:
            await asyncio.sleep(point.idle)  # a pause to time: nothing else runs on this loop meanwhile
        now = time.perf_counter() - client.t0
        records = check(await asyncio.gather(*(client.send(r, now) for r in requests)))
        if point.kind == "prefill":
            return sum(r.ttft for r in records) / len(records)
        # End to end, not per chunk: a busy API server merges tokens into one chunk, which moves
        # the first token late and shortens the gaps, but not the end.
        return sum(r.latency for r in records) / len(records)

    nonce = f"{os.getpid()}-{time.time_ns()}"

    async def run() -> list[float]:
        # Each round measures every point once, in a new seeded random order: a drift of the server's
        # speed (other work on a shared machine) spreads over all terms instead of biasing the terms
        # measured last.
        rng = np.random.default_rng(seed)
        samples: list[list[float]] = [[] for _ in points]
        async with Client(Target(base_url=url, model=model, vocab_size=vocab_size), time.perf_counter()) as client:
            await burst(client, -1, points[0], 0)  # warm-up
            for attempt in range(repeat):
                for index in rng.permutation(len(points)):
                    samples[index].append(await burst(client, int(index), points[index], attempt))
                print(f"  round {attempt + 1} of {repeat} done", file=sys.stderr)
        values = [reduce(s) for s in samples]
        for point, value, s in zip(points, values, samples):
            spread = "  ".join(f"{v * 1e3:.1f}" for v in s)
            print(f"  {point.label():34s} {value * 1e3:10.3f} ms   (each: {spread})", file=sys.stderr)
        return values

    return asyncio.run(run())


def _load_average() -> str:
    """The 1-minute load average of this machine ('n/a' where the OS has none): a calibration on a
    shared machine is only as good as the machine was quiet."""
    import os

    try:
        return f"{os.getloadavg()[0]:.2f}"
    except (AttributeError, OSError):
        return "n/a"


def _write_profile(path: str, profile, rms: float) -> None:
    import yaml

    data = profile.model_dump(mode="json", exclude_none=True)
    header = (f"# Calibrated by `agentload calibrate` (rms relative error of the fit {rms:.2%}).\n"
              "# Scheduling overhead is folded into the fixed and per-sequence terms; the API server's\n"
              "# one-at-a-time work per request is frontend_per_request (+ frontend_per_prompt_token per\n"
              "# prompt token), other time outside the engine request_overhead.\n")
    with open(path, "w", encoding="utf-8") as out:
        out.write(header + yaml.safe_dump(data, sort_keys=False))
