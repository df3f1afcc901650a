"""A lean HTTP/1.1 client for the streaming calls of a live run.

Keep-alive connections to one origin sit in a pool; a response body goes to a consumer straight from
the protocol's ``data_received`` callback, with the time it was read. No task switch and no stream
reader per chunk: on a stream of one token per chunk that is most of what a general-purpose client
spends per token. Only what OpenAI-compatible servers need is here: chunked, Content-Length or
until-close bodies, no compression (none is asked for), no redirects, no proxies; ``https`` works.
"""

from __future__ import annotations

import asyncio
import ssl as _ssl
import time
from collections import deque
from typing import Optional, Protocol
from urllib.parse import urlsplit

MAX_HEAD = 65536


class HTTPError(Exception):
    """A transport-level failure: `kind` is 'connect', 'reset', 'stall' or 'malformed'."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class Consumer(Protocol):
    """Takes one response: its head, then its body as it arrives, then its end."""

    def head(self, status: int, headers: dict[str, str]) -> None: ...

    def feed(self, data: bytes, now: float) -> None:
        """Body bytes read at `now` (perf_counter). Raising stops the response and drops the connection."""
        ...

    def close(self, now: float) -> None:
        """The body is complete. Raising fails the call (the connection is still reusable)."""
        ...


_HEAD, _CHUNKED, _LENGTH, _UNTIL_CLOSE, _IDLE, _BROKEN = range(6)
# Sub-states of a chunked body, in `_left` when not counting chunk data bytes.
_SIZE_LINE, _DATA_CRLF, _TRAILERS = -1, -2, -3


class _Connection(asyncio.Protocol):
    """One keep-alive connection: a request goes out, its response comes back through a `Consumer`."""

    def __init__(self, pool: "ConnectionPool") -> None:
        self._pool = pool
        self.transport: Optional[asyncio.Transport] = None
        self._state = _IDLE
        self._buf = b""
        self._left = 0
        self._consumer: Optional[Consumer] = None
        self._done: Optional[asyncio.Future[None]] = None
        self._keep_alive = True
        self._stall = 0.0
        self._last = 0.0
        self._timer: Optional[asyncio.TimerHandle] = None
        self.served = 0
        """Responses completed on this connection."""

    # -- asyncio.Protocol --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        self._last = now
        if self._done is None or self._done.done():
            self._state = _BROKEN  # bytes nobody asked for: the connection is out of step
            self._close()
            return
        try:
            self._receive(data, now)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting call
            self._fail(exc)

    def eof_received(self) -> Optional[bool]:
        return False

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.transport = None
        self._pool._lost(self)
        if self._done is not None and not self._done.done():
            if self._state == _UNTIL_CLOSE:
                self._complete(time.perf_counter())
            else:
                reason = f": {exc}" if exc else ""
                self._fail(HTTPError("reset", f"ServerDisconnectedError: the server closed the connection{reason}"))
        self._state = _BROKEN

    # -- a request ---------------------------------------------------------------------------------

    @property
    def usable(self) -> bool:
        return self._state == _IDLE and self.transport is not None and not self.transport.is_closing()

    def request(self, data: bytes, consumer: Consumer, stall: float) -> "asyncio.Future[None]":
        """Write a whole request; the future ends when its response has (or with the failure)."""
        assert self.transport is not None and self._state == _IDLE
        loop = asyncio.get_running_loop()
        self._done = loop.create_future()
        self._consumer = consumer
        self._state = _HEAD
        self._buf = b""
        self._stall = stall
        self._last = time.perf_counter()
        self._timer = loop.call_later(stall, self._check_stall)
        self.transport.write(data)
        return self._done

    def abort(self) -> None:
        """Drop the connection (a call given up halfway)."""
        self._state = _BROKEN
        self._cancel_timer()
        if self.transport is not None:
            self.transport.abort()

    def _check_stall(self) -> None:
        idle = time.perf_counter() - self._last
        if idle >= self._stall:
            self._timer = None
            self._fail(HTTPError("stall", f"ServerTimeoutError: Timeout, no byte from the server for {self._stall:g} s"))
        else:
            self._timer = asyncio.get_running_loop().call_later(self._stall - idle, self._check_stall)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fail(self, exc: BaseException) -> None:
        self._cancel_timer()
        self._state = _BROKEN
        if self._done is not None and not self._done.done():
            self._done.set_exception(exc)
        self._close()

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _complete(self, now: float) -> None:
        self._cancel_timer()
        consumer, done = self._consumer, self._done
        self._consumer = None
        self.served += 1
        reusable = self._keep_alive and self._state != _UNTIL_CLOSE and not self._buf
        self._state = _IDLE if reusable else _BROKEN
        assert consumer is not None and done is not None
        try:
            consumer.close(now)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting call
            done.set_exception(exc)
        else:
            done.set_result(None)
        if reusable:
            self._pool._put(self)
        else:
            self._close()

    # -- parsing -----------------------------------------------------------------------------------

    def _receive(self, data: bytes, now: float) -> None:
        if self._state == _HEAD:
            buf = self._buf + data if self._buf else data
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD:
                    raise HTTPError("malformed", "response head longer than 64 KiB")
                self._buf = buf
                return
            self._buf = b""
            data = buf[end + 4 :]
            if not self._head(buf[:end]):
                if data:
                    self._receive(data, now)  # a 1xx answer: the real head follows
                return
        consumer = self._consumer
        if consumer is None:
            return  # an empty body, already complete
        if self._state == _CHUNKED:
            body = self._dechunk(data)
            if body:
                consumer.feed(body, now)
            if self._left == _TRAILERS and self._trailers_done():
                self._complete(now)
        elif self._state == _LENGTH:
            body = data[: self._left]
            self._left -= len(body)
            if len(data) > len(body):
                self._buf = data[len(body) :]  # more than the response: not reusable
            if body:
                consumer.feed(body, now)
            if self._left == 0:
                self._complete(now)
        elif self._state == _UNTIL_CLOSE:
            consumer.feed(data, now)

    def _head(self, head: bytes) -> bool:
        """Parse a response head; False for an informational (1xx) one."""
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise HTTPError("malformed", f"not an HTTP/1.x response: {lines[0][:80]!r}")
        status = int(parts[1])
        if 100 <= status < 200:
            return False
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                raise HTTPError("malformed", f"bad response header line {line[:80]!r}")
            headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
        connection = headers.get("connection", "").lower()
        self._keep_alive = (parts[0] == b"HTTP/1.1" and "close" not in connection) or "keep-alive" in connection
        assert self._consumer is not None
        self._consumer.head(status, headers)
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._state, self._left = _CHUNKED, _SIZE_LINE
        elif "content-length" in headers:
            try:
                self._left = int(headers["content-length"])
            except ValueError:
                raise HTTPError("malformed", f"bad Content-Length {headers['content-length']!r}") from None
            self._state = _LENGTH
            if self._left == 0:
                self._complete(time.perf_counter())
        elif status in (204, 304):
            self._state = _LENGTH
            self._complete(time.perf_counter())
        else:
            self._state = _UNTIL_CLOSE
        return True

    def _dechunk(self, data: bytes) -> bytes:
        """The body bytes in `data` of a chunked response; sets `_left` to _TRAILERS at its last chunk."""
        buf = self._buf + data if self._buf else data
        self._buf = b""
        pos, end = 0, len(buf)
        out: list[bytes] = []
        left = self._left
        while pos < end:
            if left > 0:
                take = buf[pos : pos + left]
                out.append(take)
                pos += len(take)
                left -= len(take)
                if left == 0:
                    left = _DATA_CRLF
            elif left == _DATA_CRLF:
                if end - pos < 2:
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    raise HTTPError("malformed", "chunk data not followed by CRLF")
                pos += 2
                left = _SIZE_LINE
            elif left == _SIZE_LINE:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    if end - pos > 1024:
                        raise HTTPError("malformed", "chunk size line too long")
                    break
                try:
                    size = int(buf[pos:eol].split(b";", 1)[0], 16)
                except ValueError:
                    raise HTTPError("malformed", f"bad chunk size line {buf[pos:eol][:40]!r}") from None
                pos = eol + 2
                left = size if size > 0 else _TRAILERS
            else:  # trailers: kept in the buffer until their blank line
                break
        self._left = left
        self._buf = buf[pos:]
        return b"".join(out) if len(out) != 1 else out[0]

    def _trailers_done(self) -> bool:
        """Whether the trailer section (usually just CRLF) is complete; drops it from the buffer."""
        buf = self._buf
        if buf[:2] == b"\r\n":
            self._buf = buf[2:]
            return True
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            return False
        self._buf = buf[end + 4 :]
        return True


class ConnectionPool:
    """Keep-alive connections to the origin of `url`, at most `limit` open at once (0: no limit)."""

    def __init__(self, url: str, limit: int = 0, connect_timeout: float = 10.0) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        default_port = self.port == (443 if parts.scheme == "https" else 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if default_port else f"{host}:{self.port}"
        self.ssl: Optional[_ssl.SSLContext] = _ssl.create_default_context() if parts.scheme == "https" else None
        self.limit = limit
        self.connect_timeout = connect_timeout
        self.opened = 0
        """Connections opened so far."""
        self._idle: list[_Connection] = []
        self._open = 0
        self._waiters: deque[asyncio.Future[Optional[_Connection]]] = deque()
        self._closed = False

    async def acquire(self) -> _Connection:
        """An idle connection, a new one, or (at the limit) the next one freed."""
        while self._idle:
            conn = self._idle.pop()
            if conn.usable:
                return conn
        if self.limit and self._open >= self.limit:
            waiter: asyncio.Future[Optional[_Connection]] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                conn = await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled() and waiter.result() is not None:
                    self._put(waiter.result())  # type: ignore[arg-type]
                elif waiter.done() and not waiter.cancelled():
                    self._wake()  # the free slot we were given goes to the next waiter
                raise
            if conn is not None:
                return conn
            # a slot was freed by a closed connection: open a new one below
        self._open += 1
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(self), self.host, self.port, ssl=self.ssl),
                self.connect_timeout,
            )
        except asyncio.TimeoutError:
            self._open -= 1
            self._wake()
            raise HTTPError("connect", f"ConnectionTimeoutError: no connection to {self.host}:{self.port} within {self.connect_timeout:g} s") from None
        except OSError as exc:
            self._open -= 1
            self._wake()
            raise HTTPError("connect", f"ClientConnectorError: cannot connect to {self.host}:{self.port}: {exc}") from None
        except BaseException:
            self._open -= 1
            self._wake()
            raise
        self.opened += 1
        return conn

    def _put(self, conn: _Connection) -> None:
        """A connection whose response is complete: to a waiter, else to the idle list."""
        if self._closed:
            conn.abort()
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        self._idle.append(conn)

    def _wake(self) -> None:
        """A slot is free (a connection closed): let the first waiter open one."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _lost(self, conn: _Connection) -> None:
        self._open -= 1
        if conn in self._idle:
            self._idle.remove(conn)
        self._wake()

    async def close(self) -> None:
        """Close every idle connection; connections in use close when their call ends."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.abort()
        await asyncio.sleep(0)  # let the transports report their closing
