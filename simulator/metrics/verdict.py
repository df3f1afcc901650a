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
    """The SLO targets the run missed, each as 'ttft_ms p99 812.0 > 500' (nothing measured: 'none')."""
    missed = []
    for name in ("ttft_ms", "tpot_ms", "task_s"):
        target = getattr(summary.slo, name)
        if target is None or target.met:
            continue
        for key, check in target.percentiles.items():
            if not check.met:
                measured = "none measured" if check.measured is None else f"{check.measured:.6g}"
                missed.append(f"{name} {key} {measured} > {check.bound:g}")
    return missed


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
        return Verdict(CALLS_FAILED, f"{calls.failed_attempts} of {calls.attempts - calls.cancelled} call attempts "
                                     f"failed (a share of {share:.4g} > --max-failed-share {max_failed_share:g}){top}")
    if fail_on_slo:
        missed = missed_targets(summary)
        if missed:
            return Verdict(SLO_MISSED, "SLO missed: " + ", ".join(missed))
    return Verdict(OK)
