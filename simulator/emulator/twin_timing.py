"""The emulator's timing from the server twin, run in real time: the built-in emulator behaves like the
server a profile describes (queueing, chunked prefill, prefix caching, preemption), as `simulate` does.

`TwinTiming` owns a SimPy environment whose clock *is* `time.perf_counter` and a `Twin` on it. Its one
loop sleeps until the next SimPy event is due (``env.peek()``), then processes every event due by now;
a request is submitted at its HTTP arrival (or at the twin's clock, when that has already moved past
it). So the scheduler that decides token times is the twin's own code, the same that `simulate` runs,
and emulator and simulation agree by construction; only when tokens reach the wire depends on the
event loop's promptness, never the schedule.

Two departures from `simulate`, both forced by real time:

- The twin runs with ``fast_decode=False``: its fast path advances many decode steps at once up to
  the next *known* event, and requests arriving over HTTP are not known in advance. Stepping one by
  one gives the same records (the twin's tests check this), only slower.
- Tokens stream while the request runs: after each batch of events the loop compares each running
  request's generated count with what its stream was given (the twin's ``running`` requests, their
  ``tag`` and ``generated``), and emits the rest when the request's completion event fires.

Prompts are token ids: each full block of the profile's ``block_size`` ids gets a hash id (chained
over the blocks before it), so equal token prefixes give equal ids and the twin's prefix cache sees
exactly the reuse the prompts carry. The future `submit` returns ends with the prompt tokens the prefix
cache served (``usage.prompt_tokens_details.cached_tokens``).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from typing import Any, Callable, Optional, Sequence

import simpy

from ..sim.make_twin import make_twin
from ..sim.profile import ServerProfile, load_profile
from ..sim.twin import Completion
from .prefix_cache import block_hash_ids
from .timing import LATENESS_KEPT, Emit, LoopTiming


class _TokenDelivery:
    """One request inside `TwinTiming`: how many of its tokens went out, and where they go."""

    __slots__ = ("emit", "future", "sent", "prompt_tokens", "live")

    def __init__(self, emit: Emit, future: "asyncio.Future[int]", prompt_tokens: int) -> None:
        self.emit = emit
        self.future = future
        self.sent = 0
        self.prompt_tokens = prompt_tokens
        self.live = True
        """False once the client went away or `emit` failed: the twin finishes the request unseen."""

    def give(self, count: int) -> None:
        """Emit `count` more tokens (no-op once the stream is over)."""
        if count <= 0 or not self.live:
            return
        if self.future.done():  # abandoned by the emulator (cancelled)
            self.live = False
            return
        self.sent += count
        try:
            keep = self.emit(count)
        except Exception as exc:  # the loop must go on for the other requests
            self.live = False
            self.future.set_exception(exc)
            return
        if not keep:
            self.live = False
            self.future.set_result(0)


class TwinTiming(LoopTiming):
    """A `TimingModel` whose scheduler is the server twin of `profile`, run on the real clock.

    Declares every capability: it keeps its own prefix cache (the twin's), imposes the profile's
    `max_model_len`, keeps the `lateness` of each batch of events, adds its counters to the stats
    (under ``twin``) and serves vLLM's gauges and counters as ``GET /metrics``."""

    keeps_prefix_cache = True

    def __init__(self, profile: ServerProfile, clock: Callable[[], float] = time.perf_counter) -> None:
        super().__init__()
        self.profile = profile
        self.clock = clock
        self.env = simpy.Environment(initial_time=clock())
        self.twin = make_twin(self.env, profile, fast_decode=False)
        self.block_size = profile.kv_cache.block_size
        self.max_model_len: Optional[int] = profile.scheduler.max_model_len
        self._pending: list[tuple[float, int, int, list[int], _TokenDelivery]] = []
        self._streams: set[_TokenDelivery] = set()
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.lateness: deque[float] = deque(maxlen=LATENESS_KEPT)
        """Seconds after its due time that each batch of SimPy events was processed: how late tokens
        reached the wire beside the twin's schedule (the emulator's own error)."""
        self.failure: Optional[BaseException] = None
        """What stopped the twin (it raised), if anything: later requests fail with it."""

    @classmethod
    def from_profile(cls, source: str) -> "TwinTiming":
        """A twin timing of a preset name or profile YAML path."""
        return cls(load_profile(source))

    def submit(self, arrival: float, prompt_tokens: int, uncached_tokens: int, output_tokens: int, emit: Emit,
               prompt_ids: Optional[Sequence[int]] = None) -> "asyncio.Future[int]":
        """Queue a request that arrived at `arrival` (perf_counter); its prefix blocks come from
        `prompt_ids` (none given: nothing is shared). The future ends with its cached prompt tokens."""
        loop = self._ensure()
        future: asyncio.Future[int] = loop.create_future()
        if self.failure is not None:
            future.set_exception(RuntimeError(f"the server twin stopped: {self.failure}"))
            return future
        if output_tokens <= 0:
            future.set_result(0)
            return future
        if not self.twin.fits(prompt_tokens, output_tokens):
            future.set_exception(ValueError(
                f"{prompt_tokens} + {output_tokens} tokens exceed max_model_len {self.max_model_len}"))
            return future
        hash_ids = block_hash_ids(prompt_ids, self.block_size) if prompt_ids is not None else []
        self._pending.append((arrival, prompt_tokens, output_tokens, hash_ids, _TokenDelivery(emit, future, prompt_tokens)))
        self._poke(-math.inf)
        return future

    # ---- the loop -------------------------------------------------------------------------------

    async def _run(self) -> None:
        env = self.env
        while True:
            try:
                self._advance(self.clock())
            except Exception as exc:  # the twin raised: no request can be served any more
                self._fail(exc)
                return
            due = env.peek()
            if due <= self.clock():
                await asyncio.sleep(0)  # behind: let writes and new requests through, then catch up
            else:
                await self._sleep(due)

    def _advance(self, now: float) -> None:
        """Submit the requests that came in, process every SimPy event due by `now`, emit tokens."""
        env, twin = self.env, self.twin
        pending, self._pending = self._pending, []
        for arrival, prompt, out, hash_ids, stream in pending:
            if stream.future.done():  # abandoned before it reached the twin
                continue
            if arrival > env.now:
                env.run(until=arrival)  # events before the arrival come first
            event = twin.submit(prompt, out, hash_ids, self.block_size, tag=stream)
            event.callbacks.append(self._finished)
            self._streams.add(stream)
            self.prompt_tokens += prompt
        if env.peek() <= now:
            self.lateness.append(now - env.peek())
        while env.peek() <= now:
            env.step()
        for stream, generated in twin.in_flight():  # tokens so far, up to the last step processed
            if generated > stream.sent:
                self._give(stream, generated - stream.sent)

    def _give(self, stream: _TokenDelivery, count: int) -> None:
        self.generation_tokens += count
        stream.give(count)

    def _finished(self, event: simpy.Event) -> None:
        done: Completion = event.value
        stream: _TokenDelivery = done.tag
        self._streams.discard(stream)
        self._give(stream, done.output_tokens - stream.sent)
        if not stream.future.done():
            stream.future.set_result(done.cached_tokens)

    def _fail(self, exc: BaseException) -> None:
        self.failure = exc
        error = RuntimeError(f"the server twin stopped: {exc}")
        for stream in self._streams | {p[-1] for p in self._pending}:
            if not stream.future.done():
                stream.future.set_exception(error)
        self._streams.clear()
        self._pending.clear()

    # ---- observation ----------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """The twin's counters, as ``twin`` in ``GET /agentload/stats``."""
        return {"twin": self.counters()}

    def counters(self) -> dict[str, Any]:
        """The twin's counters: its profile, steps, finished requests, preemptions, tokens, cache."""
        s = self.twin.stats
        return {
            "profile": self.profile.name,
            "steps": s.steps,
            "finished": s.finished,
            "preemptions": s.preemptions,
            "prefill_tokens": s.prefill_tokens,
            "cached_prompt_tokens": s.cached_tokens,
            "output_tokens": s.output_tokens,
            "max_running": s.max_running,
            "busy_seconds": s.busy_time,
            "kv_evicted_blocks": self.twin.kv.evictions,
        }

    def metrics(self) -> dict[str, float]:
        """vLLM's gauges and counters (names without the ``vllm:`` prefix) as the twin stands now."""
        twin, kv = self.twin, self.twin.kv
        return {
            "num_requests_running": float(len(twin.running) + twin.group.size),
            "num_requests_waiting": float(len(twin.waiting) + len(self._pending)),
            "kv_cache_usage_perc": kv.used / kv.num_blocks if kv.num_blocks else 0.0,
            "prefix_cache_queries_total": float(twin.stats.queried_tokens),
            "prefix_cache_hits_total": float(twin.stats.cached_tokens),
            "prompt_tokens_cached_total": float(twin.stats.cached_tokens),
            "num_preemptions_total": float(twin.stats.preemptions),
            "request_success_total": float(twin.stats.finished),
            "prompt_tokens_total": float(self.prompt_tokens),
            "generation_tokens_total": float(self.generation_tokens),
        }

    def metrics_text(self, model: str) -> Optional[str]:
        """`metrics` in Prometheus' text format, labelled with the served model name."""
        lines = []
        for name, value in self.metrics().items():
            kind = "counter" if name.endswith("_total") else "gauge"
            family = name[:-6] if kind == "counter" else name
            lines.append(f"# TYPE vllm:{family} {kind}")
            lines.append(f'vllm:{name}{{model_name="{model}"}} {value!r}')
        return "\n".join(lines) + "\n"
