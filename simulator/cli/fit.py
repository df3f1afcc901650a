"""`agentload fit TRACE... -o model.yaml`: fit a workload model to recorded traces."""

from __future__ import annotations

import argparse
import sys
import time

from ..errors import InputError
from .trace import add_input_options


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `fit` command."""
    p = subparsers.add_parser(
        "fit", help="fit a workload model (YAML) to traces",
        description="Fit a workload model to traces read as one workload: per task class, its arrival process "
        "(Poisson, gamma, MMPP, piecewise, modulated or the recorded times, chosen by AIC), calls per task, "
        "tokens and gaps conditioned on position and the previous call's stop reason, prefix reuse and "
        "sub-agents. Prints each class's candidates with their AIC. See docs/workload-model.md.")
    p.add_argument("paths", nargs="+", metavar="TRACE", help="trace files or folders (read as one workload)")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the workload model (YAML) to write")
    add_input_options(p)
    p.add_argument("--one-class", action="store_true", help="fit all tasks as one class, ignoring their labels")
    p.add_argument(
        "--allow-fallback", action="store_true",
        help="when a component has too few samples, use what there is instead of stopping",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from ..model.fit import fit_model
    from ..model.schema import save_model
    from ..traces import load

    start = time.perf_counter()
    workload = load(args.paths, args.format, args.on_error, args.assume_append_only)
    try:
        model = fit_model(workload, allow_fallback=args.allow_fallback, classes=not args.one_class)
    except InputError as exc:
        exc.file = exc.file or ", ".join(args.paths)
        raise
    save_model(model, args.output)
    tasks, calls, subtasks = workload.counts()
    print(f"fitted {len(model.classes)} class(es) on {tasks} tasks, {calls} calls, {subtasks} sub-tasks "
          f"in {time.perf_counter() - start:.1f} s -> {args.output}")
    for name, cls in model.classes.items():
        arr = cls.arrivals
        print(f"  class {name}: share {cls.share:.3f}, arrivals: {arr.use}")
        for c in sorted(arr.candidates, key=lambda c: c.aic):
            mark = "*" if c.kind == arr.use else " "
            print(f"   {mark} {c.kind:<10} params {c.params:>3}  loglik {c.loglik:>14.2f}  AIC {c.aic:>14.2f}")
    for note in model.notes:
        print(f"  note: {note}", file=sys.stderr)
    return 0
