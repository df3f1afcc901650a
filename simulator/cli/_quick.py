"""The two ways `agentload run` and `agentload simulate` are told what to run: a scenario file, or flags
that describe it (the quick path, `simulator.quick`); and `--save-scenario`, which writes what ran."""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from ..errors import InputError
from . import _options
from .trace import _Formats

_WORKLOAD = ("trace", "workload_model", "format", "on_error", "assume_append_only")
_TARGET = ("target", "served_model", "api", "vocab_size")
_LOAD = ("rate", "rate_scale", "burstiness", "concurrency", "duration", "tasks", "seed", "warmup", "slo",
         "gap_cap", "token_scale", "context_cap", "name")


def add_scenario_options(parser: argparse.ArgumentParser, *, live: bool) -> None:
    """SCENARIO (now optional) and the quick path's flags; `live`: with the target's flags (`run`)."""
    parser.add_argument("scenario", nargs="?", metavar="SCENARIO",
                        help="scenario YAML file (docs/scenario.md); leave it out to describe the run with "
                        "--trace or --workload-model and the flags below")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a scenario setting, e.g. --set run.max_tasks=5 (repeatable; with a file "
                        "or the flags)")
    parser.add_argument("--save-scenario", metavar="FILE",
                        help="write the scenario that runs (from the file or the flags, --set applied) as a YAML "
                        "file to keep and rerun with `agentload run FILE`")

    what = parser.add_argument_group(
        "without a scenario file: the workload",
        "Instead of SCENARIO, a trace or a workload model plus flags (docs/scenario.md, 'Without a scenario "
        "file'). Unset flags keep the scenario defaults.")
    what.add_argument("--trace", nargs="+", metavar="PATH",
                      help="trace file(s) or folder(s), any supported format, read as one workload")
    what.add_argument("--workload-model", metavar="MODEL.yaml",
                      help="a workload model (from `agentload fit`) to generate tasks from; needs --tasks or "
                      "--duration")
    what.add_argument("--format", choices=_Formats(), metavar="FORMAT",
                      help="trace format, one of %(choices)s (default: detected from content)")
    what.add_argument("--on-error", choices=("raise", "skip"), help="bad trace records: stop or skip (default: raise)")
    what.add_argument("--assume-append-only", action="store_true",
                      help="for traces without hash ids: derive prefix blocks from the token counts, assuming each "
                      "prompt is the previous one + its output + what was appended")
    what.add_argument("--gap-cap", type=_options.non_negative, metavar="S",
                      help="cut tool and think time longer than S seconds to S (default: as recorded)")
    what.add_argument("--token-scale", type=_options.positive, metavar="X",
                      help="multiply input and output tokens, prefix sharing kept (default: 1)")
    what.add_argument("--context-cap", type=_options.count, metavar="TOKENS",
                      help="most input + output tokens of one call (default: no cap)")

    if live:
        where = parser.add_argument_group("without a scenario file: the server")
        where.add_argument("--target", "--base-url", metavar="URL",
                           help="the server's base URL, e.g. http://localhost:8000 (default: the built-in emulator)")
        where.add_argument("--served-model", "--model", metavar="NAME",
                           help="model name to send (default: the server's first model)")
        where.add_argument("--api", choices=("completions", "chat"),
                           help="completions: token-id prompts of exact length; chat: calibrated text "
                           "(default: completions)")
        where.add_argument("--vocab-size", type=_options.count, metavar="N",
                           help="the model's vocabulary size: prompt token ids are drawn below it (default: 32000; "
                           "the tiny test model: 1024)")

    load = parser.add_argument_group(
        "without a scenario file: load, length and SLO",
        "vllm bench serve's names are accepted too: --request-rate, --max-concurrency, --burstiness, --seed"
        + (", --base-url, --model." if live else "."))
    load.add_argument("--rate", "--request-rate", type=_options.positive, metavar="TASKS_PER_S",
                      help="top-level tasks per second: a trace's arrivals rescaled to it (a trace whose tasks all "
                      "arrive at once: Poisson arrivals at it), a model's rate (default: as recorded or fitted)")
    load.add_argument("--rate-scale", type=_options.positive, metavar="X",
                      help="tasks per second x X, the arrivals' pattern kept (default: 1)")
    load.add_argument("--burstiness", type=_options.positive, metavar="B",
                      help="re-space arrivals as a gamma renewal process of shape B at --rate or the workload's "
                      "own rate, seeded: 1 Poisson, lower burstier, higher more even (default: as recorded or "
                      "fitted)")
    load.add_argument("--concurrency", "--max-concurrency", type=_options.count, metavar="N",
                      help="most top-level tasks in flight; later arrivals wait, shown as client lag (default: no "
                      "limit)")
    load.add_argument("--duration", type=_options.positive, metavar="S",
                      help="seconds of arrivals: later tasks are not started (default: all)")
    load.add_argument("--tasks", type=_options.count, metavar="N",
                      help="run the first N tasks by arrival (a model: generate N) (default: all)")
    load.add_argument("--seed", type=int, metavar="K", help="seed of generation, sampling, arrivals and prompts "
                      "(default: 0)")
    load.add_argument("--warmup", type=_options.non_negative, metavar="S",
                      help="seconds at the start left out of the figures (default: 0)")
    load.add_argument("--slo", action="append", default=[], metavar="TARGET.PCT=BOUND",
                      help="an SLO bound, e.g. task_s.p90=60, ttft_ms.p99=500, tpot_ms.p99=50 (repeatable; "
                      "targets ttft_ms, tpot_ms, task_s; percentiles p50, p90, p95, p99, p99.9, max)")
    load.add_argument("--name", help="the scenario's name, used for the result folder (default: the trace's or "
                      "model's file name)")


def _given(args: argparse.Namespace) -> list[str]:
    """The quick path's flags given on this command line, as their option names."""
    names = _WORKLOAD + _TARGET + _LOAD
    return ["--" + n.replace("_", "-") for n in names if getattr(args, n, None) not in (None, False, [])]


def load_scenario(args: argparse.Namespace, *, profile: str | None = None) -> Any:
    """The scenario to run: the file's, or the one the flags describe (`profile`: the twin `simulate`
    runs on, which a saved scenario's emulator then serves). Both at once, or neither, is bad input."""
    from .. import scenario as scenario_mod

    given = _given(args)
    if args.scenario is not None:
        if given:
            raise InputError(f"give a scenario file or flags that describe the run, not both: {', '.join(given)} "
                             "describe a run without a file (change a file's settings with --set KEY=VALUE)",
                             file=args.scenario)
        return scenario_mod.load(args.scenario, args.overrides)
    if not given or (args.trace is None and args.workload_model is None):
        raise InputError("say what to run: a scenario file (SCENARIO), or a workload with --trace PATH... or "
                         "--workload-model MODEL.yaml (see --help)", file="command line")
    from .. import quick

    spec = quick.QuickSpec(
        traces=args.trace or (), workload_model=args.workload_model, format=args.format, on_error=args.on_error,
        assume_append_only=args.assume_append_only, target=getattr(args, "target", None),
        served_model=getattr(args, "served_model", None), api=getattr(args, "api", None),
        vocab_size=getattr(args, "vocab_size", None), emulator_profile=profile, rate=args.rate,
        rate_scale=args.rate_scale, burstiness=args.burstiness, concurrency=args.concurrency, duration=args.duration,
        tasks=args.tasks, seed=args.seed, warmup=args.warmup, slo=args.slo, gap_cap=args.gap_cap,
        token_scale=args.token_scale, context_cap=args.context_cap, name=args.name)
    return quick.build(spec, args.overrides)


def save_if_asked(args: argparse.Namespace, scenario: Any) -> None:
    """--save-scenario FILE: write the scenario that runs (and say so on stderr)."""
    if not args.save_scenario:
        return
    import sys

    from .. import quick

    quick.save(scenario, args.save_scenario, shlex.join(getattr(args, "argv", []) or []),
               profile=getattr(args, "profile", None))
    print(f"agentload: scenario saved to {args.save_scenario}", file=sys.stderr)
