"""How long one call takes on the built-in emulator with nothing else running: the server's part of a
run's length estimate (`simulator.live.run_length.run_length`).

Each timing model gives it from its own terms: fixed timing its TTFT and ITL; batched timing one step
a token, the first one also prefilling the prompt tokens its prefix cache does not hold; a profile its
server twin, one call at a time on a clock of its own. Calls are asked in the order a run would send
them, roughly (task by task), so that each model's prefix cache holds what the earlier calls left.
Queueing behind other calls is left out: under load a run takes longer.
"""

from __future__ import annotations

from itertools import takewhile
from typing import Callable

from ..workload import Call
from .settings import EmulatorSettings, timing_kind

CallTime = Callable[[Call], float]
"""Seconds the server takes for one call when nothing else runs; called in the order calls are sent."""


def unloaded_call_time(settings: EmulatorSettings) -> CallTime:
    """The unloaded call time of the timing model `settings` ask for (`simulator.emulator.server.timing_from`)."""
    kind = timing_kind(settings)
    if kind == "profile":
        from ..sim.profile import load_profile  # noqa: PLC0415 - the twin (SimPy) only when asked for

        return TwinCallTime(load_profile(settings.profile))  # type: ignore[arg-type]
    if kind == "fixed":
        return FixedCallTime(settings.ttft or 0.0, settings.itl or 0.0, settings.max_model_len)
    return BatchCallTime(settings.prefill_per_token, settings.decode_per_seq, settings.decode_base,
                         settings.max_model_len)


class FixedCallTime:
    """Fixed timing: the first token `ttft` after the call, each next one `itl` after it."""

    def __init__(self, ttft: float, itl: float, max_model_len: int) -> None:
        self.ttft, self.itl, self.max_model_len = ttft, itl, max_model_len

    def __call__(self, call: Call) -> float:
        if call.output_tokens <= 0 or call.input_tokens + call.output_tokens > self.max_model_len:
            return 0.0  # answered at once (nothing to generate) or refused at once (too long)
        return self.ttft + self.itl * (call.output_tokens - 1)


class BatchCallTime:
    """Batched timing alone: one step a token, each ``decode_base + decode_per_seq`` long, the first
    one also ``prefill_per_token`` for each prompt token not in the prefix cache. The emulator's prefix
    cache holds whole prompts by their token blocks, and a run's prompts share tokens as the calls' hash
    ids say: a call's leading hash ids seen in an earlier call are cached (the emulator's cache holds
    millions of blocks, so nothing is evicted here)."""

    def __init__(self, prefill_per_token: float, decode_per_seq: float, decode_base: float,
                 max_model_len: int) -> None:
        self.prefill_per_token = prefill_per_token
        self.step = decode_base + decode_per_seq
        self.max_model_len = max_model_len
        self._seen: dict[int, set[int]] = {}
        """Hash ids of the prompts sent so far, by their block size."""

    def cached_tokens(self, call: Call) -> int:
        """The prompt tokens of `call` an earlier call left in the cache; then remembers its blocks."""
        seen = self._seen.setdefault(call.block_size, set())
        leading = len(list(takewhile(seen.__contains__, call.hash_ids)))
        seen.update(call.hash_ids)
        return min(leading * call.block_size, call.input_tokens)

    def __call__(self, call: Call) -> float:
        if call.output_tokens <= 0 or call.input_tokens + call.output_tokens > self.max_model_len:
            return 0.0
        uncached = call.input_tokens - self.cached_tokens(call)
        return self.prefill_per_token * uncached + self.step * call.output_tokens


class TwinCallTime:
    """A profile's server twin, given one call at a time (each runs to its end, then the twin idles
    through the next call's gap before it comes): its request overhead, API-server time, chunked
    prefill over what its prefix cache lacks, decode steps and waking after an idle, as the twin times
    them."""

    def __init__(self, profile: object) -> None:
        import simpy  # noqa: PLC0415

        from ..sim.make_twin import make_twin  # noqa: PLC0415

        self.env = simpy.Environment()
        self.twin = make_twin(self.env, profile)  # type: ignore[arg-type]

    def __call__(self, call: Call) -> float:
        if call.output_tokens <= 0 or not self.twin.fits(call.input_tokens, call.output_tokens):
            return 0.0
        if call.gap > 0:
            self.env.run(until=self.env.now + call.gap)
        done = self.twin.submit_call(call)
        self.env.run(until=done)
        return done.value.end - done.value.submitted
