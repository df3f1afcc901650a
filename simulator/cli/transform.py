"""`agentload transform IN... -o OUT.jsonl --time-scale ...`: apply workload transforms to traces."""

from __future__ import annotations

import argparse

from ..errors import InputError
from .trace import add_input_options


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `transform` command."""
    p = subparsers.add_parser(
        "transform", help="rescale, cap, filter or sample a workload",
        description="Read traces as one workload, change it and write it as a native JSONL trace. The "
        "transforms run in a fixed order: classes, sample, rate (--rate-scale or --rate), arrivals "
        "(--burstiness), time, gaps, gap cap, tokens; prefix sharing survives token scaling. See "
        "docs/workload-model.md, 'Transforms'.")
    p.add_argument("paths", nargs="+", metavar="IN", help="trace files or folders (read as one workload)")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the native JSONL trace to write")
    add_input_options(p)
    p.add_argument("--seed", type=int, default=0, help="seed for --sample, --rate-mode overlay and --burstiness")
    p.add_argument("--time-scale", type=float, help="multiply arrival times (2 = half the rate, same pattern)")
    p.add_argument("--gap-scale", type=float, help="multiply the gaps before calls")
    p.add_argument("--rate-scale", type=float, help="tasks per second x this, burstiness kept")
    p.add_argument("--rate", type=float, metavar="TASKS_PER_S",
                   help="top-level tasks per second: the arrivals rescaled to it (arrivals that span no time are "
                   "re-spaced as a Poisson process at it)")
    p.add_argument("--rate-mode", choices=("compress", "overlay"), help="compress time (default) or overlay shifted copies")
    p.add_argument("--burstiness", type=float, metavar="B",
                   help="re-space the arrivals as a gamma renewal process of shape B at --rate or the workload's "
                   "own rate, seeded (1 Poisson, lower burstier, as vllm bench serve --burstiness)")
    p.add_argument("--gap-cap", type=float, metavar="S", help="cut longer gaps to S seconds")
    p.add_argument("--token-scale", type=float, help="multiply input and output tokens")
    p.add_argument("--context-cap", type=int, metavar="TOKENS", help="most input + output tokens of a call")
    p.add_argument("--classes", metavar="A,B", help="keep only these task classes")
    p.add_argument("--sample", type=int, metavar="N", help="keep N tasks (seeded)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from ..traces import load, native
    from ..transforms import TransformSpec, apply

    fields = ("time_scale", "gap_scale", "rate_scale", "rate", "rate_mode", "burstiness", "gap_cap", "token_scale",
              "context_cap", "sample")
    given = {k: getattr(args, k) for k in fields if getattr(args, k) is not None}
    if args.classes:
        given["classes"] = [c for c in args.classes.split(",") if c]
    try:
        spec = TransformSpec(**given)
    except ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else ""
        raise InputError(first["msg"].removeprefix("Value error, "), file="command line",
                         field="--" + name.replace("_", "-") if name else None) from None
    workload = load(args.paths, args.format, args.on_error, args.assume_append_only)
    try:
        workload = apply(workload, spec, seed=args.seed)
    except InputError as exc:  # a transform's field is this command's option
        exc.file = exc.file or "command line"
        exc.field = "--" + exc.field.replace("_", "-") if exc.field else None
        raise
    native.write(workload, args.output)
    tasks, calls, _ = workload.counts()
    print(f"wrote {tasks} tasks, {calls} calls -> {args.output}")
    return 0
