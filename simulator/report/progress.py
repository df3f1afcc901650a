"""The live progress line of `agentload run`: tasks done / in flight, calls, tokens/s, errors."""

from __future__ import annotations

from typing import Any, Optional

from rich.text import Text


class ProgressView:
    """A rich renderable fed with the runner's progress snapshots (simulator.pipeline.live.Progress)."""

    def __init__(self) -> None:
        self._snap: Any = None
        self._prev: Optional[tuple[float, int]] = None
        self._rate = 0.0

    def update(self, snap: Any) -> None:
        """Take a new snapshot; the output-token rate is measured between snapshots."""
        tokens = snap.counters.output_tokens
        if self._prev is not None and snap.elapsed > self._prev[0]:
            self._rate = (tokens - self._prev[1]) / (snap.elapsed - self._prev[0])
        self._prev = (snap.elapsed, tokens)
        self._snap = snap

    def __rich__(self) -> Text:
        s = self._snap
        if s is None:
            return Text("starting...")
        c = s.counters
        done = c.tasks_done + c.tasks_failed
        errors = ", ".join(f"{k} {v}" for k, v in c.errors.most_common(3)) or "0"
        return Text(
            f"{s.elapsed:7.1f} s | tasks {done}/{s.tasks_total} done, {s.in_flight} in flight, "
            f"{s.tasks_total - s.tasks_started} to arrive | calls {c.calls_ok} ok, {c.calls_failed} failed | "
            f"{self._rate:,.0f} out tok/s | errors {errors}"
        )
