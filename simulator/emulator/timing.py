"""Timing models: when each generated token of a request is due.

A model takes requests with `TimingModel.submit` and calls each one's `Emit` callback from its own
loop as tokens come due, so one loop serves every stream (no timer or task switch per stream and
token). `FixedTiming` (first token exactly `ttft` after the request arrived, then one every `itl`, on
absolute times) serves timing-accuracy checks; `BatchTiming` (one scheduler loop advancing every
running stream per step) a throughput-shaped server; `simulator.emulator.twin_timing.TwinTiming` the
server twin of a profile. All three run on `LoopTiming`, the shared one-task timer.

What a model offers the server beyond `submit` and `close` is declared on `TimingModel`, with
defaults meaning "nothing": `max_model_len`, `keeps_prefix_cache`, `lateness`, `stats` and
`metrics_text`.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import time
from abc import ABC, abstractmethod
from collections import deque
from typing import Any, Callable, Collection, Optional, Sequence

SHORTEST_TIMER = 0.001
"""Shortest timer the timing loop sets: event-loop timers have millisecond resolution, and a shorter
delay would spin the loop."""
LATENESS_KEPT = 200_000
"""How many recent lateness samples a model keeps."""

Emit = Callable[[int], bool]
"""Called by a timing model when `count` more tokens of a request are due; returns False to stop the
request there (the client went away, or a fault ends the stream). Must not block."""


class TimingModel(ABC):
    """Decides when each generated token of a request is due, for all requests in one loop.

    The class attributes and the non-abstract methods are the model's declared capabilities, which
    the server uses as they are; the defaults here declare none."""

    max_model_len: Optional[int] = None
    """The context length the model imposes (a server twin's is its profile's); it replaces the
    settings' `max_model_len`. None: the settings' applies."""

    keeps_prefix_cache: bool = False
    """True when the model keeps its own prefix cache: the server then leaves its own cache alone,
    passes ``uncached_tokens == prompt_tokens``, and takes the cached prompt tokens it reports from the
    result of the future `submit` returns. False: the server's cache decides `uncached_tokens`."""

    lateness: Collection[float] = ()
    """Seconds after they were due that recent tokens (or batches of them) went out: the emulator's
    own error beside its schedule, summarised in ``GET /agentload/stats``. Empty: not kept."""

    @abstractmethod
    def submit(self, arrival: float, prompt_tokens: int, uncached_tokens: int, output_tokens: int, emit: Emit,
               prompt_ids: Optional[Sequence[int]] = None) -> "asyncio.Future[Any]":
        """Take a request that arrived at `arrival` (on `time.perf_counter`'s clock); call ``emit(count)``
        from the model's loop as its tokens come due (≥1 each time, `output_tokens` in all, never within
        this call). `prompt_ids` are the prompt's token ids (a model with its own prefix cache uses
        them). The returned future ends when the model is done with the request: all tokens emitted,
        `emit` returned False, or `emit` raised (the future holds the exception); its result is the
        cached prompt tokens when `keeps_prefix_cache`, else None. Cancelling it abandons the request."""

    @abstractmethod
    async def close(self) -> None:
        """Stop any background work."""

    def stats(self) -> dict[str, Any]:
        """Entries the model adds to ``GET /agentload/stats`` (none by default)."""
        return {}

    def metrics_text(self, model: str) -> Optional[str]:
        """vLLM's Prometheus text for ``GET /metrics`` as the model stands now, labelled with the served
        `model` name. None (the default) when the model keeps no such metrics: the server then serves
        no ``/metrics`` at all, so the answer must not change over the model's life."""
        return None


def _wake(future: "asyncio.Future[None]") -> None:
    if not future.done():
        future.set_result(None)


class LoopTiming(TimingModel):
    """A timing model run by one background task, started by the first request, with a wake-up that
    new requests can pull forward. Subclasses implement `_run` (the task) and call `_ensure` (start it,
    get the loop), `_poke` (a request is due sooner) and `_sleep` (wait for a time or a poke)."""

    def __init__(self) -> None:
        self._task: Optional[asyncio.Task] = None
        self._wake: Optional[asyncio.Future[None]] = None
        self._target = math.inf
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    def _ensure(self) -> asyncio.AbstractEventLoop:
        if self._task is None:
            self._loop = asyncio.get_running_loop()
            self._task = self._loop.create_task(self._run())
        assert self._loop is not None
        return self._loop

    def _poke(self, due: float) -> None:
        """A request is due at `due`: wake the loop if it sleeps past that."""
        if due < self._target and self._wake is not None:
            _wake(self._wake)

    async def _sleep(self, until: float) -> None:
        """Sleep until `until` on perf_counter (math.inf: until poked), or until poked earlier.
        Loop timers may fire up to a millisecond early; the caller re-checks the time."""
        assert self._loop is not None
        self._target = until
        self._wake = future = self._loop.create_future()
        delay = until - time.perf_counter()
        handle = None if until == math.inf else self._loop.call_later(max(SHORTEST_TIMER, delay), _wake, future)
        try:
            await future
        finally:
            if handle is not None:
                handle.cancel()
            self._wake = None
            self._target = math.inf

    @abstractmethod
    async def _run(self) -> None:
        """The model's loop: runs until `close` cancels it."""

    async def close(self) -> None:
        """Cancel the loop's task (requests still in it are left as they are)."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None


class _Sequence:
    """A request inside `FixedTiming` or `BatchTiming`."""

    __slots__ = ("prefill", "left", "emit", "future", "due", "index", "arrival")

    def __init__(self, prefill: int, output_tokens: int, emit: Emit, future: "asyncio.Future[None]") -> None:
        self.prefill = prefill
        self.left = output_tokens
        self.emit = emit
        self.future = future
        self.due = 0.0
        self.index = 0
        self.arrival = 0.0

    def give(self, count: int) -> bool:
        """Emit `count` tokens; False when the request is over (finished, stopped or failed)."""
        self.left -= count
        try:
            keep = self.emit(count)
        except Exception as exc:  # the model's loop must go on for the other requests
            self.future.set_exception(exc)
            return False
        if not keep or self.left <= 0:
            self.future.set_result(None)
            return False
        return True


class FixedTiming(LoopTiming):
    """First token `ttft` after arrival, each next one `itl` after the previous, on absolute times.

    One loop serves every request: a heap of due times, one sleep to the earliest, then one token to
    every request due, written in one pass. A request that fell behind (the emulator was busy) catches
    up one token a pass; with zero delays every request gets one token a pass, as fast as the loop goes.
    Keeps the `lateness` of every token."""

    def __init__(self, ttft: float, itl: float) -> None:
        super().__init__()
        self.ttft, self.itl = ttft, itl
        self._heap: list[tuple[float, int, _Sequence]] = []
        self._count = 0
        self.passes = 0
        self.lateness: deque[float] = deque(maxlen=LATENESS_KEPT)

    def submit(self, arrival: float, prompt_tokens: int, uncached_tokens: int, output_tokens: int, emit: Emit,
               prompt_ids: Optional[Sequence[int]] = None) -> "asyncio.Future[None]":
        """See `TimingModel.submit`; the prompt does not matter here."""
        loop = self._ensure()
        future: asyncio.Future[None] = loop.create_future()
        if output_tokens <= 0:
            future.set_result(None)
            return future
        seq = _Sequence(uncached_tokens, output_tokens, emit, future)
        seq.arrival = arrival
        due = arrival + self.ttft
        self._count += 1
        heapq.heappush(self._heap, (due, self._count, seq))
        self._poke(due)
        return future

    async def _run(self) -> None:
        heap = self._heap
        clock = time.perf_counter
        pop, push = heapq.heappop, heapq.heappush
        ttft, itl = self.ttft, self.itl
        while True:
            if not heap:
                await self._sleep(math.inf)
                continue
            now = clock()
            if heap[0][0] > now:
                await self._sleep(heap[0][0])
                continue
            due_now = []
            while heap and heap[0][0] <= now:
                due_now.append(pop(heap)[2])
            late = self.lateness.append
            for seq in due_now:
                if seq.future.done():  # abandoned
                    continue
                late(now - (seq.arrival + ttft + seq.index * itl))
                if seq.give(1):
                    seq.index += 1
                    self._count += 1
                    push(heap, (seq.arrival + ttft + seq.index * itl, self._count, seq))
            self.passes += 1
            await asyncio.sleep(0)  # let the writes go out and new requests in


class BatchTiming(LoopTiming):
    """Continuous batching in one loop: each step admits waiting requests (their uncached prompt tokens
    cost `prefill_per_token` each) and gives every running request one token. A step lasts
    ``decode_base + decode_per_seq * running + prefill_per_token * admitted_uncached_tokens``."""

    def __init__(self, prefill_per_token: float, decode_per_seq: float, decode_base: float = 0.0, max_num_seqs: int = 1024) -> None:
        super().__init__()
        self.prefill_per_token = prefill_per_token
        self.decode_per_seq = decode_per_seq
        self.decode_base = decode_base
        self.max_num_seqs = max_num_seqs
        self._waiting: deque[_Sequence] = deque()
        self._running: list[_Sequence] = []
        self.steps = 0

    def submit(self, arrival: float, prompt_tokens: int, uncached_tokens: int, output_tokens: int, emit: Emit,
               prompt_ids: Optional[Sequence[int]] = None) -> "asyncio.Future[None]":
        """See `TimingModel.submit`; only the uncached prompt tokens cost time."""
        loop = self._ensure()
        future: asyncio.Future[None] = loop.create_future()
        if output_tokens <= 0:
            future.set_result(None)
            return future
        self._waiting.append(_Sequence(uncached_tokens, output_tokens, emit, future))
        self._poke(-math.inf)
        return future

    async def _run(self) -> None:
        clock = time.perf_counter
        next_step = clock()
        while True:
            if not self._running and not self._waiting:
                await self._sleep(math.inf)
                next_step = clock()
                continue
            prefill = 0
            while self._waiting and len(self._running) < self.max_num_seqs:
                seq = self._waiting.popleft()
                if not seq.future.done():
                    self._running.append(seq)
                    prefill += seq.prefill
            self._running = [s for s in self._running if not s.future.done()]
            step = self.decode_base + self.decode_per_seq * len(self._running) + self.prefill_per_token * prefill
            if step > 0:
                next_step = max(next_step + step, clock())
                while clock() < next_step:
                    await self._sleep(next_step)
            else:
                next_step = clock()
                await asyncio.sleep(0)
            self.steps += 1
            still = []
            for seq in self._running:
                if not seq.future.done() and seq.give(1):  # give: False once the request is over
                    still.append(seq)
            self._running = still
