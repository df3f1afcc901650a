"""The `agentload` command: parse arguments, call the library, print.

Each module in this package is one command (or command group) and defines
``register(subparsers)``, which adds its parser and sets ``func(args) -> int`` as a default.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from typing import Optional, Sequence

from .. import __version__
from ..errors import InputError


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, with every command module registered."""
    parser = argparse.ArgumentParser(
        prog="agentload",
        description="Load simulator for LLM servers under agent traffic.",
    )
    parser.add_argument("--version", action="version", version=f"agentload {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}").register(sub)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point; returns the exit code (2 for bad input, 130 when interrupted)."""
    parser = build_parser()
    args = parser.parse_args(argv)
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
