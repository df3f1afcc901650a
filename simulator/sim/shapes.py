"""Fixed-shape benchmarks on the twin: N closed-loop streams of identical requests (the "512 in, 512 out,
256 concurrent" runs that servers are usually quoted at), as `vllm bench serve --max-concurrency`
runs them: each stream sends its next request as soon as the previous one ends, prompts share no
prefix, and throughput is output tokens over the run's duration.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..workload import Call, Task, Workload
from .driver import simulate
from .profile import ServerProfile


@dataclass(frozen=True, slots=True)
class ShapeResult:
    """What a fixed-shape run measured (simulated seconds)."""

    output_tokens_per_s: float
    duration: float
    requests: int
    mean_ttft: float
    mean_itl: float
    preemptions: int


def fixed_shape_workload(concurrency: int, input_tokens: int, output_tokens: int, rounds: int) -> Workload:
    """`concurrency` tasks arriving at 0, each `rounds` back-to-back calls of the given shape."""
    call = Call(input_tokens=input_tokens, output_tokens=output_tokens)
    return Workload(tuple(Task(id=f"stream-{i}", calls=(call,) * rounds) for i in range(concurrency)))


def fixed_shape_throughput(profile: ServerProfile, concurrency: int = 256, input_tokens: int = 512,
                           output_tokens: int = 512, rounds: int = 8, fast_decode: bool = True) -> ShapeResult:
    """Run the shape on a twin of `profile` and measure it."""
    sink, result = simulate(fixed_shape_workload(concurrency, input_tokens, output_tokens, rounds), profile,
                            fast_decode=fast_decode)
    calls = [c for c in sink.calls if c.ok]
    tokens = sum(c.output_tokens for c in calls)
    itl = [c.itl_mean for c in calls if c.itl_mean is not None]
    return ShapeResult(
        output_tokens_per_s=tokens / result.end,
        duration=result.end,
        requests=len(calls),
        mean_ttft=sum(c.ttft for c in calls if c.ttft is not None) / len(calls),
        mean_itl=sum(itl) / len(itl) if itl else 0.0,
        preemptions=result.twin.preemptions,
    )
