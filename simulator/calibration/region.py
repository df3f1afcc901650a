"""The region of call shapes a calibration measured (`simulator.sim.profile.CalibratedRegion`), from the
sweep's points that were measured: the calls each point times, their prompt and output tokens, cached
share of the prompt, calls in the engine beside them and the burst they were sent in."""

from __future__ import annotations

from typing import Sequence

from ..sim.profile import CalibratedRegion
from .sweep import SweepPoint


def timed_calls(point: SweepPoint, block_size: int) -> tuple[int, float, int, int, int]:
    """The shape of the calls a point times: (prompt tokens, cached share of the prompt, calls in the
    engine, calls sent together, output tokens). A prefill or decode point times its burst of
    `concurrency` calls sent at once; a loaded point its calls, each sent alone among its
    `concurrency` streams. A cached prompt's blocks are in the prefix cache, so it hits up to the block
    (of `block_size` tokens) holding its last token, which the prefill computes, as vLLM and the twin do."""
    prompt = point.input_tokens
    if point.kind == "loaded":
        return prompt, 0.0, point.concurrency + 1, 1, point.output_tokens
    cached = (prompt - 1) // block_size * block_size if point.cached else 0
    return prompt, cached / prompt, point.concurrency, point.concurrency, point.output_tokens


def region_of(points: Sequence[SweepPoint], block_size: int) -> CalibratedRegion:
    """The smallest ranges holding every timed call of `points` (the points measured; at least one),
    their cached prompts made of blocks of `block_size` tokens (the profile's `kv_cache.block_size`, as
    the sweep sends them)."""
    if not points:
        raise ValueError("no measured point to take a region from")
    shapes = list(zip(*(timed_calls(point, block_size) for point in points)))
    prompt, cached, running, burst, output = ((min(values), max(values)) for values in shapes)
    return CalibratedRegion(prompt_tokens=prompt, cached_share=cached, running_calls=running, burst_calls=burst,
                            output_tokens=output)
