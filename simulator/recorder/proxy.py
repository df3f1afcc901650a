"""The recording proxy: an OpenAI-compatible pass-through in front of a server, writing what flows through
it as a replayable recording (`simulator.recorder.journal`).

Every request goes to the upstream unchanged and its response comes back unchanged, streamed chunk by
chunk, errors included (counted). Completions and chat completions (``/v1/completions``,
``/v1/chat/completions``) are also recorded: the arrival and end times, the first token, token counts
from the response's ``usage`` (for a stream that does not ask for it, the recorder asks, with
``stream_options.include_usage``, and takes the usage event out of what the client gets), cached prompt
tokens when the server reports them, the stop reason, and block ids of the prompt's token ids
(`simulator.recorder.block_hash`: from the request's own ids, the upstream's ``/tokenize`` or a local
tokenizer). Which task a call belongs to comes from `simulator.recorder.grouping`: by the call's session
key (`simulator.recorder.keys`) or inferred from its prompt and timing. The tokenizing is done while the
upstream works on the call; nothing of it delays the response.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence
from urllib.parse import unquote, urlsplit, urlunsplit

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict

from ..redact import mask_url
from .block_hash import DEFAULT_BLOCK_SIZE, SCHEME, block_ids
from .grouping import DEFAULT_IDLE_TIMEOUT, Placement, TaskGrouper
from .journal import Journal
from .keys import KeySource
from .prompt_tokens import CREDENTIAL_HEADERS, LocalTokenizer, TokenizeError, UpstreamTokenizer, ids_in_request
from .stream_tap import StreamTap

RECORDED = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}
"""Paths whose calls are recorded, and their API."""
_HOP = frozenset(("connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                  "transfer-encoding", "upgrade", "host", "content-length"))
"""Headers of one hop (RFC 9110 7.6.1), not passed on; content-length is set again for what is sent."""


@dataclass
class RecordSettings:
    """What `agentload record` was told."""

    upstream: str
    out: Path
    host: str = "127.0.0.1"
    port: int = 8100
    block_size: int = DEFAULT_BLOCK_SIZE
    tokenizer: str = "upstream"
    """``upstream`` (its /tokenize), ``none`` (no ids for prompts given as text), or a model folder."""
    keys: KeySource = field(default_factory=KeySource)
    rotate_bytes: Optional[int] = None
    rotate_seconds: Optional[float] = None
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    """Seconds after which a task with no call is forgotten (a later call starts a new one)."""
    connect_timeout: float = 10.0


@dataclass
class Tally:
    """What the recorder has seen so far (printed by the command; never holds a secret)."""

    recorded: int = 0
    failed: int = 0
    passed: int = 0
    """Requests on other paths, passed through only."""
    statuses: Counter = field(default_factory=Counter)
    """Upstream statuses of failed calls and passed requests that were not 2xx."""
    no_ids: Counter = field(default_factory=Counter)
    """Calls recorded without hash ids, by reason."""
    no_usage: int = 0
    evidence: Counter = field(default_factory=Counter)
    """How the recorded calls were placed in tasks (`Placement.evidence`)."""
    unrecorded: Counter = field(default_factory=Counter)
    """Calls passed on but not recorded because the recorder failed on them, by error kind."""

    def as_dict(self) -> dict[str, Any]:
        return {"recorded": self.recorded, "failed": self.failed, "passed": self.passed,
                "statuses": dict(self.statuses), "no_ids": dict(self.no_ids), "no_usage": self.no_usage,
                "placed_by": dict(self.evidence), "unrecorded": dict(self.unrecorded)}


class Recorder:
    """The proxy: `start` it, send traffic to `url`, `stop` it (the recording is then closed)."""

    def __init__(self, settings: RecordSettings) -> None:
        self.settings = settings
        self.upstream, self._auth = _without_credentials(settings.upstream)
        self.tally = Tally()
        self.grouper = TaskGrouper(idle_timeout=settings.idle_timeout)
        self._t0 = time.perf_counter()
        self._session: Optional[aiohttp.ClientSession] = None
        self._runner: Optional[web.AppRunner] = None
        self._tokenizer: Any = None
        self.journal: Optional[Journal] = None
        self.url = ""
        self._pending: set[asyncio.Future] = set()

    def header(self) -> dict[str, Any]:
        """The recording's header line (the upstream with its credentials masked; key names, no values)."""
        return {"hash": SCHEME, "block_size": self.settings.block_size,
                "started_unix": round(time.time() - (time.perf_counter() - self._t0), 3),
                "upstream": mask_url(self.settings.upstream), "keys": self.settings.keys.describe(),
                "tokenizer": "upstream" if self.settings.tokenizer in ("upstream", "none") else "local"}

    async def start(self) -> str:
        """Open the recording, connect to the upstream, listen; returns the URL to send traffic to."""
        s = self.settings
        if s.tokenizer not in ("upstream", "none"):
            self._tokenizer = LocalTokenizer(s.tokenizer)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=s.connect_timeout)
        # auto_decompress off: bodies pass through as the upstream sent them.
        self._session = aiohttp.ClientSession(timeout=timeout, auto_decompress=False,
                                              connector=aiohttp.TCPConnector(limit=0))
        if s.tokenizer == "upstream":
            self._tokenizer = UpstreamTokenizer(self._session, self.upstream, self._auth)
        self.journal = Journal(s.out, self.header(), s.rotate_bytes, s.rotate_seconds)
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, s.host, s.port)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://{s.host}:{port}"
        return self.url

    async def stop(self) -> None:
        """Stop listening (calls in flight finish first) and close the recording."""
        if self._runner is not None:
            await self._runner.cleanup()
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        if self.journal is not None:
            self.grouper.close()
            self.write_revisions()
        if self._session is not None:
            await self._session.close()
        if self.journal is not None:
            self.journal.close()

    def write_revisions(self) -> None:
        """Write the grouper's corrected sub-task placements (a timing guess its parent's next call
        disproved) for the reader to apply."""
        for placement in self.grouper.revisions():
            self.journal.revision(placement.task, placement.parent, placement.after_call)

    def now(self) -> float:
        """Seconds since the recording started."""
        return time.perf_counter() - self._t0

    def later(self, work: Any) -> None:
        """Run coroutine `work` soon, kept until it is done (`stop` waits for it)."""
        task = asyncio.ensure_future(self._guarded(work))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _guarded(self, work: Any) -> None:
        try:
            await work
        except Exception as exc:  # noqa: BLE001 - a call that cannot be recorded is counted, traffic goes on
            self.broken(exc)

    def broken(self, exc: BaseException) -> None:
        """A call the recorder failed to record (its own fault, not the call's): counted, said once per kind."""
        kind = type(exc).__name__
        if kind not in self.tally.unrecorded:
            print(f"agentload record: a call could not be recorded ({kind}); it was passed on unrecorded",
                  file=sys.stderr, flush=True)
        self.tally.unrecorded[kind] += 1

    # ---- passing requests on --------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        t = self.now()
        body = await request.read()
        api = RECORDED.get(request.path) if request.method == "POST" else None
        parsed: Optional[dict[str, Any]] = None
        strip_usage = False
        if api is not None:
            try:
                value = orjson.loads(body)
                parsed = value if isinstance(value, dict) else None
            except orjson.JSONDecodeError:
                parsed = None  # the upstream answers it; nothing to record
            if parsed is not None and parsed.get("stream"):
                options = parsed.get("stream_options")
                if not (isinstance(options, dict) and options.get("include_usage")):
                    opts = dict(options) if isinstance(options, dict) else {}
                    opts["include_usage"] = True
                    body = orjson.dumps({**parsed, "stream_options": opts})
                    strip_usage = True
        call = None
        if parsed is not None:
            try:
                call = _Call(self, t, api, parsed, request.headers)
            except Exception as exc:  # noqa: BLE001 - recording must never stop traffic: pass it on unrecorded
                self.broken(exc)
        headers = _forwarded(request.headers, recorded=api is not None)
        try:
            auth = self._auth if "authorization" not in headers else None
            upstream = await self._session.request(request.method, self.upstream + request.path_qs, auth=auth,
                                                   headers=headers, data=body, allow_redirects=False)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            if call is not None:
                self.later(call.failed(f"upstream unreachable: {type(exc).__name__}", 502))
            else:
                self.tally.passed += 1
                self.tally.statuses[502] += 1
            return web.json_response({"error": {"message": f"agentload record: the upstream "
                                                f"{mask_url(self.settings.upstream)} is unreachable "
                                                f"({type(exc).__name__})", "type": "BadGateway", "code": 502}},
                                     status=502)
        try:
            return await self._respond(request, upstream, call, strip_usage)
        finally:
            upstream.release()

    async def _respond(self, request: web.Request, upstream: aiohttp.ClientResponse, call: Optional[_Call],
                       strip_usage: bool) -> web.StreamResponse:
        status = upstream.status
        headers = CIMultiDict((k, v) for k, v in upstream.headers.items() if k.lower() not in _HOP)
        streaming = "text/event-stream" in upstream.headers.get("content-type", "")
        if call is None:
            self.tally.passed += 1
            if status >= 300:
                self.tally.statuses[status] += 1
            if streaming or "content-length" not in upstream.headers:
                return await self._relay(request, upstream, headers, None)
        if call is None or status != 200 or not streaming:
            raw = await upstream.read()
            if call is not None and status != 200:
                self.later(call.failed(f"http_{status}", status))
            elif call is not None:
                call.whole(raw)
            return web.Response(status=status, headers=headers, body=raw)
        tap = StreamTap(strip_usage)
        try:
            response = await self._relay(request, upstream, headers, tap, call)
        except (ConnectionResetError, aiohttp.ClientConnectionError, asyncio.CancelledError) as exc:
            self.later(call.failed(f"stream broken: {type(exc).__name__}", 499))
            raise
        call.streamed(tap)
        return response

    async def _relay(self, request: web.Request, upstream: aiohttp.ClientResponse, headers: CIMultiDict,
                     tap: Optional[StreamTap], call: Optional[_Call] = None) -> web.StreamResponse:
        """Pass the upstream's answer on chunk by chunk as it comes, through `tap` when it is recorded."""
        response = web.StreamResponse(status=upstream.status, headers=headers)
        await response.prepare(request)
        async for chunk in upstream.content.iter_any():
            if tap is not None:
                chunk, first = tap.feed(chunk)
                if first:
                    call.first_token = self.now()
            if chunk:
                await response.write(chunk)
        rest = tap.close() if tap is not None else b""
        if rest:
            await response.write(rest)
        await response.write_eof()
        return response


class _Call:
    """One recorded call on its way: placed in a task once its prompt ids are known, written when it ends."""

    def __init__(self, rec: Recorder, t: float, api: str, body: dict[str, Any], headers: Any) -> None:
        self.rec = rec
        self.t = t
        self.api = api
        self.model = body.get("model") if isinstance(body.get("model"), str) else None
        self.first_token: Optional[float] = None
        key = rec.settings.keys.key(headers, body)
        if rec._tokenizer is not None and not _may_hold_ids(api, body):
            credentials = {k: v for k, v in headers.items() if k.lower() in CREDENTIAL_HEADERS}
            self.placed: asyncio.Future = asyncio.ensure_future(self._tokenized(key, body, credentials))
        else:
            # Hashed and placed on the loop's next turn: the request is on its way upstream by then (its
            # bytes are written before the handler first waits), and calls are still placed in arrival order.
            self.placed = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_soon(self._place_now, key, body)

    def _place(self, key: Optional[str], tokens: Optional[Sequence[int]], why: Optional[str]) -> Placement:
        self.ids: Sequence[int] = block_ids(tokens, self.rec.settings.block_size) if tokens is not None else ()
        if why is not None:
            self.rec.tally.no_ids[why] += 1
        placement = self.rec.grouper.place(self.t, key, self.ids)
        self.rec.tally.evidence[placement.evidence] += 1
        self.rec.write_revisions()
        return placement

    def _place_now(self, key: Optional[str], body: dict[str, Any]) -> None:
        try:
            tokens = ids_in_request(self.api, body)
            why = None if tokens is not None else ("no tokenizer" if self.rec._tokenizer is None
                                                   else "the prompt is no list of token ids")
            self.placed.set_result(self._place(key, tokens, why))
        except Exception as exc:  # noqa: BLE001 - counted where the placement is awaited
            self.placed.set_exception(exc)

    async def _tokenized(self, key: Optional[str], body: dict[str, Any], credentials: dict[str, str]) -> Placement:
        try:
            tokens = await self.rec._tokenizer.ids(self.api, body, credentials)
            return self._place(key, tokens, None)
        except TokenizeError as exc:
            return self._place(key, None, str(exc))

    async def _placement(self) -> Placement:
        return await self.placed

    async def failed(self, error: str, status: int) -> None:
        placement = await self._placement()
        end = self.rec.now()
        self.rec.grouper.failed(placement.task, placement.index, end)
        self.rec.tally.failed += 1
        self.rec.tally.statuses[status] += 1
        self._write(placement, end, {"status": status, "error": error})

    def whole(self, raw: bytes) -> None:
        """A whole (not streamed) answer."""
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            value = None
        usage = value.get("usage") if isinstance(value, dict) else None
        stop = None
        if isinstance(value, dict) and isinstance(value.get("choices"), list) and value["choices"]:
            first = value["choices"][0]
            stop = first.get("finish_reason") if isinstance(first, dict) else None
        self.rec.later(self._finish(self.rec.now(), usage if isinstance(usage, dict) else None,
                                    stop if isinstance(stop, str) else None))

    def streamed(self, tap: StreamTap) -> None:
        """A streamed answer, passed on whole."""
        self.rec.later(self._finish(self.rec.now(), tap.usage, tap.finish_reason))

    async def _finish(self, end: float, usage: Optional[dict[str, Any]], stop: Optional[str]) -> None:
        placement = await self._placement()
        fields: dict[str, Any] = {}
        if usage is not None:
            fields["input_tokens"] = _count(usage.get("prompt_tokens"))
            fields["output_tokens"] = _count(usage.get("completion_tokens"))
            details = usage.get("prompt_tokens_details")
            cached = details.get("cached_tokens") if isinstance(details, dict) else None
            if isinstance(cached, int) and not isinstance(cached, bool) and cached >= 0:
                fields["cached_tokens"] = cached
        else:
            self.rec.tally.no_usage += 1
        output = fields.get("output_tokens", 0)
        self.rec.grouper.end(placement.task, placement.index, end, output)
        self.rec.tally.recorded += 1
        if self.first_token is not None:
            fields["ttft"] = round(self.first_token - self.t, 6)
        if stop is not None:
            fields["stop_reason"] = stop
        self._write(placement, end, fields)

    def _write(self, placement: Placement, end: float, fields: dict[str, Any]) -> None:
        line: dict[str, Any] = {"task": placement.task, "i": placement.index}
        if placement.parent is not None:
            line["parent"] = placement.parent
            line["after_call"] = placement.after_call
        line["t"] = round(self.t, 6)
        line["end"] = round(end, 6)
        line.update(fields)
        if self.model is not None:
            line["model"] = self.model
        line["api"] = self.api
        ids = self.ids if "status" not in fields else ()
        self.rec.journal.call(line, ids)


def _without_credentials(url: str) -> tuple[str, Optional[aiohttp.BasicAuth]]:
    """The upstream's root (no trailing ``/`` or ``/v1``, no user:password) and the basic auth its
    user:password give (sent when the client sends no Authorization of its own)."""
    parts = urlsplit(url)
    auth = None
    if parts.username is not None:
        auth = aiohttp.BasicAuth(unquote(parts.username), unquote(parts.password or ""))
    root = urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", "")).rstrip("/")
    return (root[:-3] if root.endswith("/v1") else root), auth


def _may_hold_ids(api: str, body: dict[str, Any]) -> bool:
    """Whether the request looks like it carries its prompt's token ids (a completions prompt that is a
    list starting with an int): then they are read from it, not asked of a tokenizer."""
    prompt = body.get("prompt") if api == "completions" else None
    return isinstance(prompt, list) and bool(prompt) and type(prompt[0]) is int


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _forwarded(headers: Any, recorded: bool) -> CIMultiDict:
    """The request headers passed on: all but those of one hop; a recorded call's without
    Accept-Encoding, so that its answer comes readable (the recorder reads its usage)."""
    out: CIMultiDict = CIMultiDict()
    for name, value in headers.items():
        low = name.lower()
        if low in _HOP or (recorded and low == "accept-encoding"):
            continue
        out.add(name, value)
    return out
