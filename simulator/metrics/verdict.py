"""What a run's summary means for its exit code: failed calls beyond a share, a missed SLO, a stop.

The exit codes of `agentload run` (docs/scenario.md, "Exit codes"):

====  =====================================================================================
0     the run completed; failed attempts within ``--max-failed-share``; with ``--fail-on-slo``
      every SLO target met
1     more call attempts failed than ``--max-failed-share`` allows
2     bad input: the scenario, a trace, a setting (nothing run, no result folder)
3     the target failed the preflight check: unreachable, wrong model, authentication (no
      result folder)
4     with ``--fail-on-slo``: an SLO target was missed
128+N stopped by signal N: 130 SIGINT (Ctrl-C), 143 SIGTERM, 129 SIGHUP (partial results
      and summary saved)
====  =====================================================================================
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from .summary import Summary

OK = 0
CALLS_FAILED = 1
BAD_INPUT = 2
PREFLIGHT_FAILED = 3
SLO_MISSED = 4
SIGNALLED = 128
"""Plus the signal's number."""

DEFAULT_MAX_FAILED_SHARE = 0.01


@dataclass(frozen=True)
class Verdict:
    """An exit code and, when it is not 0, why (one line for the console)."""

    code: int
    reason: Optional[str] = None


def failed_share(summary: Summary) -> float:
    """Failed attempts over the attempts that ended (cancelled ones left out of both); 0 with none."""
    calls = summary.calls
    ended = calls.attempts - calls.cancelled
    return calls.failed_attempts / ended if ended > 0 else 0.0


def missed_targets(summary: Summary) -> list[str]:
    """The SLO targets the run missed, each as 'ttft_ms p99 812.0 > 500' ('task_s p90 not reached: 6 of 17
    tasks did not complete' when the percentile falls among them; 'none measured' when nothing was)."""
    missed = []
    for name in ("ttft_ms", "tpot_ms", "task_s"):
        target = getattr(summary.slo, name)
        if target is None or target.met:
            continue
        for key, check in target.percentiles.items():
            if check.met:
                continue
            if check.measured is not None:
                missed.append(f"{name} {key} {check.measured:.6g} > {check.bound:g}")
            elif target.not_completed:
                missed.append(f"{name} {key} not reached: {target.not_completed} of {target.judged} tasks did "
                              f"not complete (bound {check.bound:g})")
            else:
                missed.append(f"{name} {key} none measured (bound {check.bound:g})")
    return missed


def _share(value: float) -> str:
    """A share as a plain decimal with the digits it needs (never in exponent form): 0.0123, 0.000004."""
    if value <= 0 or value >= 0.01:
        return f"{value:.4f}".rstrip("0").rstrip(".") or "0"
    return f"{value:.{2 - math.floor(math.log10(value)) + 1}f}".rstrip("0")


def verdict(summary: Summary, *, max_failed_share: float = DEFAULT_MAX_FAILED_SHARE, fail_on_slo: bool = False,
            signum: Optional[int] = None) -> Verdict:
    """The exit code of a run that ended with `summary`: a stop by signal `signum` first, then failed
    calls beyond `max_failed_share`, then (with `fail_on_slo`) a missed SLO."""
    if signum is not None:
        return Verdict(SIGNALLED + signum, "stopped by a signal; partial results saved")
    share = failed_share(summary)
    if share > max_failed_share:
        calls = summary.calls
        top = ""
        if summary.error_messages:
            first = summary.error_messages[0]
            top = f"; most frequent: {first.error_class}: {first.message} ({first.count}x)"
        return Verdict(CALLS_FAILED, f"{calls.failed_attempts:,} of {calls.attempts - calls.cancelled:,} call attempts "
                                     f"failed (a share of {_share(share)} > --max-failed-share "
                                     f"{_share(max_failed_share)}){top}")
    if fail_on_slo:
        missed = missed_targets(summary)
        if missed:
            return Verdict(SLO_MISSED, "SLO missed: " + ", ".join(missed))
    return Verdict(OK)
