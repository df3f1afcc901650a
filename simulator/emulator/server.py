"""The emulator's HTTP server: vLLM's routes and wire format over a timing model (`timing`) that
decides when each token goes out."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Optional

import numpy as np
from aiohttp import web

from ..errors import InputError
from .api import RequestError, error_response, max_tokens_of, prompt_ids, read_body
from .faults import FAULT_HEADER, FaultDraws
from ..rx_stamps import listener, last_arrival
from ..words import WORDS
from .prefix_cache import PrefixCache
from .settings import REPLICA_HEADER, EmulatorSettings
from .stream import ChunkWriter
from .timing import BatchTiming, Emit, FixedTiming, TimingModel

STATS_PATH = "/agentload/stats"
RETRY_AFTER_STATUSES = (429, 503)
"""Injected faults that carry ``Retry-After`` when the settings give one (rate limited, unavailable)."""


def timing_from(settings: EmulatorSettings) -> TimingModel:
    """The timing model the settings ask for: the twin of `profile`, else fixed timing when `ttft` or
    `itl` is set, else batched."""
    if settings.profile is not None:
        from . import twin_timing  # noqa: PLC0415 - the twin (SimPy) only when asked for

        return twin_timing.TwinTiming.from_profile(settings.profile)
    if settings.ttft is not None or settings.itl is not None:
        return FixedTiming(settings.ttft or 0.0, settings.itl or 0.0)
    return BatchTiming(settings.prefill_per_token, settings.decode_per_seq, settings.decode_base, settings.max_num_seqs)


class Emulator:
    """The emulator server: `start` it on a host and port (0: a free one), `stop` it when done.

    `timing` replaces the timing model the settings ask for (`timing_from`); what the model declares
    (`TimingModel.max_model_len`, its own prefix cache, lateness, stats, metrics) shapes the server."""

    def __init__(self, settings: EmulatorSettings = EmulatorSettings(), timing: Optional[TimingModel] = None) -> None:
        self._faults = FaultDraws(settings.faults, settings.seed)
        self.timing: TimingModel = timing if timing is not None else timing_from(settings)
        if self.timing.max_model_len is not None:
            settings = settings.model_copy(update={"max_model_len": self.timing.max_model_len})
        self.settings = settings
        self.cache = PrefixCache(settings.block_size, settings.cache_blocks)
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
        if self.timing.metrics_text(self.settings.model) is not None:  # a server twin: vLLM's /metrics
            app.router.add_get("/metrics", self._metrics)
        if self.settings.replica is not None:  # a fleet's replica names itself in every response
            app.on_response_prepare.append(self._name_replica)
        return app

    async def _name_replica(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers[REPLICA_HEADER] = self.settings.replica  # type: ignore[assignment]

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
        site = web.SockSite(self._runner, listener(host, port, backlog=4096))
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
        """Counters, the timing model's own entries, and when it keeps them how late tokens went out
        (seconds): the emulator's own error, part of any TTFT/ITL error a client measures against it."""
        out: dict[str, Any] = {
            "requests": self.requests,
            "connections_opened": self.connections_opened,
            "active_streams": self.active_streams,
            "max_active_streams": self.max_active_streams,
        }
        out.update(self.timing.stats())
        lateness = self.timing.lateness
        if lateness:
            values = np.fromiter(lateness, float, len(lateness))
            p50, p99 = np.percentile(values, [50, 99])
            out["emit_lateness"] = {"count": len(values), "p50": float(p50), "p99": float(p99), "max": float(values.max())}
        return out

    async def _stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats())

    async def _metrics(self, request: web.Request) -> web.Response:
        """vLLM's Prometheus gauges and counters, from a timing model that keeps them."""
        return web.Response(text=self.timing.metrics_text(self.settings.model), content_type="text/plain")

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
            body = await read_body(request)
            ids = prompt_ids(body, "messages" in body, self.settings.vocab_size)
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

    def _pick_fault(self, request: web.Request) -> Optional[str]:
        try:
            return self._faults.pick(request.headers.get(FAULT_HEADER))
        except InputError as exc:
            raise RequestError(400, exc.message) from None

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        # The request's clock starts when it reached this machine (the kernel's stamp), not when this
        # loop got to it: a burst of requests read one after another is not late by the reading.
        arrival = last_arrival(request.transport) or time.perf_counter()
        self.requests += 1
        if not self._authorised(request):
            return web.json_response({"error": "Unauthorized"}, status=401)
        s = self.settings
        try:
            fault = self._pick_fault(request)
            body = await read_body(request)
            ids = prompt_ids(body, chat, s.vocab_size)
            max_tokens = max_tokens_of(body, len(ids), chat, s.model, s.max_model_len)
        except RequestError as exc:
            return error_response(exc.status, exc.message)
        if fault is not None:
            self.faults_served[fault] = self.faults_served.get(fault, 0) + 1
            if fault.startswith("http_"):
                response = error_response(int(fault[5:]), f"injected fault {fault}")
                if s.retry_after is not None and response.status in RETRY_AFTER_STATUSES:
                    response.headers["Retry-After"] = f"{s.retry_after:g}"
                return response
        # a model with its own prefix cache tells the cached tokens when the request ends (`_serve`)
        cached = 0 if self.timing.keeps_prefix_cache else self.cache.lookup_and_insert(ids)
        usage = {
            "prompt_tokens": len(ids),
            "total_tokens": len(ids) + max_tokens,
            "completion_tokens": max_tokens,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        self.active_streams += 1
        self.max_active_streams = max(self.max_active_streams, self.active_streams)
        try:
            if not body.get("stream"):
                await self._serve(arrival, ids, cached, max_tokens, _keep_going, usage)
                return web.json_response(self._whole(chat, max_tokens, usage))
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return await self._stream(request, chat, fault, include_usage, arrival, ids, cached, max_tokens, usage)
        finally:
            self.active_streams -= 1

    async def _serve(self, arrival: float, ids: list[int], cached: int, max_tokens: int, emit: Emit,
                     usage: dict[str, Any]) -> None:
        """Have the timing model emit the request's tokens; return when it is done with it. A model
        with its own prefix cache puts its cached tokens in `usage`. Cancelled (the handler was), the
        timing model drops the request."""
        done = self.timing.submit(arrival, len(ids), len(ids) - cached, max_tokens, emit, prompt_ids=ids)
        try:
            await done
        finally:
            if not done.done():
                done.cancel()
        if self.timing.keeps_prefix_cache:
            usage["prompt_tokens_details"]["cached_tokens"] = done.result()

    async def _stream(self, request: web.Request, chat: bool, fault: Optional[str], include_usage: bool,
                      arrival: float, ids: list[int], cached: int, max_tokens: int,
                      usage: dict[str, Any]) -> web.StreamResponse:
        """The SSE response: headers at once, as vLLM's, then the token chunks as the timing model
        emits them (a stream fault cuts them short), then ``[DONE]``."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write(b"")  # the headers go out now, before the first token
        writer = ChunkWriter(request, self._head(chat)[1], chat, max_tokens, self._word_json, fault)
        try:
            await self._serve(arrival, ids, cached, max_tokens, writer, usage)
        except ConnectionError:
            return response  # the client went away
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


@asynccontextmanager
async def run_emulator(host: str = "127.0.0.1", port: int = 0, settings: Optional[EmulatorSettings] = None,
                       **fields: Any) -> AsyncIterator[str]:
    """Run an emulator in the current event loop for the duration of the block; yields its base URL.

    It runs with `settings`, else with keyword arguments that are `EmulatorSettings` fields, e.g.
    ``run_emulator(ttft=0.05, itl=0.01)``.
    """
    emulator = Emulator(settings if settings is not None else EmulatorSettings(**fields))
    url = await emulator.start(host, port)
    try:
        yield url
    finally:
        await emulator.stop()
