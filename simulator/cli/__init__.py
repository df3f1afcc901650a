"""The `agentload` command: parse arguments, call the library, print.

Each module in this package is one command (or command group) and defines
``register(subparsers)``, which adds its parser and sets ``func(args) -> int`` as a default.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from typing import Optional, Sequence

from .. import __version__
from ..errors import InputError
from ._help import OUTPUT_RULE, finish


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, with every command module registered."""
    parser = argparse.ArgumentParser(
        prog="agentload",
        description="Load simulator for LLM servers under agent traffic: replay recorded or generated agent "
        "tasks against an OpenAI-compatible server (or the built-in emulator), or predict them on a twin of "
        "the server, and report per-call and per-task figures.\n\n" + OUTPUT_RULE,
    )
    parser.add_argument("--version", action="version", version=f"agentload {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}").register(sub)
    finish(parser)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point; returns the exit code (2 for bad input, 130 when interrupted). A reader that closes
    the output early (`agentload ... | head`) ends the command quietly, with code 0."""
    try:
        return _main(argv)
    except BrokenPipeError:
        if not _reader_gone():
            raise
        return 0


def _main(argv: Optional[Sequence[str]]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what --save-scenario says made the file
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except InputError as exc:
        print(f"agentload: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("agentload: interrupted", file=sys.stderr)
        return 130


def _reader_gone() -> bool:
    """Whether stdout or stderr is a pipe whose reader has gone; each such one is pointed at /dev/null,
    so that Python's flush at exit does not fail on it again (the recipe of Python's `signal` docs).
    False for a broken pipe elsewhere (a socket), which is a real error."""
    import select

    if not hasattr(select, "poll"):  # no poll (Windows): take the broken pipe for a closed output
        return True
    gone = False
    for stream in (sys.stdout, sys.stderr):
        try:
            fd = stream.fileno()
        except (AttributeError, OSError, ValueError):  # replaced by a test's capture, or closed
            continue
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        if any(events & select.POLLERR for _, events in poller.poll(0)):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, fd)
            os.close(devnull)
            gone = True
    return gone
