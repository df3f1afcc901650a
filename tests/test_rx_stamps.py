"""Kernel receive stamps: a token is timed when it reached the machine, not when a busy loop read it;
the emulator starts a request's clock when the request reached it, not when its loop got to it."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time

import pytest

from simulator import rx_stamps
from simulator.emulator.process import emulator_process
from simulator.live.client import Client, Target
from simulator.live.driver import Driver
from simulator.workload import Call, Task, Workload

pytestmark = pytest.mark.skipif(not rx_stamps.SUPPORTED, reason="receive stamps are a Linux socket option")

LATE = 0.1
"""How late the reading side gets to the bytes in the socket tests (seconds)."""
TTFT = 0.2
"""The emulator's fixed TTFT in the end-to-end tests."""
BLOCKED = 0.4
"""How long the reading side is held up in the end-to-end tests: far beyond TTFT, so that timing by the
read and timing by the arrival differ by more than a loaded machine's scheduling delays."""


@pytest.fixture(scope="module", autouse=True)
def stamping():
    sock = rx_stamps.keep_stamping()
    assert sock is not None, "the kernel gave no receive stamp within keep_stamping's wait"
    yield
    sock.close()


def _pair() -> tuple[socket.socket, socket.socket]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    client = rx_stamps.stamped_socket((socket.AF_INET, socket.SOCK_STREAM, 0, "", ()))
    client.connect(server.getsockname())
    peer, _ = server.accept()
    server.close()
    return client, peer


@pytest.mark.parametrize("read", ["recv", "recv_into"])
def test_a_late_read_keeps_the_arrival_time(read):
    client, peer = _pair()
    with client, peer:
        sent = time.perf_counter()
        peer.sendall(b"data: {}\n\n")
        time.sleep(LATE)  # the reader gets to the bytes late, as a busy loop would
        read_at = time.perf_counter()
        if read == "recv":
            assert client.recv(1024) == b"data: {}\n\n"
        else:
            buffer = bytearray(1024)
            assert client.recv_into(buffer) == 10 and bytes(buffer[:10]) == b"data: {}\n\n"
        stamp = rx_stamps.arrival.time
        assert stamp is not None
        assert sent <= stamp + 1e-4 and stamp < read_at - LATE / 2, (sent, stamp, read_at)
        assert rx_stamps.last_arrival(_Transport(client)) == stamp


def test_a_read_without_a_stamp_says_so():
    client, peer = _pair()
    with client, peer:
        client.setsockopt(socket.SOL_SOCKET, rx_stamps.SO_TIMESTAMPNS, 0)
        peer.sendall(b"x")
        assert client.recv(1) == b"x"
        assert rx_stamps.arrival.time is None and rx_stamps.last_arrival(_Transport(client)) is None


class _Transport:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def get_extra_info(self, name: str):
        return self.sock if name == "socket" else None


class _Sink:
    def __init__(self) -> None:
        self.calls = []

    def call(self, record, gaps=()) -> None:
        self.calls.append(record)

    def task(self, record) -> None:
        pass


async def _replay_with_a_blocked_loop(url: str, streams: int, block_from: float) -> list:
    """Streams start together; the client's loop is blocked (as by a long callback or a CPU taken by
    another process) for `BLOCKED` seconds from `block_from` after the start."""
    workload = Workload(tuple(Task(f"t{i}", (Call(20, 2),), arrival=0.05) for i in range(streams)))
    sink = _Sink()
    async with Client(Target(base_url=url, stall_timeout=10), time.perf_counter()) as client:
        await client.warm(streams)
        loop = asyncio.get_running_loop()
        t0 = client.t0 = time.perf_counter()
        loop.call_at(loop.time() + 0.05 + block_from, time.sleep, BLOCKED)
        await Driver(client, workload, sink, t0=t0).run()
    return sink.calls


def test_the_client_times_first_tokens_at_arrival_while_its_loop_is_blocked():
    async def main():
        async with emulator_process("--ttft", str(TTFT), "--itl", "1.0") as emulator:  # a loop of its own
            return await _replay_with_a_blocked_loop(emulator.url, 8, block_from=0.1)

    calls = asyncio.run(main())
    assert len(calls) == 8 and all(c.ok for c in calls)
    # The first tokens arrive at 0.2 s while the loop is blocked from 0.1 to 0.5 s: read at 0.5 s or
    # later, stamped at their arrival.
    ttfts = sorted(c.ttft for c in calls)
    assert ttfts[-1] < TTFT + 0.15, ttfts
    assert ttfts[0] >= TTFT - 1e-3, ttfts


def test_the_emulator_starts_a_request_s_clock_when_it_arrived():
    """The emulator's process is stopped (SIGSTOP) while a request reaches it: its first token still
    comes TTFT after the request arrived, not TTFT after the emulator got to it."""

    async def main():
        async with emulator_process("--ttft", str(TTFT), "--itl", "0.01") as emulator:
            host, port = emulator.url.rsplit("/", 1)[-1].split(":")
            body = (b'{"model":"agentload-emulator","prompt":"hi","max_tokens":2,"stream":true}')
            request = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                       f"Content-Length: {len(body)}\r\n\r\n").encode() + body
            sock = socket.create_connection((host, int(port)))
            with sock:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                os.kill(emulator.pid, signal.SIGSTOP)
                try:
                    sent = time.perf_counter()
                    sock.sendall(request)
                    time.sleep(BLOCKED / 4)  # the request waits in the stopped server's socket
                finally:
                    os.kill(emulator.pid, signal.SIGCONT)
                received = b""
                while b"data: {" not in received:
                    chunk = sock.recv(4096)
                    assert chunk, received
                    received += chunk
                return time.perf_counter() - sent

    first_token = asyncio.run(main())
    # Timed from when its loop read the request, the first token would come 0.1 + 0.2 s after the send.
    assert TTFT - 1e-3 <= first_token < TTFT + 0.07, first_token
