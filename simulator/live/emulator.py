"""A built-in OpenAI-compatible server that behaves like vLLM on the wire, without a model.

It serves ``GET /v1/models``, ``GET /health``, ``POST /v1/completions``, ``POST /v1/chat/completions``
and ``POST /tokenize``, streaming (SSE) or not, with ``usage`` (including
``prompt_tokens_details.cached_tokens`` from a prefix cache on token blocks) and errors in vLLM's JSON
shape and words (as of vLLM 0.32). It always generates exactly ``max_tokens`` tokens (capped by the
context, as vLLM does), as vLLM does with ``ignore_eos``.

When tokens come out is decided by a `TimingModel`: `FixedTiming` (first token exactly `ttft` after the
request arrived, then one every `itl`, on absolute times) for timing-accuracy checks, or `BatchTiming`
(one scheduler loop advancing every running stream per step; a step costs a base time, a per-running-
sequence time and a per-uncached-prompt-token prefill time), or `TwinTiming` (the setting `profile`,
`simulator.live.twin_timing`): the server twin of a profile run in real time, with its own prefix cache
and vLLM's ``GET /metrics``. A model takes requests with `TimingModel.submit` and calls each one's
`Emit` callback from its own loop as tokens come due, so one loop serves every stream (no timer or task
switch per stream and token). A stream's `Emit` writes its pre-encoded chunks straight to the connection.

Faults on request make every client error path testable: per request with the header
``X-Agentload-Fault: http_500 | http_400 | http_NNN | reset | stall | malformed``, or at random with
``faults=(("http_500", 0.01), ...)`` drawn from a seeded generator.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import json
import math
import sys
import time
import uuid
import zlib
from collections import OrderedDict, deque
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Optional, Protocol

import numpy as np
import orjson
from aiohttp import web

from ..errors import InputError
from .prompts import WORDS

FAULT_HEADER = "X-Agentload-Fault"
FAULT_KINDS = ("reset", "stall", "malformed")
"""Fault kinds besides ``http_NNN`` (any status from 400 to 599)."""

MIN_SLEEP = 0.001
"""Shortest timer the timing models set: event-loop timers have millisecond resolution."""
LATENESS_KEPT = 200_000
STATS_PATH = "/agentload/stats"

# Tokens the emulator's pretend chat template adds: a few per conversation and per message.
TEMPLATE_TOKENS = 3
TEMPLATE_TOKENS_PER_MESSAGE = 4

ERROR_TYPES = {
    400: "BadRequestError",
    401: "Unauthorized",
    404: "NotFoundError",
    429: "TooManyRequestsError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


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


@dataclass(frozen=True)
class EmulatorSettings:
    """How the emulator behaves. With `ttft` and `itl` both set, timing is fixed; otherwise batched."""

    model: str = "agentload-emulator"
    max_model_len: int = 131072
    vocab_size: int = 32000
    ttft: Optional[float] = None
    itl: Optional[float] = None
    prefill_per_token: float = 0.0
    """Seconds of a step per uncached prompt token admitted in it (batched timing)."""
    decode_per_seq: float = 0.0
    """Seconds of a step per running sequence (batched timing)."""
    decode_base: float = 0.0
    """Fixed seconds of every step (batched timing)."""
    max_num_seqs: int = 1024
    block_size: int = 16
    cache_blocks: int = 1 << 20
    """Capacity of the prefix cache, in blocks (least recently used go first)."""
    faults: tuple[tuple[str, float] | str, ...] = ()
    """(kind, rate) pairs or ``"KIND:RATE"`` strings."""
    seed: int = 0
    api_key: Optional[str] = None
    """When set, requests must carry ``Authorization: Bearer <api_key>``."""
    stall_seconds: float = 3600.0
    """How long a stalled stream hangs (until the client goes away, at most this)."""
    profile: Optional[str] = None
    """A server profile (preset name or YAML path): the server twin of `simulator.sim` decides token
    times in real time (`simulator.live.twin_timing`), and its `max_model_len` and prefix cache apply;
    the batching and fixed-timing settings are then unused."""


# -- timing models --------------------------------------------------------------------------------

Emit = Callable[[int], bool]
"""Called by a timing model when `count` more tokens of a request are due; returns False to stop the
request there (the client went away, or a fault ends the stream). Must not block."""


class TimingModel(Protocol):
    """Decides when each generated token of a request is due, for all requests in one loop."""

    def submit(self, arrival: float, prompt_tokens: int, uncached_tokens: int, output_tokens: int, emit: Emit) -> "asyncio.Future[None]":
        """Take a request that arrived at `arrival` (on `time.perf_counter`'s clock); call ``emit(count)``
        from the model's loop as its tokens come due (≥1 each time, `output_tokens` in all, never within
        this call). The returned future ends when the model is done with the request: all tokens
        emitted, `emit` returned False, or `emit` raised (the future holds the exception). Cancelling
        the future abandons the request."""
        ...

    async def close(self) -> None:
        """Stop any background work."""
        ...


def _wake(future: "asyncio.Future[None]") -> None:
    if not future.done():
        future.set_result(None)


class _Sequence:
    """A request inside a timing model."""

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


class _Loop:
    """The one background task of a timing model, with a wake-up that new requests can pull forward."""

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
        # At least a millisecond: loop timers have that resolution, and a shorter delay would spin the loop.
        handle = None if until == math.inf else self._loop.call_later(max(MIN_SLEEP, until - time.perf_counter()), _wake, future)
        try:
            await future
        finally:
            if handle is not None:
                handle.cancel()
            self._wake = None
            self._target = math.inf

    async def _run(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None


class FixedTiming(_Loop):
    """First token `ttft` after arrival, each next one `itl` after the previous, on absolute times.

    One loop serves every request: a heap of due times, one sleep to the earliest, then one token to
    every request due, written in one pass. A request that fell behind (the emulator was busy) catches
    up one token a pass; with zero delays every request gets one token a pass, as fast as the loop goes."""

    def __init__(self, ttft: float, itl: float) -> None:
        super().__init__()
        self.ttft, self.itl = ttft, itl
        self._heap: list[tuple[float, int, _Sequence]] = []
        self._count = 0
        self.passes = 0
        self.lateness: deque[float] = deque(maxlen=LATENESS_KEPT)
        """Seconds each recent token was emitted after it was due: how far the emulator's own truth slips."""

    def submit(self, arrival: float, prompt_tokens: int, uncached_tokens: int, output_tokens: int, emit: Emit) -> "asyncio.Future[None]":
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


class BatchTiming(_Loop):
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

    def submit(self, arrival: float, prompt_tokens: int, uncached_tokens: int, output_tokens: int, emit: Emit) -> "asyncio.Future[None]":
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


def timing_from(settings: EmulatorSettings) -> TimingModel:
    """The timing model the settings ask for."""
    if settings.profile is not None:
        from .twin_timing import TwinTiming  # noqa: PLC0415 - the twin (SimPy) only when asked for

        return TwinTiming.from_profile(settings.profile)
    if settings.ttft is not None or settings.itl is not None:
        return FixedTiming(settings.ttft or 0.0, settings.itl or 0.0)
    return BatchTiming(settings.prefill_per_token, settings.decode_per_seq, settings.decode_base, settings.max_num_seqs)


# -- prefix cache ---------------------------------------------------------------------------------


class PrefixCache:
    """Full token blocks keyed by a chained hash of everything before them; least recently used go first."""

    def __init__(self, block_size: int, capacity: int) -> None:
        self.block_size = block_size
        self.capacity = capacity
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def lookup_and_insert(self, ids: list[int]) -> int:
        """Tokens of `ids` found cached (whole leading blocks, leaving at least one token to compute);
        then cache all of its full blocks."""
        size = self.block_size
        hits = 0
        missed = False
        parent = 0
        for start in range(0, len(ids) - size + 1, size):
            parent = hash((parent, *ids[start : start + size]))
            if not missed and parent in self._blocks:
                hits += 1
                self._blocks.move_to_end(parent)
            else:
                missed = True
                self._blocks[parent] = None
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)
        cached = hits * size
        if cached >= len(ids) and cached > 0:
            cached -= size
        return cached


# -- the server -----------------------------------------------------------------------------------


class RequestError(Exception):
    """A request the emulator answers with an error status, in vLLM's JSON shape."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def error_response(status: int, message: str) -> web.Response:
    """vLLM's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    body = {"error": {"message": message, "type": ERROR_TYPES.get(status, "Error"), "param": None, "code": status}}
    return web.json_response(body, status=status)


def _word_id(word: str, vocab_size: int) -> int:
    return 10 + zlib.crc32(word.encode()) % max(1, vocab_size - 20)


class Emulator:
    """The emulator server: `start` it on a host and port (0: a free one), `stop` it when done."""

    def __init__(self, settings: EmulatorSettings = EmulatorSettings()) -> None:
        self._faults = [parse_fault(f, "emulator.faults") if isinstance(f, str) else (str(f[0]), float(f[1])) for f in settings.faults]
        for kind, _ in self._faults:
            check_fault_kind(kind, "emulator.faults")
        self.timing: TimingModel = timing_from(settings)
        limit = getattr(self.timing, "max_model_len", None)
        if limit is not None:  # a server twin's context length is its profile's
            settings = dataclasses.replace(settings, max_model_len=limit)
        self.settings = settings
        self.cache = PrefixCache(settings.block_size, settings.cache_blocks)
        self._rng = np.random.default_rng(settings.seed)
        self._runner: Optional[web.AppRunner] = None
        self.url: Optional[str] = None
        self.requests = 0
        self.faults_served: dict[str, int] = {}
        self.active_streams = 0
        self.max_active_streams = 0
        self._word_json = [json.dumps(" " + w).encode() for w in WORDS]
        self._model_json = json.dumps(settings.model)
        self.connections_opened = 0
        """TCP connections accepted so far (a client that reuses its connections opens few)."""

    # lifecycle

    def app(self) -> web.Application:
        """The aiohttp application (routes only; `start` runs it)."""
        app = web.Application(client_max_size=1 << 30)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_get(STATS_PATH, self._stats)
        if hasattr(self.timing, "metrics_text"):  # a server twin: vLLM's /metrics, for the run's probe
            app.router.add_get("/metrics", self._metrics)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen on host:port in the running loop; return the base URL."""
        self._runner = web.AppRunner(self.app(), handler_cancellation=True, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        server = self._runner.server
        if server is not None:
            accepted = server.connection_made

            def connection_made(handler: Any, transport: Any) -> None:
                self.connections_opened += 1
                accepted(handler, transport)

            server.connection_made = connection_made  # type: ignore[method-assign]
        site = web.TCPSite(self._runner, host, port, backlog=4096)
        await site.start()
        bound_host, bound_port = self._runner.addresses[0][:2]
        self.url = f"http://{bound_host}:{bound_port}"
        return self.url

    async def stop(self) -> None:
        """Stop listening, end open streams and the timing model."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.timing.close()

    async def __aenter__(self) -> "Emulator":
        if self.url is None:
            await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    # routes

    def stats(self) -> dict[str, Any]:
        """Counters, and with fixed timing how late tokens went out (seconds): the emulator's own error,
        part of any TTFT/ITL error a client measures against it."""
        out: dict[str, Any] = {
            "requests": self.requests,
            "connections_opened": self.connections_opened,
            "max_active_streams": self.max_active_streams,
        }
        twin_stats = getattr(self.timing, "stats", None)
        if callable(twin_stats):
            out["twin"] = twin_stats()
        lateness = getattr(self.timing, "lateness", None)
        if lateness:
            values = np.fromiter(lateness, float, len(lateness))
            p50, p99 = np.percentile(values, [50, 99])
            out["emit_lateness"] = {"count": len(values), "p50": float(p50), "p99": float(p99), "max": float(values.max())}
        return out

    async def _stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats())

    async def _metrics(self, request: web.Request) -> web.Response:
        """vLLM's Prometheus gauges and counters, when the timing model is a server twin."""
        text = self.timing.metrics_text(self.settings.model)  # type: ignore[attr-defined]
        return web.Response(text=text, content_type="text/plain")

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _models(self, request: web.Request) -> web.Response:
        s = self.settings
        card = {
            "id": s.model,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "agentload",
            "root": s.model,
            "max_model_len": s.max_model_len,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def _tokenize(self, request: web.Request) -> web.Response:
        try:
            body = await self._body(request)
            ids = self._prompt_ids(body, chat="messages" in body)
        except RequestError as exc:
            return error_response(exc.status, exc.message)
        return web.json_response({"count": len(ids), "max_model_len": self.settings.max_model_len, "tokens": ids})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    # request handling

    def _authorised(self, request: web.Request) -> bool:
        key = self.settings.api_key
        return key is None or request.headers.get("Authorization") == f"Bearer {key}"

    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = orjson.loads(await request.read())
        except ValueError as exc:  # orjson's errors (bad JSON, bad UTF-8) are ValueErrors
            raise RequestError(400, f"Invalid JSON body: {exc}") from None
        if not isinstance(body, dict):
            raise RequestError(400, "Request body must be a JSON object")
        return body

    def _pick_fault(self, request: web.Request) -> Optional[str]:
        fault = request.headers.get(FAULT_HEADER)
        if fault is not None:
            try:
                check_fault_kind(fault)
            except InputError as exc:
                raise RequestError(400, exc.message) from None
            return fault
        if self._faults:
            draw = self._rng.random()
            for kind, rate in self._faults:
                if draw < rate:
                    return kind
                draw -= rate
        return None

    def _prompt_ids(self, body: dict[str, Any], chat: bool) -> list[int]:
        vocab = self.settings.vocab_size
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise RequestError(400, "'messages' must be a non-empty list")
            ids = [1, 2, 3][:TEMPLATE_TOKENS]
            for message in messages:
                if not isinstance(message, dict) or "role" not in message:
                    raise RequestError(400, "each message must be an object with a 'role'")
                content = message.get("content") or ""
                if isinstance(content, list):
                    content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
                if not isinstance(content, str):
                    raise RequestError(400, "message 'content' must be a string or a list of parts")
                ids.extend((4, _word_id(str(message["role"]), vocab), 5, 6)[:TEMPLATE_TOKENS_PER_MESSAGE])
                ids.extend(_word_id(w, vocab) for w in content.split())
            return ids
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (list, str)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return [_word_id(w, vocab) for w in prompt.split()]
        # set(map(type, ...)), min and max run in C: a per-token Python check was a third of a request's cost
        if isinstance(prompt, list) and set(map(type, prompt)) <= {int}:
            if not prompt:
                raise RequestError(400, "Prompt cannot be empty")
            if min(prompt) < 0 or max(prompt) >= vocab:
                bad = next(t for t in prompt if not 0 <= t < vocab)
                raise RequestError(400, f"Token id {bad} is out of vocabulary")
            return prompt
        raise RequestError(400, "'prompt' must be a string, a list of token ids, or a one-element list of either")

    def _sampling(self, body: dict[str, Any], prompt_len: int, chat: bool) -> int:
        s = self.settings
        model = body.get("model")
        if model is not None and model != s.model:
            raise RequestError(404, f"The model `{model}` does not exist.")
        if body.get("n", 1) != 1:
            raise RequestError(400, "the emulator supports n=1 only")
        temperature = body.get("temperature", 1.0)
        if not isinstance(temperature, (int, float)) or temperature < 0:
            raise RequestError(400, f"temperature must be non-negative, got {temperature}.")
        if body.get("stream_options") is not None and not body.get("stream"):
            raise RequestError(400, "Stream options can only be defined when `stream=True`.")
        key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
        max_tokens = body.get(key)
        if max_tokens is None:
            max_tokens = s.max_model_len - prompt_len if chat else 16
        if type(max_tokens) is not int or max_tokens < 1:
            raise RequestError(400, f"max_tokens must be at least 1, got {max_tokens}.")
        if prompt_len > s.max_model_len:
            raise RequestError(
                400,
                f"This model's maximum context length is {s.max_model_len} tokens. However, your prompt "
                f"contains {prompt_len} input tokens, which exceeds this limit even without any output "
                f"tokens. Please reduce the length of the input prompt. "
                f"(parameter=input_tokens, value={prompt_len})",
            )
        # vLLM caps max_tokens at what the context leaves, then checks min_tokens against it
        max_tokens = min(max_tokens, s.max_model_len - prompt_len)
        min_tokens = body.get("min_tokens", 0)
        if type(min_tokens) is not int or min_tokens < 0:
            raise RequestError(400, f"min_tokens must be greater than or equal to 0, got {min_tokens}.")
        if min_tokens > max_tokens:
            raise RequestError(400, f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.")
        return max_tokens

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        arrival = time.perf_counter()
        self.requests += 1
        if not self._authorised(request):
            return web.json_response({"error": "Unauthorized"}, status=401)
        try:
            fault = self._pick_fault(request)
            body = await self._body(request)
            ids = self._prompt_ids(body, chat)
            max_tokens = self._sampling(body, len(ids), chat)
        except RequestError as exc:
            return error_response(exc.status, exc.message)
        if fault is not None:
            self.faults_served[fault] = self.faults_served.get(fault, 0) + 1
            if fault.startswith("http_"):
                status = int(fault[5:])
                return error_response(status, f"injected fault {fault}")
        # a server twin keeps its own prefix cache and tells the cached tokens when the request ends
        twin = getattr(self.timing, "takes_prompt_ids", False)
        cached = 0 if twin else self.cache.lookup_and_insert(ids)
        usage = {
            "prompt_tokens": len(ids),
            "total_tokens": len(ids) + max_tokens,
            "completion_tokens": max_tokens,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        self.active_streams += 1
        self.max_active_streams = max(self.max_active_streams, self.active_streams)
        done: Optional[asyncio.Future[None]] = None
        try:
            if not body.get("stream"):
                done = self._submit(twin, arrival, ids, cached, max_tokens, _keep_going)
                await done
                if twin:
                    usage["prompt_tokens_details"]["cached_tokens"] = done.result()
                return web.json_response(self._whole(chat, max_tokens, usage))
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            response.enable_chunked_encoding()
            await response.prepare(request)
            await response.write(b"")  # the headers go out now, as vLLM's do, before the first token
            writer = _ChunkWriter(request, self._head(chat)[1], chat, max_tokens, self._word_json, fault)
            done = self._submit(twin, arrival, ids, cached, max_tokens, writer)
            try:
                await done
            except ConnectionError:
                return response  # the client went away
            if twin:
                usage["prompt_tokens_details"]["cached_tokens"] = done.result()
            if writer.stop == "reset":
                return response
            if writer.stop == "stall":
                await asyncio.sleep(self.settings.stall_seconds)
                return response
            if writer.stop is not None:  # the transport closed under us
                return response
            tail = b"data: [DONE]\n\n"
            if include_usage:
                tail = f'data: {writer.head},"choices":[],"usage":{json.dumps(usage)}}}\n\n'.encode() + tail
            try:
                await response.write_eof(tail)  # the last chunks and the end of the response in one write
            except ConnectionError:
                pass  # the client went away after the last token: nothing left to tell it
            return response
        finally:
            self.active_streams -= 1
            if done is not None and not done.done():
                done.cancel()  # abandoned (the handler was cancelled): the timing model drops it

    def _submit(self, twin: bool, arrival: float, ids: list[int], cached: int, max_tokens: int,
                emit: Emit) -> "asyncio.Future[Any]":
        if twin:
            return self.timing.submit(arrival, len(ids), len(ids), max_tokens, emit, prompt_ids=ids)  # type: ignore[call-arg]
        return self.timing.submit(arrival, len(ids), len(ids) - cached, max_tokens, emit)

    def _head(self, chat: bool) -> tuple[str, str]:
        kind = "chat.completion" if chat else "text_completion"
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        return rid, f'{{"id":"{rid}","object":"{kind}{".chunk" if chat else ""}","created":{int(time.time())},"model":{self._model_json}'

    def _whole(self, chat: bool, max_tokens: int, usage: dict[str, Any]) -> dict[str, Any]:
        text = "".join(" " + WORDS[i % len(WORDS)] for i in range(max_tokens))
        rid, _ = self._head(chat)
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length", "stop_reason": None}
        return {
            "id": rid,
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.settings.model,
            "choices": [choice],
            "usage": usage,
        }


def _keep_going(count: int) -> bool:
    return True


class _ChunkWriter:
    """Writes the token chunks of one SSE response straight to its connection, from the timing model's
    loop (no task switch per token). Each chunk is its pre-encoded head, the word and a tail, framed for
    HTTP chunked transfer encoding (the response was prepared chunked and its headers already sent)."""

    __slots__ = ("transport", "head", "opening", "prefix", "tail", "last_tail", "words", "sent", "max_tokens", "fault", "stop")

    def __init__(self, request: web.Request, head: str, chat: bool, max_tokens: int, words: list[bytes], fault: Optional[str]) -> None:
        self.transport = request.transport
        self.head = head
        raw = head.encode()
        if chat:
            self.opening: bytes = b"data: " + raw + b',"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
            self.prefix = b"data: " + raw + b',"choices":[{"index":0,"delta":{"content":'
            self.tail = b'},"logprobs":null,"finish_reason":null}]}\n\n'
            self.last_tail = b'},"logprobs":null,"finish_reason":"length"}]}\n\n'
        else:
            self.opening = b""
            self.prefix = b"data: " + raw + b',"choices":[{"index":0,"text":'
            self.tail = b',"logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'
            self.last_tail = b',"logprobs":null,"finish_reason":"length","stop_reason":null}]}\n\n'
        self.words = words
        self.sent = 0
        self.max_tokens = max_tokens
        self.fault = fault
        self.stop: Optional[str] = None
        """Why the stream stopped early: a fault kind, or 'closed' when the connection went."""

    def __call__(self, count: int) -> bool:
        transport = self.transport
        if transport is None or transport.is_closing():
            self.stop = "closed"
            return False
        parts = [self.opening] if self.sent == 0 and self.opening else []
        words, prefix, tail = self.words, self.prefix, self.tail
        sent, last = self.sent, self.max_tokens
        for _ in range(count):
            sent += 1
            parts += (prefix, words[sent % len(words)], tail if sent != last else self.last_tail)
        self.sent = sent
        fault = self.fault
        if fault is not None and sent >= min(2, last):
            if fault == "reset":
                self._write(parts)
                transport.abort()
                self.stop = fault
                return False
            if fault == "stall":
                self._write(parts)
                self.stop = fault
                return False
            parts.append(b'data: {"choices": [\n\n')  # malformed, once
            self.fault = None
        self._write(parts)
        return True

    def _write(self, parts: list[bytes]) -> None:
        data = b"".join(parts)
        self.transport.write(b"%x\r\n%b\r\n" % (len(data), data))  # type: ignore[union-attr]


@asynccontextmanager
async def run_emulator(host: str = "127.0.0.1", port: int = 0, **settings: Any) -> AsyncIterator[str]:
    """Run an emulator in the current event loop for the duration of the block; yields its base URL.

    Keyword arguments are `EmulatorSettings` fields, e.g. ``run_emulator(ttft=0.05, itl=0.01)``.
    """
    emulator = Emulator(EmulatorSettings(**settings))
    url = await emulator.start(host, port)
    try:
        yield url
    finally:
        await emulator.stop()


@dataclass(frozen=True)
class EmulatorProcess:
    """An emulator running in a child process."""

    url: str
    pid: int


@asynccontextmanager
async def emulator_process(*cli_args: str, python: str = sys.executable) -> AsyncIterator[EmulatorProcess]:
    """Run ``agentload serve-emulator`` in a child process on a free loopback port for the duration
    of the block. `cli_args` are further command-line options, e.g. ``("--ttft", "0.05", "--itl",
    "0.01")``. Keeps the server off this process's event loop (and CPU)."""
    proc = await asyncio.create_subprocess_exec(
        python, "-m", "simulator", "serve-emulator", "--host", "127.0.0.1", "--port", "0", *cli_args,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        if " on http" not in line:
            raise RuntimeError(f"emulator did not start (exit code {await proc.wait()})")
        yield EmulatorProcess(url=line.rsplit(" ", 1)[1].strip(), pid=proc.pid)
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()
