"""The lean HTTP/1.1 client: response framing at any split, keep-alive decisions, failures, the pool."""

import asyncio

import pytest

from simulator.live.http1 import ConnectionPool, HTTPError, _Connection


class FakeTransport:
    """Collects writes; closing reports the loss to the protocol, as a real transport does."""

    def __init__(self, protocol):
        self.protocol = protocol
        self.written = []
        self.closing = False

    def write(self, data):
        self.written.append(data)

    def is_closing(self):
        return self.closing

    def close(self):
        if not self.closing:
            self.closing = True
            self.protocol.connection_lost(None)

    abort = close


class Sink:
    """A consumer keeping what it was given."""

    def __init__(self):
        self.status, self.headers, self.body, self.closed = None, None, b"", False

    def head(self, status, headers):
        self.status, self.headers = status, headers

    def feed(self, data, now):
        self.body += data

    def close(self, now):
        self.closed = True


def connection():
    pool = ConnectionPool("http://127.0.0.1:9")
    conn = _Connection(pool)
    pool._open += 1
    conn.connection_made(FakeTransport(conn))
    return pool, conn


async def exchange(pieces, stall=30.0):
    """Run one request over a fake connection, feeding the response in `pieces`."""
    pool, conn = connection()
    sink = Sink()
    done = conn.request(b"POST / HTTP/1.1\r\n\r\n", sink, stall)
    for piece in pieces:
        if done.done():
            break
        conn.data_received(piece)
    return pool, conn, sink, done


CHUNKED = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"7\r\ndata: a\r\n"
    b"16;ext=1\r\ndata: {\"x\": \"caf\xc3\xa9\"}\n\n\r\n"
    b"e\r\ndata: [DONE]\n\n\r\n"
    b"0\r\nX-Trailer: 1\r\n\r\n"
)
CHUNKED_BODY = b'data: adata: {"x": "caf\xc3\xa9"}\n\ndata: [DONE]\n\n'


@pytest.mark.parametrize("cut", range(1, len(CHUNKED)))
async def test_chunked_response_at_every_split(cut):
    pool, conn, sink, done = await exchange([CHUNKED[:cut], CHUNKED[cut:]])
    assert done.done() and done.exception() is None
    assert sink.status == 200 and sink.headers["content-type"] == "text/event-stream"
    assert sink.body == CHUNKED_BODY and sink.closed
    assert conn.usable and pool._idle == [conn]  # back in the pool for the next call


async def test_chunked_response_one_byte_at_a_time():
    pool, conn, sink, done = await exchange([CHUNKED[i : i + 1] for i in range(len(CHUNKED))])
    assert done.done() and sink.body == CHUNKED_BODY and conn.usable


async def test_content_length_body():
    pool, conn, sink, done = await exchange([b"HTTP/1.1 400 Bad Request\r\nContent-Length: 5\r\n\r\nhel", b"lo"])
    assert done.done() and sink.status == 400 and sink.body == b"hello" and conn.usable


async def test_bytes_beyond_the_response_make_the_connection_unusable():
    pool, conn, sink, done = await exchange([b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA"])
    assert done.done() and sink.body == b"ok"
    assert not conn.usable and pool._idle == []


async def test_connection_close_and_http_10_are_not_reused():
    for head in (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n"):
        pool, conn, sink, done = await exchange([head])
        assert done.done() and sink.closed and not conn.usable


async def test_body_until_close():
    pool, conn, sink, done = await exchange([b"HTTP/1.1 200 OK\r\n\r\ndata: x\n\n"])
    assert not done.done()
    conn.connection_lost(None)
    assert done.done() and done.exception() is None and sink.body == b"data: x\n\n" and sink.closed


async def test_informational_head_is_skipped():
    pool, conn, sink, done = await exchange([b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nz"])
    assert done.done() and sink.status == 200 and sink.body == b"z"


@pytest.mark.parametrize(
    "response,kind",
    [
        (b"SSH-2.0-OpenSSH\r\n\r\n", "malformed"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "malformed"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "malformed"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY", "malformed"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", "reset"),  # then the server hangs up
    ],
)
async def test_failures(response, kind):
    pool, conn, sink, done = await exchange([response])
    if not done.done():
        conn.transport.close()
    assert isinstance(done.exception(), HTTPError) and done.exception().kind == kind
    assert not conn.usable


async def test_a_consumer_error_drops_the_connection():
    class Failing(Sink):
        def feed(self, data, now):
            raise ValueError("bad event")

    pool, conn = connection()
    done = conn.request(b"x", Failing(), 30.0)
    conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc")
    assert isinstance(done.exception(), ValueError) and not conn.usable


async def test_stall_fails_the_call():
    pool, conn, sink, done = await exchange([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"], stall=0.05)
    with pytest.raises(HTTPError) as caught:
        await done
    assert caught.value.kind == "stall" and "Timeout" in caught.value.message


async def test_pool_at_its_limit_hands_a_freed_connection_to_the_next_call():
    async def serve(reader, writer):
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = ConnectionPool(f"http://127.0.0.1:{port}", limit=1)
    try:

        async def call():
            conn = await pool.acquire()
            sink = Sink()
            await conn.request(b"POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n", sink, 5.0)
            return sink.body

        assert await asyncio.gather(*(call() for _ in range(5))) == [b"ok"] * 5
        assert pool.opened == 1
    finally:
        await pool.close()
        server.close()
        await server.wait_closed()


async def test_refused_connection_is_a_connect_error():
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pool = ConnectionPool(f"http://127.0.0.1:{port}", connect_timeout=2)
    with pytest.raises(HTTPError) as caught:
        await pool.acquire()
    assert caught.value.kind == "connect"


def test_bad_url():
    with pytest.raises(ValueError):
        ConnectionPool("ftp://host/")
