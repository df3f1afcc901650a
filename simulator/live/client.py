"""The HTTP client of live runs: sends one call to an OpenAI-compatible server (vLLM above all), streaming,
and turns what happened into a `CallRecord`.

Times are taken on `time.perf_counter` and reported in seconds since the run's start `t0`. The actual
send time is taken when aiohttp writes the request body (the buffered headers go out in the same write;
aiohttp's ``on_request_chunk_sent`` signal fires just before it), after connection setup and any wait of
the client's own, which therefore show as client lag, not as server time. TTFT runs from the actual send
to the first chunk that carries a token, whatever its text ('' included: see `_carries_token`; a chat
stream's opening chunk with only the assistant's role carries none); inter-token gaps are the times
between the later chunks with a choice. Token counts come from the final ``usage`` chunk (asked for with
``stream_options.include_usage``). Server and network faults never raise: they become records with
``ok=False``, an ``error_class`` and the server's own message when it gave one.

Calls go over one aiohttp session with one shared connector (keep-alive reuse, at most
``max_connections``). Stalls are caught by one watchdog for all calls in flight, not by aiohttp's
``sock_read`` timeout, which cancels and re-arms a loop timer on every chunk that arrives (a cost per
token): a call whose server has sent nothing for ``stall_timeout`` since the request went out or since
its last byte fails as ``stall``, found within a quarter of ``stall_timeout`` (at most a second) after.
Body bytes are taken in aiohttp's protocol callback as they arrive (see `_read_stream`), each chunk
split into events timed when it came in: by the kernel's receive stamp of the read that returned it
(`simulator.rx_stamps`; the event loop's reading order and a CPU taken by other processes then do not
add to a token's time), else when it was read. Events that came in one read share its time (the
stamp of its last packet): a client that reads late, with several tokens waiting, times them all at
the last one's arrival.
A plain token chunk after the first is counted without a JSON parse (only its time matters); the chunks
up to the first token's, the usage chunk and anything unusual are parsed with orjson, so malformed
events are still caught.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import hashlib
import json
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable, Literal, Optional

import aiohttp
import orjson
from aiohttp.http import RawResponseMessage

from ..behaviour import CallRequest
from ..metrics.records import CallRecord
from ..redact import Redactor, mask_url, url_secrets
from ..task_run import call_record
from ..workload import Call
from .eager_writes import eager_body_writes
from .prompts import ASSUMED_CALIBRATION, PromptBuilder, TextCalibration, calibrate_text
from ..rx_stamps import arrival, keep_stamping, last_arrival, stamped_socket
from .sse import SSEError, SSEParser

ERROR_BODY_LIMIT = 4096
PLAIN_HEADERS = ("x-agentload-fault",)
"""Headers whose values are no secret (the emulator's fault header); all others' values are masked."""
PREFLIGHT_PROMPT_TOKENS = 8
PREFLIGHT_TRIES = 3
"""Tries of the preflight's test call when it fails in a way that may pass (`TRANSIENT`, HTTP 429)."""
PREFLIGHT_WAIT = 0.5
PREFLIGHT_WAIT_MAX = 10.0
TRANSIENT = ("http_5xx", "reset", "stall", "malformed", "timeout")
_CHOICES = b'"choices":[{'
_USAGE = b'"usage"'
_loads = orjson.loads


@dataclass(frozen=True)
class Target:
    """Where and how to send calls (plain settings; the scenario loader builds it)."""

    base_url: str
    """e.g. ``http://127.0.0.1:8000``, with or without a trailing ``/v1``."""
    model: Optional[str] = None
    """None: ask ``GET /v1/models`` once and take the first."""
    api: Literal["completions", "chat"] = "completions"
    api_key: Optional[str] = field(default=None, repr=False)
    """Sent as ``Authorization: Bearer``; never logged or written."""
    headers: dict[str, str] = field(default_factory=dict)
    connect_timeout: float = 10.0
    stall_timeout: float = 60.0
    """Most seconds without a byte, before the first byte and mid-stream."""
    total_timeout: Optional[float] = None
    max_connections: int = 0
    """0: unlimited. A call waiting for a free connection shows that wait as client lag."""
    share_prefixes: bool = True
    """False: salt every call's prefix blocks so nothing is shared (a cache-hit control)."""
    vocab_size: int = 32000
    """Token ids of prompts are drawn from [10, vocab_size - 10)."""
    session_header: Optional[str] = None
    """A fleet's: the header in which each call sends its session's key (`CallRequest.session_key`);
    None: no such header."""
    session_user: bool = False
    """A fleet's: also send the session key as the request body's OpenAI ``user`` field."""
    session_sub_agents: Literal["parent", "own"] = "parent"
    """A fleet's: whose key a sub-agent's call carries (`CallRequest.session_key`)."""
    replica_header: Optional[str] = None
    """A fleet's: the response header that names the replica which served a call, recorded in its
    `CallRecord.replica`; None: not read (records without a replica)."""
    setup_url: Optional[str] = None
    """Where the model list and ``/tokenize`` are asked (a fleet's replica: a router may list no model by
    its name and have no /tokenize); None: `base_url`."""

    @property
    def root(self) -> str:
        """The base URL without a trailing slash or ``/v1``."""
        return _root(self.base_url)

    @property
    def setup_root(self) -> str:
        """The root of `setup_url` (`root` without one)."""
        return self.root if self.setup_url is None else _root(self.setup_url)

    def secrets(self) -> list[str]:
        """The values that must never be written or shown: the API key, the header values, the URLs'
        credentials (`simulator.redact`)."""
        headers = [value for name, value in self.headers.items() if name.lower() not in PLAIN_HEADERS]
        urls = [*url_secrets(self.base_url), *(url_secrets(self.setup_url) if self.setup_url else ())]
        return [v for v in (self.api_key, *headers, *urls) if v]


def _root(url: str) -> str:
    """`url` without a trailing slash or ``/v1``."""
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def session_header_value(key: str) -> str:
    """A session key as a header value: as it is when it is printable ASCII, else a digest of it (a
    header cannot carry every character a task id may hold)."""
    if key.isascii() and key.isprintable():
        return key
    return "sha1-" + hashlib.sha1(key.encode("utf-8", "surrogatepass")).hexdigest()


class PreflightError(Exception):
    """The target failed the check before a run (`Client.preflight`): unreachable, a wrong model, an
    authentication failure. Its message says which, with the server's own words."""


class _CallFailed(Exception):
    def __init__(self, error_class: str, message: str, status: Optional[int] = None,
                 retry_after: Optional[float] = None) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.message = message
        self.status = status
        self.retry_after = retry_after


def retry_after_seconds(value: Optional[str], now: Optional[float] = None) -> Optional[float]:
    """Seconds a ``Retry-After`` header asks a client to wait: delay-seconds or an HTTP date (RFC 9110);
    None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if seconds != seconds or seconds == float("inf"):  # NaN, inf
        return None
    return max(0.0, seconds)


def error_message(body: bytes) -> str:
    """The message of an error body in vLLM's shapes (``{"error": {"message": ...}}``,
    ``{"object": "error", "message": ...}``, ``{"error": "..."}``), else the body's text."""
    text = body[:ERROR_BODY_LIMIT].decode("utf-8", "replace").strip()
    try:
        data = json.loads(body)
    except ValueError:
        return text
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str) and error:
            return error
        if data.get("message"):
            return str(data["message"])
        if data.get("detail"):
            return str(data["detail"])
    return text


def _carries_token(choice: dict[str, Any]) -> bool:
    """Whether a stream chunk's choice carries a generated token, whatever its text: a token can
    detokenise to '' (a multi-byte character split across tokens, a special token left out of the text),
    and its chunk is still the token's arrival. On /v1/completions every choice with a ``text`` (even
    '') or ``token_ids`` does. On chat, a delta with ``content`` (or reasoning) does, even '', but for
    the opening chunk that only gives the assistant's ``role`` (vLLM's ``{"role": "assistant",
    "content": ""}``), sent before any token; tool calls do when present."""
    if choice.get("text") is not None or choice.get("token_ids"):
        return True
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return False
    if delta.get("tool_calls"):
        return True
    texts = [delta.get(key) for key in ("content", "reasoning_content", "reasoning")]
    if "role" in delta:  # the opening chunk: a token only if it brings text along
        return any(texts)
    return any(text is not None for text in texts)


class Client:
    """Sends calls to one `Target` over one aiohttp session and its shared connector; use as ``async with``."""

    def __init__(self, target: Target, t0: float, prompts: Optional[PromptBuilder] = None) -> None:
        self.target = target
        self.t0 = t0
        self.prompts = prompts or PromptBuilder(vocab_size=target.vocab_size, share_prefixes=target.share_prefixes)
        self.model: Optional[str] = target.model
        self.calibration: TextCalibration = ASSUMED_CALIBRATION
        self._session: Optional[aiohttp.ClientSession] = None
        self._setup_lock = asyncio.Lock()
        self._heads: dict[int, bytes] = {}
        """The JSON of a request body before its prompt, by output tokens (the model is fixed once set up)."""
        self._ready = False
        self._opened = 0
        self._loop_settings = contextlib.ExitStack()
        root = target.root
        self._url = root + ("/v1/chat/completions" if target.api == "chat" else "/v1/completions")
        self._headers = {"Content-Type": "application/json", **target.headers}
        if target.api_key:
            self._headers["Authorization"] = f"Bearer {target.api_key}"
        for name, value in self._headers.items():
            if any(c in name + value for c in "\r\n\0"):
                raise ValueError(f"header {name!r} holds a line break or NUL")
        if target.session_header is not None and any(c in target.session_header for c in "\r\n\0: "):
            raise ValueError(f"session key header {target.session_header!r} is no header name")
        self._redact = Redactor(target.secrets())
        self._stream_headers = {"Accept": "text/event-stream", **self._headers}
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=target.connect_timeout)
        self._in_flight: set[_Stream] = set()
        self._watchdog: Optional[asyncio.Task[None]] = None
        self._prepared: dict[tuple[str, int, int], bytes] = {}
        """Request bodies built ahead of their send (`prepare`), by (task id, call index, attempt)."""
        self.prepared_bytes = 0

    async def __aenter__(self) -> "Client":
        self._loop_settings.enter_context(eager_body_writes(asyncio.get_running_loop()))
        stamping = keep_stamping()
        if stamping is not None:
            self._loop_settings.callback(stamping.close)
        connector = aiohttp.TCPConnector(limit=self.target.max_connections, limit_per_host=0, ttl_dns_cache=None,
                                         socket_factory=stamped_socket)
        tracing = aiohttp.TraceConfig(trace_config_ctx_factory=SimpleNamespace)
        tracing.on_connection_create_end.append(self._on_connection_created)
        tracing.on_connection_reuseconn.append(_on_connection_reused)
        tracing.on_request_chunk_sent.append(_on_body_sent)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=self._timeout,
            auto_decompress=False,
            skip_auto_headers=("Accept-Encoding",),  # an SSE stream is read as it comes, never compressed
            trace_configs=[tracing],
        )
        self._watchdog = asyncio.create_task(self._watch_stalls(), name="agentload-stall-watchdog")
        try:
            await self.setup()
        except _CallFailed:
            pass  # the server may come up later; the first send tries again and records the failure
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        self._loop_settings.close()

    async def _watch_stalls(self) -> None:
        """Every quarter of ``stall_timeout`` (at most 1 s), end the calls that have heard nothing for that long."""
        limit = self.target.stall_timeout
        period = min(1.0, limit / 4)
        while True:
            await asyncio.sleep(period)
            since = time.perf_counter() - limit
            for state in [s for s in self._in_flight if s.heard is not None and s.heard < since]:
                state.stall(limit)

    async def _on_connection_created(self, session: Any, ctx: Any, params: Any) -> None:
        self._opened += 1

    @property
    def connections_opened(self) -> int:
        """Connections this client has opened so far (a pool that reuses them opens few)."""
        return self._opened

    async def warm(self, connections: int) -> int:
        """Open up to `connections` connections to the target before a run (a warm pool), so that the
        first calls of a burst find them open instead of each opening its own at its send time. Each
        connection carries one small request (``GET /v1/models``); all are held at once, so each gets
        its own connection, then read and released into the pool, kept alive. Capped by
        ``max_connections``; returns the connections opened. A failure is no error: a call then opens
        its connection itself, as without a warm pool."""
        assert self._session is not None, "use Client as 'async with'"
        limit = self.target.max_connections
        wanted = min(connections, limit) if limit else connections
        if wanted <= 0:
            return 0
        session, url, before = self._session, self.target.root + "/v1/models", self._opened
        held = await asyncio.gather(*(session.get(url, headers=self._headers) for _ in range(wanted)),
                                    return_exceptions=True)
        for resp in held:
            if isinstance(resp, BaseException):
                continue
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                await resp.read()
            resp.release()
        return self._opened - before

    def prepare(self, request: CallRequest) -> int:
        """Build `request`'s body now, ahead of its send time (`send` takes it from here instead of
        building it then); returns its size in bytes (0 when it was prepared already). Call after
        `setup` (nothing is prepared before it: the body names the model)."""
        key = (request.task_id, request.call_index, request.attempt)
        if key in self._prepared or not self._ready:
            return 0
        body = self._prepared[key] = self._body(request)
        self.prepared_bytes += len(body)
        return len(body)

    def drop_prepared(self, keep_bytes: int) -> None:
        """Forget the oldest prepared bodies until at most `keep_bytes` remain (a forgotten body is
        built at its send time)."""
        prepared = self._prepared
        while prepared and self.prepared_bytes > keep_bytes:
            self.prepared_bytes -= len(prepared.pop(next(iter(prepared))))

    def _take_body(self, request: CallRequest) -> bytes:
        body = self._prepared.pop((request.task_id, request.call_index, request.attempt), None)
        if body is None:
            return self._body(request)
        self.prepared_bytes -= len(body)
        return body

    async def setup(self) -> None:
        """Find the model (when not given) and, for chat, calibrate the prompt text; once."""
        if self._ready:
            return
        async with self._setup_lock:
            if self._ready:
                return
            if self.model is None:
                self.model = await self._first_model()
                self._heads.clear()
            if self.target.api == "chat":
                self.calibration = await calibrate_text(self._tokenize, self.model)
                self.prompts.calibration = self.calibration
            self._ready = True

    async def _first_model(self) -> str:
        return (await self._models())[0]

    async def _models(self) -> list[str]:
        """The ids ``GET /v1/models`` lists (at least one)."""
        assert self._session is not None
        try:
            async with asyncio.timeout(self.target.stall_timeout), \
                    self._session.get(self.target.setup_root + "/v1/models", headers=self._headers) as resp:
                body = await resp.read()
                if resp.status >= 400:
                    raise _CallFailed(f"http_{resp.status // 100}xx", f"HTTP {resp.status}: {error_message(body)}",
                                      resp.status)
                models = [str(entry["id"]) for entry in json.loads(body)["data"]]
                if not models:
                    raise IndexError("no model listed")
                return models
        except _CallFailed:
            raise
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise _CallFailed("malformed", f"GET /v1/models: unexpected answer ({exc})") from None
        except TimeoutError as exc:
            if isinstance(exc, aiohttp.ClientError):
                raise _CallFailed(*_classify(exc)) from None
            raise _CallFailed("stall", f"GET /v1/models: no answer within {self.target.stall_timeout:g} s") from None
        except aiohttp.ClientError as exc:
            raise _CallFailed(*_classify(exc)) from None

    async def preflight(self) -> dict[str, Any]:
        """Check the target before a run: ``GET /v1/models`` (the model asked for must be listed; without
        one, the first is taken) and one call of a few prompt tokens and one output token, sent as the
        run sends its calls. Raises `PreflightError` saying what failed (an unreachable server, an
        authentication failure, a wrong model, an error answer) in the server's own words; returns what
        was found: the model, the models listed, and the test call's TTFT and latency in seconds."""
        where, listing = mask_url(self.target.root), mask_url(self.target.setup_root)
        try:
            models = await self._models()
        except _CallFailed as exc:
            unlisted = exc.status in (404, 405) and self.model is not None  # a server without /v1/models
            if not unlisted:
                raise PreflightError(self._preflight_text(f"GET {listing}/v1/models", exc.error_class, exc.status,
                                                          exc.message)) from None
            models = []
        if self.model is not None and models and self.model not in models:
            listed = ", ".join(models[:10]) + (", ..." if len(models) > 10 else "")
            raise PreflightError(f"model {self.model!r} is not served by {listing}; it serves: {listed} "
                                 "(set target.model to one of them, or leave it out to take the first)")
        if self.model is None:
            self.model = models[0]
            self._heads.clear()
        try:
            await self.setup()
        except _CallFailed as exc:
            raise PreflightError(self._preflight_text(f"{where}: setup", exc.error_class, exc.status,
                                                      exc.message)) from None
        # on chat, a few tokens of text past the template's own, so that the message is not empty (a
        # router such as sglang-router refuses an empty one)
        prompt = PREFLIGHT_PROMPT_TOKENS + (self.calibration.overhead_tokens if self.target.api == "chat" else 0)
        for attempt in range(PREFLIGHT_TRIES):
            test = CallRequest("preflight", "preflight", 0, Call(input_tokens=prompt, output_tokens=1), attempt)
            record, _ = await self.send(test, 0.0)
            if record.ok:
                return {"model": self.model, "models": models[:20], "ttft_s": record.ttft, "latency_s": record.latency,
                        "tries": attempt + 1}
            transient = record.error_class in TRANSIENT or record.status == 429
            if not transient or attempt + 1 == PREFLIGHT_TRIES:
                raise PreflightError(self._preflight_text(
                    f"a one-token test call to {where}" + (f" (tried {attempt + 1} times)" if attempt else ""),
                    record.error_class or "error", record.status, record.error_message or ""))
            # a transient failure (a 5xx, a reset) must not stop a run: try again after a short wait
            await asyncio.sleep(min(PREFLIGHT_WAIT_MAX, max(PREFLIGHT_WAIT, record.retry_after or 0.0)))
        raise AssertionError("unreachable")

    def _preflight_text(self, what: str, error_class: str, status: Optional[int], message: str) -> str:
        hint = {401: "authentication failed: check the API key (target.api_key_env) or the headers",
                403: "access refused: check the API key (target.api_key_env) or the headers",
                404: "not found: check target.base_url and target.model"}.get(status or 0)
        if error_class == "connect":
            hint = "the server is unreachable: is it running, and is target.base_url right?"
        text = f"{what} failed ({error_class}): {self._redact(message)}"
        return f"{text}; {hint}" if hint else text

    async def _tokenize(self, body: dict[str, Any]) -> Optional[dict[str, Any]]:
        assert self._session is not None
        try:
            async with self._session.post(self.target.setup_root + "/tokenize", json=body, headers=self._headers) as resp:
                if resp.status != 200:
                    return None
                data = await resp.json(content_type=None)
                return data if isinstance(data, dict) else None
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return None

    def _body(self, request: CallRequest) -> bytes:
        out = request.call.output_tokens
        head = self._heads.get(out)
        if head is None:
            fields = {
                "model": self.model,
                "max_tokens": out,
                "min_tokens": out,
                "ignore_eos": True,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            head = orjson.dumps(fields)[:-1]
            if len(self._heads) < 4096:
                self._heads[out] = head
        if self.target.session_user:
            head += b',"user":' + orjson.dumps(request.session_key(self.target.session_sub_agents))
        if self.target.api == "chat":
            return head + b',"messages":' + orjson.dumps(self.prompts.messages(request)) + b"}"
        return head + b',"prompt":' + self.prompts.token_ids_json(request) + b"}"

    async def send(self, request: CallRequest, intended_send: float) -> tuple[CallRecord, list[float]]:
        """Send one call, streaming; return its record and its inter-token gaps in seconds.

        Never raises for server or network faults: they become records with ``ok=False``."""
        assert self._session is not None, "use Client as 'async with'"
        state = _Stream()
        started = time.perf_counter()
        state.task = asyncio.current_task()
        self._in_flight.add(state)
        try:
            if not self._ready:
                await self.setup()
            body = self._take_body(request)
            headers = self._stream_headers
            if self.target.session_header is not None:
                key = request.session_key(self.target.session_sub_agents)
                headers = {**headers, self.target.session_header: session_header_value(key)}
            started = time.perf_counter()
            if self.target.total_timeout is not None:
                async with asyncio.timeout(self.target.total_timeout):
                    await self._exchange(body, state, headers)
            else:
                await self._exchange(body, state, headers)
        except _CallFailed as exc:
            state.fail(exc.error_class, exc.message, exc.status)
            state.retry_after = exc.retry_after
        except TimeoutError as exc:
            if isinstance(exc, aiohttp.ClientError):  # aiohttp's own timeouts (connect, sock_read)
                state.fail(*_classify(exc))
            else:
                state.fail("timeout", f"no complete response within total_timeout={self.target.total_timeout}s")
        except aiohttp.ClientError as exc:
            state.fail(*_classify(exc))
        except OSError as exc:
            state.fail("connect" if state.status is None else "reset", f"{type(exc).__name__}: {exc}")
        except asyncio.CancelledError:
            if not state.stalled:
                raise
            assert state.task is not None
            state.task.uncancel()
            if state.done is None:  # else only reading the rest after 'data: [DONE]' stalled: answered in full
                state.fail("stall", f"Timeout: nothing from the server for {self.target.stall_timeout:g} s")
        finally:
            self._in_flight.discard(state)
            state.task = None
        ok = state.error_class is None
        end = state.done if state.done is not None and ok else time.perf_counter()
        actual = state.sent if state.sent is not None else started
        return self._record(request, intended_send, actual, end, state, state.gaps), state.gaps

    async def _exchange(self, body: bytes, state: "_Stream", headers: dict[str, str]) -> None:
        assert self._session is not None
        session = self._session
        while True:
            try:
                resp = await session.post(self._url, data=body, headers=headers, trace_request_ctx=state)
                break
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                # A kept-alive connection the server closed while idle (uvicorn does after 5 s) fails
                # before any answer: the server never saw the call, so it goes again. The pool may hand
                # out another connection of the same burst, closed at the same instant: each such one
                # is dropped as it fails, so this ends on a new connection at the latest. aiohttp
                # retries such a failure itself only for idempotent methods, never for a POST.
                if not state.reused or isinstance(getattr(exc, "message", None), RawResponseMessage):
                    raise
                state.reused = False
                state.sent = None
        async with resp:
            state.status = status = resp.status
            if self.target.replica_header is not None:
                state.replica = resp.headers.get(self.target.replica_header)
            if status >= 400:
                error = bytearray()
                while len(error) < ERROR_BODY_LIMIT and (data := await resp.content.readany()):
                    error += data
                kind = "http_4xx" if status < 500 else "http_5xx"
                raise _CallFailed(kind, f"HTTP {status}: {error_message(bytes(error))}", status,
                                  retry_after_seconds(resp.headers.get("Retry-After")))
            try:
                await _read_stream(resp.content, state, resp.connection)
            except _CallFailed:
                resp.close()  # drop the connection: the rest of this stream must not be read as the next
                raise

    def _record(
        self, request: CallRequest, intended: float, actual: float, end: float, state: "_Stream", gaps: list[float]
    ) -> CallRecord:
        t0 = self.t0
        call = request.call
        usage = state.usage or {}
        details = usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        ok = state.error_class is None
        return call_record(
            request, intended, actual - t0, end - t0,
            ok=ok,
            ttft=None if state.first is None else state.first - actual,
            itl_count=len(gaps),
            itl_mean=sum(gaps) / len(gaps) if gaps else None,
            itl_max=max(gaps) if gaps else None,
            input_tokens=int(usage.get("prompt_tokens", call.input_tokens if ok else 0)),
            output_tokens=int(usage.get("completion_tokens", state.chunks)),
            cached_tokens=None if cached is None else int(cached),
            status=state.status,
            error_class=state.error_class,
            error_message=self._redact(state.error_message),
            retry_after=state.retry_after,
            replica=state.replica,
        )


async def _on_connection_reused(session: Any, ctx: Any, params: Any) -> None:
    state = ctx.trace_request_ctx
    if state is not None:
        state.reused = True


async def _on_body_sent(session: Any, ctx: Any, params: Any) -> None:
    # Fires just before the body's first write (which carries the buffered headers too): the actual send.
    state = ctx.trace_request_ctx
    if state is not None and state.sent is None:
        state.sent = state.heard = time.perf_counter()


class _Delivering(aiohttp.StreamReader):
    """A response body reader that hands each chunk of body bytes to its call's sink the moment the
    connection's protocol delivers it, instead of buffering it for a reader task (see `_read_stream`)."""

    __slots__ = ()

    def feed_data(self, data: bytes, size: int = 0) -> bool:
        sink = _SINKS.get(self)
        if sink is None:  # no longer watched: buffer as aiohttp does
            return super().feed_data(data, size)
        if data:
            sink(data)
        return False


_SINKS: dict[aiohttp.StreamReader, Callable[[bytes], None]] = {}
"""The sink of every response body being delivered, by its reader."""


async def _read_stream(content: aiohttp.StreamReader, state: "_Stream", connection: Any = None) -> None:
    """Read a response's event stream to its end; the call's end is when 'data: [DONE]' arrived.

    aiohttp's protocol feeds body bytes to the response's reader in its `data_received`; a task that
    awaits `readany` wakes a loop turn later, once per chunk: a future, a task step and a read per
    token, most of the client's cost per token, and a wake-up delay (behind everything queued on the
    loop) inside every token's time. So the reader is switched to `_Delivering`, which passes each
    chunk to this call's `_Stream` at once, timed as it arrives, and the task only waits for the end
    of the body (the connection's end of the response, which lets it be kept alive), or for the error
    that ends it: aiohttp's, or a malformed stream's, raised through the reader."""
    perf = time.perf_counter
    feed = state.feed

    def arrived(data: bytes, stamp: Optional[float]) -> None:
        now = state.heard = perf() if stamp is None else stamp
        if state.done is not None:
            return  # the rest after 'data: [DONE]' is only read to the end of the response
        try:
            feed(data, now)
        except _CallFailed as exc:
            del _SINKS[content]
            content.set_exception(exc)

    def delivered(data: bytes) -> None:
        arrived(data, arrival.time)  # called inside the connection's read: its kernel stamp is the bytes'

    buffered = content.read_nowait()  # what came with the headers, before the switch: the last read's
    content.__class__ = _Delivering
    _SINKS[content] = delivered
    try:
        if buffered:
            arrived(buffered, None if connection is None else last_arrival(connection.transport))
        failed = content.exception()
        if failed is not None:
            raise failed
        await content.wait_eof()
    except (aiohttp.ClientError, asyncio.TimeoutError):
        if state.done is None:
            raise  # else a failure after the answer costs only the connection
    finally:
        _SINKS.pop(content, None)
    if state.done is None:
        state.close(perf())


class _Stream:
    """One response as it arrives: status, token times, usage, or what failed."""

    __slots__ = (
        "sent", "reused", "status", "first", "last", "done", "chunks", "usage", "error_class", "error_message",
        "gaps", "parser", "heard", "task", "stalled", "retry_after", "replica",
    )

    def __init__(self) -> None:
        self.sent: Optional[float] = None
        self.reused = False
        """Whether the request went out on a kept-alive connection (set by the tracing hook)."""
        self.status: Optional[int] = None
        self.first: Optional[float] = None
        self.last = 0.0
        self.done: Optional[float] = None
        """When 'data: [DONE]' arrived: the call's end (reading the rest of the response is not its time)."""
        self.chunks = 0
        self.usage: Optional[dict[str, Any]] = None
        self.error_class: Optional[str] = None
        self.error_message: Optional[str] = None
        self.gaps: list[float] = []
        self.parser = SSEParser()
        self.heard: Optional[float] = None
        """When the request went out or the last bytes came in; None before the send (not watched yet)."""
        self.task: Optional[asyncio.Task[Any]] = None
        self.stalled = False
        self.retry_after: Optional[float] = None
        """Seconds the server's ``Retry-After`` asked for (on an HTTP error)."""
        self.replica: Optional[str] = None
        """The fleet replica that answered, by the target's `replica_header` (None: not read or not said)."""

    def stall(self, limit: float) -> None:
        """The server said nothing for `limit` seconds: interrupt the call's task (it records a stall)."""
        if not self.stalled and self.task is not None:
            self.stalled = True
            self.task.cancel(f"stall: nothing for {limit:g} s")

    def feed(self, data: bytes, now: float) -> None:
        """Body bytes read at `now`: split into events; a token's time is when its bytes were read."""
        if (
            self.first is not None
            and data[:7] == b"data: {"
            and data[-3:] == b"}\n\n"
            and data.count(b"\n") == 2
            and b"\r" not in data
            and _CHOICES in data
            and _USAGE not in data
            and not self.parser.pending
        ):  # the usual read: one more plain token event, nothing buffered before it
            self.gaps.append(now - self.last)
            self.last = now
            self.chunks += 1
            return
        try:
            events = self.parser.feed(data)
        except SSEError as exc:
            raise _CallFailed("malformed", str(exc)) from None
        self._events(events, now)

    def close(self, now: float) -> None:
        """The response ended (before 'data: [DONE]')."""
        try:
            events = self.parser.close()
        except SSEError as exc:
            raise _CallFailed("malformed", str(exc)) from None
        self._events(events, now)
        if self.done is None:
            raise _CallFailed("reset", "stream ended before 'data: [DONE]'")

    def _events(self, events: list[bytes], now: float) -> None:
        gaps = self.gaps
        for event in events:
            # After the first token, a well-formed chunk with choices and no usage is one more token:
            # no need to parse it. Anything else (and anything not shaped like a JSON object) is parsed.
            if self.first is not None and event[:1] == b"{" and event[-1:] == b"}" and _CHOICES in event and _USAGE not in event:
                gaps.append(now - self.last)
                self.last = now
                self.chunks += 1
                continue
            if event == b"[DONE]":
                self.done = now
                return
            try:
                self.take(_loads(event), now)
            except (ValueError, TypeError, AttributeError, KeyError) as exc:
                raise _CallFailed("malformed", f"bad stream event {event[:120]!r}: {exc}") from None

    def take(self, payload: dict[str, Any], now: float) -> None:
        """Account one parsed stream event that arrived at `now`."""
        if "error" in payload and not payload.get("choices"):
            error = payload["error"]
            message = error.get("message", str(error)) if isinstance(error, dict) else str(error)
            code = error.get("code") if isinstance(error, dict) else None
            kind = "http_4xx" if isinstance(code, int) and 400 <= code < 500 else "http_5xx"
            raise _CallFailed(kind, f"error in stream: {message}")
        usage = payload.get("usage")
        if usage:
            self.usage = usage
        choices = payload.get("choices")
        if not choices:
            return
        # After the first token, every chunk with a choice is one more (or several, merged) token.
        if self.first is None:
            if not _carries_token(choices[0]):
                return
            self.first = now
        else:
            self.gaps.append(now - self.last)
        self.last = now
        self.chunks += 1

    def fail(self, error_class: str, message: str, status: Optional[int] = None) -> None:
        self.error_class = error_class
        self.error_message = message
        if status is not None:
            self.status = status


def _classify(exc: BaseException) -> tuple[str, str]:
    """(error class, message) for an aiohttp or OS exception."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return "connect", text
    if isinstance(exc, aiohttp.ServerTimeoutError):
        return "stall", text
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "connect", text
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError)):
        return "reset", text
    if isinstance(exc, aiohttp.ClientResponseError):
        return f"http_{exc.status // 100}xx" if exc.status >= 400 else "malformed", text
    if isinstance(exc, aiohttp.ClientError):
        return "reset", text
    return "timeout", text
