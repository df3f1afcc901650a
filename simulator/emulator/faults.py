"""Faults the emulator injects on request, so that every client error path can be tested: per request
with the header ``X-Agentload-Fault: http_500 | http_400 | http_NNN | reset | stall | malformed``, or
at random with ``faults=(("http_500", 0.01), ...)`` drawn from a seeded generator.

What each does: ``http_NNN`` answers that status with vLLM's error body (429 and 503 with a
``Retry-After`` header when the emulator's `retry_after` is set); ``reset`` aborts the connection after
the first tokens of the stream; ``stall`` sends the first tokens and then nothing (until the client
gives up or `stall_seconds` pass); ``malformed`` puts an event that is not JSON into the stream. A
server killed and restarted mid-run is no fault kind: tests stop the emulator and start it again on
the same port."""

from __future__ import annotations

from typing import Iterable, Optional

import numpy as np

from ..errors import InputError

FAULT_HEADER = "X-Agentload-Fault"
FAULT_KINDS = ("reset", "stall", "malformed")
"""Fault kinds besides ``http_NNN`` (any status from 400 to 599)."""


def parse_fault(text: str, where: str = "--fault") -> tuple[str, float]:
    """Parse ``KIND:RATE`` (e.g. ``http_500:0.01``) into (kind, rate); bad text is an `InputError`."""
    kind, sep, rate_text = text.partition(":")
    check_fault_kind(kind, where)
    try:
        rate = float(rate_text) if sep else 1.0
    except ValueError:
        raise InputError(f"rate {rate_text!r} is not a number", file=where, field="rate") from None
    if not 0.0 <= rate <= 1.0:
        raise InputError(f"rate {rate} is not between 0 and 1", file=where, field="rate")
    return kind, rate


def check_fault_kind(kind: str, where: str = "fault") -> None:
    """Raise `InputError` unless `kind` is a known fault."""
    if kind in FAULT_KINDS:
        return
    if kind.startswith("http_") and kind[5:].isdigit() and 400 <= int(kind[5:]) <= 599:
        return
    raise InputError(
        f"unknown fault {kind!r}: use http_NNN (400-599), {', '.join(FAULT_KINDS)}",
        file=where,
        field="kind",
    )


class FaultDraws:
    """Which fault, if any, a request gets: the one its header names, else one drawn at the given rates."""

    def __init__(self, faults: Iterable[tuple[str, float] | str], seed: int) -> None:
        self.rates = [parse_fault(f, "emulator.faults") if isinstance(f, str) else (str(f[0]), float(f[1])) for f in faults]
        for kind, _ in self.rates:
            check_fault_kind(kind, "emulator.faults")
        self._rng = np.random.default_rng(seed)

    def pick(self, header: Optional[str]) -> Optional[str]:
        """The fault of a request whose fault header is `header` (None: absent); a header naming no
        known fault is an `InputError`. Draws from the generator only when there are rates."""
        if header is not None:
            check_fault_kind(header)
            return header
        if self.rates:
            draw = self._rng.random()
            for kind, rate in self.rates:
                if draw < rate:
                    return kind
                draw -= rate
        return None
