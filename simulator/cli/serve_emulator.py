"""`agentload serve-emulator`: run the built-in OpenAI-compatible emulator until interrupted."""

from __future__ import annotations

import argparse
import sys

from ..emulator.settings import REPLICA_HEADER, EmulatorSettings, describe_timing
from ..errors import InputError


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `serve-emulator` command."""
    parser = subparsers.add_parser(
        "serve-emulator",
        help="run a vLLM-like OpenAI-compatible server without a model (for tests and dry runs)",
        description=(
            "Serve /v1/models, /health, /v1/completions, /v1/chat/completions and /tokenize like vLLM. "
            "With --profile the server twin of that profile (as `agentload simulate -p`) schedules the requests "
            "in real time: queueing, chunked prefill, prefix caching, preemption, and vLLM's /metrics. "
            "Otherwise, with --ttft/--itl every stream gets exactly those times, or a batching model "
            "(--prefill-per-token, --decode-per-seq, --decode-base) decides them, by default with the steps of "
            "~ one H100 serving an 8B model on vLLM."
        ),
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port (the URL is printed)")
    parser.add_argument("--model", default="agentload-emulator", help="served model name")
    parser.add_argument("--max-model-len", type=int, default=131072, metavar="TOKENS",
                        help="longest prompt + output a request may have, as vLLM's --max-model-len")
    parser.add_argument("--vocab-size", type=int, default=32000, metavar="N",
                        help="the vocabulary size: a completions prompt's token ids must be below N")
    parser.add_argument("--profile", metavar="NAME|PATH",
                        help="server profile (preset name or YAML file) whose twin decides token times; "
                        "its max_model_len replaces --max-model-len")
    parser.add_argument("--ttft", type=float, help="fixed seconds to the first token")
    parser.add_argument("--itl", type=float, help="fixed seconds between tokens")
    default = EmulatorSettings()  # batched timing of ~ one H100 serving an 8B model (settings.DEFAULT_SERVER_CLASS)
    parser.add_argument("--prefill-per-token", type=float, default=default.prefill_per_token,
                        help=f"step seconds per uncached prompt token (default {default.prefill_per_token:.6f})")
    parser.add_argument("--decode-per-seq", type=float, default=default.decode_per_seq,
                        help=f"step seconds per running sequence (default {default.decode_per_seq:.6f})")
    parser.add_argument("--decode-base", type=float, default=default.decode_base,
                        help=f"fixed seconds of every step (default {default.decode_base:.6f}; all three 0, or "
                        "--ttft 0 --itl 0: a zero-latency server)")
    parser.add_argument("--max-num-seqs", type=int, default=1024, metavar="N",
                        help="most requests in a batch (batching timing), as vLLM's --max-num-seqs")
    parser.add_argument("--block-size", type=int, default=16, help="prefix-cache block size in tokens")
    parser.add_argument(
        "--fault", action="append", default=[], metavar="KIND:RATE",
        help="inject a fault in a fraction of requests: http_NNN, reset, stall, malformed (repeatable)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault draws")
    parser.add_argument("--retry-after", type=float, metavar="SECONDS",
                        help="send Retry-After: SECONDS with injected http_429 and http_503 faults")
    parser.add_argument("--replica", metavar="NAME",
                        help=f"a fleet replica's name, sent in the {REPLICA_HEADER} header of every response")
    parser.set_defaults(func=run)


def settings_from(args: argparse.Namespace) -> EmulatorSettings:
    """Validated settings from the parsed arguments."""
    from ..emulator.faults import parse_fault

    for name in ("ttft", "itl", "prefill_per_token", "decode_per_seq", "decode_base", "retry_after"):
        value = getattr(args, name)
        if value is not None and value < 0:
            raise InputError(f"must not be negative, got {value}", file="command line", field="--" + name.replace("_", "-"))
    for name in ("max_model_len", "vocab_size", "max_num_seqs", "block_size"):
        if getattr(args, name) <= 0:
            raise InputError("must be positive", file="command line", field="--" + name.replace("_", "-"))
    if args.profile is not None:
        if args.ttft is not None or args.itl is not None:
            raise InputError("give --profile or --ttft/--itl, not both", file="command line", field="--profile")
        from ..sim.profile import load_profile  # noqa: PLC0415 - fail here, before listening

        load_profile(args.profile)
    if args.replica is not None and not args.replica.strip():
        raise InputError("must name the replica", file="command line", field="--replica")
    faults = tuple(parse_fault(text) for text in args.fault)
    if sum(rate for _, rate in faults) > 1.0:
        raise InputError("fault rates add up to more than 1", file="--fault", field="rate")
    return EmulatorSettings(
        model=args.model,
        max_model_len=args.max_model_len,
        vocab_size=args.vocab_size,
        ttft=args.ttft,
        itl=args.itl,
        prefill_per_token=args.prefill_per_token,
        decode_per_seq=args.decode_per_seq,
        decode_base=args.decode_base,
        max_num_seqs=args.max_num_seqs,
        block_size=args.block_size,
        faults=faults,
        seed=args.seed,
        profile=args.profile,
        retry_after=args.retry_after,
        replica=args.replica,
    )


async def serve(settings: EmulatorSettings, host: str, port: int) -> None:
    """Run until cancelled, printing the URL once listening."""
    import asyncio

    from ..emulator.server import Emulator
    from ..gcpause import gc_frozen

    emulator = Emulator(settings)
    url = await emulator.start(host, port)
    # the URL stays the line's last word: `simulator.emulator.process` and scripts read it there
    print(f"agentload emulator ({describe_timing(settings)}) listening on {url}", flush=True)
    try:
        with gc_frozen():  # its token times are what clients measure
            await asyncio.Event().wait()
    finally:
        await emulator.stop()


def run(args: argparse.Namespace) -> int:
    import asyncio

    settings = settings_from(args)
    # asyncio's own loop, not uvloop: it reads through the socket objects, so a request's clock starts
    # at the kernel's arrival stamp (`simulator.rx_stamps`), not when the loop got to it.
    try:
        asyncio.run(serve(settings, args.host, args.port))
    except KeyboardInterrupt:
        print("agentload emulator stopped", file=sys.stderr)
    return 0
