"""`agentload vllm`: build the tiny test model and run a real vLLM server (CPU build) in the foreground."""

from __future__ import annotations

import argparse
import signal
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `vllm tiny-model` and `vllm serve`."""
    parser = subparsers.add_parser(
        "vllm", help="a local vLLM server (CPU build) and its tiny test model",
        description="A real vLLM server on this machine, from vLLM's CPU build in its own environment "
        "($AGENTLOAD_VLLM_VENV, else .vllm-venv): tiny-model builds a tiny random-weight Llama to serve, "
        "serve runs vLLM's OpenAI-compatible server in the foreground. The integration tests use the same.")
    sub = parser.add_subparsers(dest="vllm_command", metavar="SUBCOMMAND")
    parser.set_defaults(func=lambda args: parser.print_help() or 2)

    tiny = sub.add_parser(
        "tiny-model", help="build a tiny random-weight Llama into DIR",
        description="Build a tiny Llama with random weights and its tokenizer (vocabulary 1024) into DIR, with "
        "the vLLM environment's Python; prints the folder. A folder that holds a build is kept unless --force.")
    tiny.add_argument("dir", metavar="DIR", help="output folder")
    tiny.add_argument("--python", help="python of the vLLM environment (default: $AGENTLOAD_VLLM_VENV or .vllm-venv)")
    tiny.add_argument("--force", action="store_true", help="rebuild even when DIR holds a build")
    tiny.set_defaults(func=_tiny_model)

    serve = sub.add_parser(
        "serve", help="run vLLM's OpenAI server on a loopback port until interrupted",
        description="Start vLLM's OpenAI-compatible server for a local model folder on 127.0.0.1, wait for "
        "/health, print its URL and log file, and keep it running until Ctrl-C or SIGTERM.")
    serve.add_argument("--model", required=True, help="local model folder (e.g. one built by tiny-model)")
    serve.add_argument("--port", type=int, help="port (default: a free one)")
    serve.add_argument("--python", help="python of the vLLM environment (default: $AGENTLOAD_VLLM_VENV or .vllm-venv)")
    serve.add_argument("--startup-timeout", type=float, default=300.0, help="seconds to wait for /health")
    serve.set_defaults(func=_serve)


def _tiny_model(args: argparse.Namespace) -> int:
    from ..live.vllm import ServerError, build_tiny_model

    try:
        print(build_tiny_model(args.dir, python=args.python, force=args.force))
    except ServerError as exc:
        print(f"agentload: error: {exc}", file=sys.stderr)
        return 1
    return 0


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _serve(args: argparse.Namespace) -> int:
    from ..live.vllm import ServerError, VLLMServer

    # SIGTERM (and SIGINT, even when a parent shell ignored it) stop the server on the way out.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    server = VLLMServer(args.model, port=args.port, python=args.python, startup_timeout_s=args.startup_timeout)
    try:
        with server:
            print(
                f"vLLM ready at {server.base_url}/v1 (model {server.model_name!r}) after "
                f"{server.startup_seconds:.1f}s; log: {server.log_path}; Ctrl-C stops it",
                flush=True,
            )
            code = server.wait()
    except ServerError as exc:
        print(f"agentload: error: {exc}", file=sys.stderr)
        return 1
    print(f"vLLM exited with code {code}; log: {server.log_path}", file=sys.stderr)
    return 1 if code else 0
