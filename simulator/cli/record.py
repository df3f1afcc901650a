"""`agentload record`: record the traffic to an OpenAI-compatible server as a replayable trace."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from urllib.parse import urlsplit

from ..errors import InputError
from ..redact import mask_url


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `record` command."""
    from ..recorder.block_hash import DEFAULT_BLOCK_SIZE  # noqa: PLC0415
    from ..recorder.grouping import DEFAULT_IDLE_TIMEOUT  # noqa: PLC0415
    from ..recorder.keys import DEFAULT_HEADERS  # noqa: PLC0415

    parser = subparsers.add_parser(
        "record",
        help="record the traffic to an OpenAI-compatible server (a pass-through proxy) as a replayable trace",
        description=(
            "Listen on --listen and pass every request on to --upstream unchanged, answers streamed back as they "
            "come. Completions and chat completions are recorded into -o as they end: arrival and end times, first "
            "token, token counts (the server's usage; a stream that did not ask for it gets it asked for and taken "
            "out again), cached tokens, stop reason, and prefix block ids of the prompt's token ids (the request's "
            "own ids, the upstream's /tokenize, or a local tokenizer). Calls are grouped into agent tasks by a "
            "session header or W3C traceparent when the agent sends one, else from their prompts (a call whose "
            "prompt extends a task's last prompt continues it) and timing (a new prompt starting while a task waits "
            "is its sub-agent). Prompt and answer content and header values are never written. The file is valid "
            "JSONL at every moment: `agentload trace inspect` reads it while it grows, and a killed recorder keeps "
            "every call it finished. Stop with Ctrl-C."
        ),
    )
    parser.add_argument("--upstream", required=True, metavar="URL",
                        help="the server to pass requests on to, e.g. http://localhost:8000")
    parser.add_argument("--listen", default="127.0.0.1:8100", metavar="HOST:PORT",
                        help="where agents send their requests instead (port 0 picks a free one; the URL is printed)")
    parser.add_argument("-o", "--output", required=True, metavar="FILE",
                        help="the recording (JSONL); rotated files go beside it as FILE.1.jsonl, FILE.2.jsonl, ...")
    parser.add_argument("--tokenizer", default="upstream", metavar="upstream|none|DIR",
                        help="where the token ids of prompts sent as text come from: the upstream's /tokenize, "
                        "none (such calls get no block ids), or a model folder read with transformers (pip install 'agentload[record]')")
    parser.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE, metavar="TOKENS",
                        help="tokens per prefix block id")
    parser.add_argument("--session-header", action="append", metavar="NAME",
                        help="a header naming the call's agent session (repeatable; default: "
                        f"{', '.join(DEFAULT_HEADERS)})")
    parser.add_argument("--no-traceparent", action="store_true",
                        help="do not group calls by the trace id of their W3C traceparent header")
    parser.add_argument("--session-user", action="store_true",
                        help="also group calls by the request body's OpenAI `user` field")
    parser.add_argument("--rotate-size", type=float, metavar="MB",
                        help="start a new file when the current one passes this many megabytes")
    parser.add_argument("--rotate-time", type=float, metavar="SECONDS",
                        help="start a new file when the current one is this old")
    parser.add_argument("--idle-timeout", type=float, default=DEFAULT_IDLE_TIMEOUT, metavar="SECONDS",
                        help="a task without a call for this long is over (a later call starts a new task)")
    parser.add_argument("--status-every", type=float, default=30.0, metavar="SECONDS",
                        help="say how many calls were recorded this often, when the count moved (0: only at exit)")
    parser.set_defaults(func=run)


def settings_from(args: argparse.Namespace):
    """Validated `RecordSettings` from the parsed arguments."""
    from ..recorder.keys import DEFAULT_HEADERS, KeySource  # noqa: PLC0415
    from ..recorder.proxy import RecordSettings  # noqa: PLC0415

    try:
        parts = urlsplit(args.upstream)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise InputError("must be an http:// or https:// URL with a host, e.g. http://localhost:8000",
                         file="command line", field="--upstream")
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise InputError(f"expected HOST:PORT, e.g. 127.0.0.1:8100, got {args.listen!r}", file="command line",
                         field="--listen")
    if args.status_every < 0:
        raise InputError("must not be negative", file="command line", field="--status-every")
    for name in ("rotate_size", "rotate_time", "idle_timeout"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            raise InputError("must be positive", file="command line", field="--" + name.replace("_", "-"))
    if args.block_size <= 0:
        raise InputError("must be positive", file="command line", field="--block-size")
    if args.tokenizer not in ("upstream", "none") and not Path(args.tokenizer).is_dir():
        raise InputError("expected upstream, none or a model folder", file="command line", field="--tokenizer")
    keys = KeySource(tuple(h.lower() for h in (args.session_header or DEFAULT_HEADERS)),
                     traceparent=not args.no_traceparent, user_field=args.session_user)
    return RecordSettings(
        upstream=args.upstream, out=Path(args.output), host=host.strip("[]"), port=int(port),
        block_size=args.block_size, tokenizer=args.tokenizer, keys=keys,
        rotate_bytes=int(args.rotate_size * 1e6) if args.rotate_size else None, rotate_seconds=args.rotate_time,
        idle_timeout=args.idle_timeout)


async def record(settings, status_every: float = 0.0) -> "object":
    """Run the recorder until SIGINT or SIGTERM, saying what it has recorded every `status_every` seconds
    (0: never); returns the recorder."""
    import asyncio

    from ..recorder.proxy import Recorder  # noqa: PLC0415
    from ..recorder.prompt_tokens import TokenizeError  # noqa: PLC0415

    recorder = Recorder(settings)
    try:
        url = await recorder.start()
    except TokenizeError as exc:
        raise InputError(str(exc), file="command line", field="--tokenizer") from None
    except OSError as exc:
        await recorder.stop()
        raise InputError(f"cannot listen there: {exc.strerror or exc}", file="command line", field="--listen") from None
    # the URL stays the line's last word, as with serve-emulator: scripts read it there
    print(f"agentload record: passing calls on to {mask_url(settings.upstream)}, recording them in {settings.out}; "
          f"listening on {url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    said = None
    try:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=status_every or None)
            except asyncio.TimeoutError:
                tally = recorder.tally
                now = (tally.recorded, tally.failed, tally.passed)
                if now != said:  # a line only when something happened
                    said = now
                    print(f"agentload record: {tally.recorded:,} call(s) recorded, {tally.failed:,} failed, "
                          f"{recorder.grouper.live_chains:,} task chain(s) live", file=sys.stderr, flush=True)
    finally:
        await recorder.stop()
    return recorder


def run(args: argparse.Namespace) -> int:
    import asyncio

    settings = settings_from(args)
    recorder = asyncio.run(record(settings, args.status_every))
    tally = recorder.tally
    files = ", ".join(str(p) for p in recorder.journal.files)
    print(f"agentload record: {tally.recorded:,} call(s) recorded, {tally.failed:,} failed, "
          f"{tally.passed:,} other request(s) passed through; written to {files}", file=sys.stderr)
    if tally.statuses:
        print("  upstream errors: " + ", ".join(f"HTTP {s}: {n:,}" for s, n in sorted(tally.statuses.items())),
              file=sys.stderr)
    if tally.no_ids:
        print("  calls without block ids: " + "; ".join(f"{why}: {n:,}" for why, n in tally.no_ids.items()),
              file=sys.stderr)
    if tally.unrecorded:
        print("  calls passed on unrecorded (the recorder failed on them): "
              + ", ".join(f"{kind}: {n:,}" for kind, n in tally.unrecorded.items()), file=sys.stderr)
    if tally.no_usage:
        print(f"  calls without usage from the server (token counts 0): {tally.no_usage:,}", file=sys.stderr)
    return 0
