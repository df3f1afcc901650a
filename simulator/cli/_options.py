"""Argument types and options that several commands share: numbers checked as argparse reads them, and
the options that turn a run's summary into its exit code (`simulator.metrics.verdict`)."""

from __future__ import annotations

import argparse
import math

DEFAULT_MAX_FAILED_SHARE = 0.01
"""`simulator.metrics.verdict.DEFAULT_MAX_FAILED_SHARE`, here without importing the metrics at every start of
the command line (tests/test_cli_imports.py holds the two equal)."""


def share(text: str) -> float:
    """A share between 0 and 1."""
    value = _number(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not a share between 0 and 1")
    return value


def positive(text: str) -> float:
    """A finite number above 0."""
    value = _number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not a number above 0")
    return value


def non_negative(text: str) -> float:
    """A finite number, 0 or above."""
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


def count(text: str) -> int:
    """A whole number above 0."""
    value = whole_number(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not 1 or more")
    return value


def whole_number(text: str) -> int:
    """A whole number, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number")
    return value


def add_verdict_options(parser: argparse.ArgumentParser) -> None:
    """--max-failed-share and --fail-on-slo: when a finished run's exit code says it failed."""
    parser.add_argument("--max-failed-share", type=share, default=DEFAULT_MAX_FAILED_SHARE, metavar="X",
                        help="exit with code 1 when more than this share of call attempts failed (cancelled ones "
                        "not counted; 0: any failure)")
    parser.add_argument("--fail-on-slo", action="store_true",
                        help="exit with code 4 when the run missed a target of the scenario's SLO")


SIMULATE_EXIT_CODES = """\
exit codes:
  0      completed: failed attempts within --max-failed-share and, with
         --fail-on-slo, every SLO target met
  1      more call attempts failed than --max-failed-share allows
  2      bad input: scenario, trace, profile or setting (no result folder)
  4      with --fail-on-slo: an SLO target was missed"""
