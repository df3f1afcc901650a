"""`agentload generate MODEL.yaml --tasks N | --duration S --seed K -o synthetic.jsonl`."""

from __future__ import annotations

import argparse
import time

from ._options import positive


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `generate` command."""
    p = subparsers.add_parser(
        "generate", help="generate a synthetic workload (native JSONL) from a model",
        description="Draw a synthetic workload from a workload model (written by `agentload fit`): arrivals "
        "from each class's fitted process (or a gamma renewal process with --burstiness), task structure, "
        "tokens, gaps, prefix reuse and sub-agents from the model; written as a native JSONL trace. The same "
        "model, seed and options give the same file, byte for byte. See docs/workload-model.md.")
    p.add_argument("model", metavar="MODEL.yaml", help="workload model written by `agentload fit`")
    size = p.add_mutually_exclusive_group(required=True)
    size.add_argument("--tasks", type=int, metavar="N", help="number of tasks")
    size.add_argument("--duration", type=float, metavar="S", help="every task arriving within S seconds")
    p.add_argument("--seed", type=int, default=0, help="random seed (same seed, same file)")
    p.add_argument(
        "--rate", type=float, default=None, metavar="TASKS_PER_S",
        help="mean arrival rate, all classes together (default: the fitted rate; required when the model has "
        "no fitted arrivals)",
    )
    p.add_argument(
        "--burstiness", type=positive, default=None, metavar="B",
        help="arrivals from a gamma renewal process of shape B at the fitted rate or --rate, instead of the "
        "fitted process, as vllm bench serve --burstiness: 1 Poisson, lower burstier (gaps' coefficient of "
        "variation 1/sqrt(B)), higher more even (default: the fitted process)",
    )
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the native JSONL trace to write")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from ..model.generate import write_generated
    from ..model.schema import load_model

    start = time.perf_counter()
    model = load_model(args.model)
    tasks, calls, subtasks = write_generated(
        model, args.output, tasks=args.tasks, duration=args.duration, seed=args.seed, rate=args.rate,
        burstiness=args.burstiness, source=args.model,
    )
    print(f"generated {tasks} tasks, {calls} calls, {subtasks} sub-tasks in {time.perf_counter() - start:.1f} s -> {args.output}")
    return 0
