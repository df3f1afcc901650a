"""Per-call and per-task records: what both drivers (simulated and live) produce, field for field.

All times are seconds since the run's start on a monotonic clock (simulated or wall). Token counts
come from the server's `usage` where it reports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One call as it happened."""

    task_id: str
    task_class: str
    call_index: int
    attempt: int
    intended_send: float
    """When the behaviour wanted to send it (previous end + gap, or arrival)."""
    actual_send: float
    """When the request was actually written; minus `intended_send` it is client lag."""
    end: float
    """When the last byte of the response arrived (or the error was seen)."""
    ok: bool
    ttft: Optional[float] = None
    """Seconds from actual send to the first generated token."""
    itl_count: int = 0
    """Number of inter-token gaps observed (chunks after the first)."""
    itl_mean: Optional[float] = None
    itl_max: Optional[float] = None
    input_tokens: int = 0
    output_tokens: int = 0
    requested_output_tokens: int = 0
    cached_tokens: Optional[int] = None
    """Prompt tokens served from the prefix cache, if the server reports it."""
    status: Optional[int] = None
    """HTTP status (None when no response came)."""
    error_class: Optional[str] = None
    """'http_4xx', 'http_5xx', 'connect', 'reset', 'timeout', 'stall', 'malformed', ... when not ok."""
    error_message: Optional[str] = None
    retry_after: Optional[float] = None
    """Seconds the server's ``Retry-After`` asked to wait before trying again (a 429 or 503), if it did;
    a retry then waits at least that long."""
    replica: Optional[str] = None
    """The fleet replica that served it, when the fleet says (live: the replica's response header,
    `simulator.scenario.fleet.REPLICA_HEADER`; the twin: the replica the router model chose)."""

    @property
    def latency(self) -> float:
        """End-to-end seconds from actual send to the end."""
        return self.end - self.actual_send

    @property
    def client_lag(self) -> float:
        return self.actual_send - self.intended_send

    @property
    def tpot(self) -> Optional[float]:
        """Mean time per output token after the first (vLLM's definition)."""
        if self.ttft is None or self.output_tokens < 2:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """One task as it happened, from its intended arrival to its last byte."""

    task_id: str
    task_class: str
    arrival: float
    """Intended arrival (scheduled), not when the driver got to it."""
    end: float
    ok: bool
    calls: int
    """Calls completed (attempts that succeeded)."""
    calls_planned: int
    time_in_calls: float
    """Sum of call latencies (send to last byte)."""
    time_in_gaps: float
    """Sum of tool/think waits."""
    client_lag: float
    """Sum over its calls of actual minus intended send."""
    parent_id: Optional[str] = None
    """Set for sub-agent tasks."""
    failed_call: Optional[int] = None
    error_class: Optional[str] = None
    time_in_ttft: float = 0.0
    """Part of `time_in_calls` before first tokens (queueing and prefill); the rest is decode."""

    @property
    def completion_time(self) -> float:
        return self.end - self.arrival
