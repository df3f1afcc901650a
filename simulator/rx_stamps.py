"""When response bytes really arrived: the kernel's receive timestamp, not the time the loop read them.

A client's event loop reads a socket only when it gets to it. In a burst (hundreds of first tokens
arriving within a few milliseconds) the loop reads them one after another, each after the work of
those before it, so a token timed when it is read carries that queue in its TTFT, and a client whose
CPU is taken by another process carries that too. Linux stamps every received packet as it arrives
(``SO_TIMESTAMPNS``) and hands the stamp of the last packet a ``recvmsg`` copied out beside the bytes.
`StampedSocket` reads that way and keeps the stamp, converted to ``time.perf_counter``'s clock, in
`arrival`, where the client's protocol callback, which runs in the same call as the read, takes it
as the bytes' time. A busy loop then delays when a token is read, never the time it is given.

It takes the event loop's own socket reads: asyncio's selector loop reads through the socket object
(`recv`, `recv_into`), uvloop reads the file descriptor itself, so there no stamp is seen and
`arrival` stays None (the caller then takes the time of reading, as without this module). The kernel
turns its stamping on some milliseconds after the first socket asks for it; `keep_stamping` asks once
ahead of a run. Packets that came in before that carry no stamp and are timed as read.

Servers get the same from `listener`: its accepted connections read this way, and a request handler
asks `last_arrival` when its request arrived (the emulator starts a request's clock there).
"""

from __future__ import annotations

import socket
import struct
import sys
import threading
import time
from typing import Any, Optional

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
"""The Linux socket option (and control message type) of receive stamps in nanoseconds."""
SUPPORTED = sys.platform.startswith("linux")
_ANCILLARY = socket.CMSG_SPACE(16) if SUPPORTED else 0
_SOL_SOCKET = socket.SOL_SOCKET
_unpack = struct.Struct("@qq").unpack_from
_perf = time.perf_counter
_wall = time.time


class Arrival(threading.local):
    """The arrival time, on ``perf_counter``'s clock, of the bytes this thread's last read returned;
    None when that read carried no kernel stamp."""

    time: Optional[float] = None


arrival = Arrival()
"""Set by every read of a `StampedSocket` (an event loop's protocol callback runs in the same call as
its read, before the loop's next read)."""


def _stamp(ancillary: list[tuple[int, int, bytes]]) -> Optional[float]:
    for level, kind, data in ancillary:
        if level == _SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= 16:
            seconds, nanoseconds = _unpack(data)
            # The stamp is on the wall clock; how long ago it was is read on the wall clock too, and
            # taken off perf_counter's now (a step of the wall clock in between would show here).
            age = _wall() - (seconds + nanoseconds * 1e-9)
            return _perf() - (age if age > 0.0 else 0.0)
    return None


class StampedSocket(socket.socket):
    """A TCP socket whose reads keep the kernel's receive stamp of what they returned, in `arrival` (for
    the protocol callback the read calls) and by file descriptor (`last_arrival`, for code that runs
    after the callback: a request handler, a response's first bytes buffered with its headers)."""

    __slots__ = ()

    def recv(self, bufsize: int, flags: int = 0) -> bytes:  # type: ignore[override]
        data, ancillary, _, _ = self.recvmsg(bufsize, _ANCILLARY, flags)
        _by_descriptor[self.fileno()] = arrival.time = _stamp(ancillary) if ancillary else None
        return data

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:  # type: ignore[override]
        view = memoryview(buffer)
        size, ancillary, _, _ = self.recvmsg_into([view[:nbytes] if nbytes else view], _ANCILLARY, flags)
        _by_descriptor[self.fileno()] = arrival.time = _stamp(ancillary) if ancillary else None
        return size


_by_descriptor: dict[int, Optional[float]] = {}


class StampedListener(socket.socket):
    """A listening TCP socket whose accepted connections keep receive stamps (`last_arrival`)."""

    __slots__ = ()

    def accept(self) -> tuple[socket.socket, Any]:
        descriptor, address = self._accept()  # type: ignore[attr-defined]
        sock = StampedSocket(self.family, self.type, self.proto, fileno=descriptor)
        sock.setsockopt(_SOL_SOCKET, SO_TIMESTAMPNS, 1)
        return sock, address


def listener(host: str, port: int, backlog: int) -> socket.socket:
    """A bound, listening socket for a server whose handlers ask `last_arrival`; a plain one where
    the platform has no receive stamps."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = (StampedListener if SUPPORTED else socket.socket)(family, socket.SOCK_STREAM)
    sock.setsockopt(_SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if SUPPORTED:
        sock.setsockopt(_SOL_SOCKET, SO_TIMESTAMPNS, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    sock.setblocking(False)
    return sock


def last_arrival(transport: Any) -> Optional[float]:
    """When the last bytes read from `transport`'s connection arrived (for a request handler: when its
    request was complete), on ``perf_counter``'s clock; None when not stamped (a plain socket,
    uvloop, stamping not on yet)."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    return None if sock is None else _by_descriptor.get(sock.fileno())


def stamped_socket(addr_info: tuple[Any, ...]) -> socket.socket:
    """An aiohttp ``socket_factory``: a `StampedSocket` for `addr_info` with receive stamps on (a
    plain socket where the platform has none)."""
    family, kind, proto = addr_info[0], addr_info[1], addr_info[2]
    if not SUPPORTED:
        return socket.socket(family, kind, proto)
    sock = StampedSocket(family, kind, proto)
    try:
        sock.setsockopt(_SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        pass  # no stamps: reads return none, and the caller times bytes as read
    return sock


def keep_stamping(wait: float = 0.5) -> Optional[socket.socket]:
    """A socket that asks for receive stamps, to be held for a run's length and closed after it.

    The kernel turns stamping on a little after the first socket asks for it (deferred work), so a
    run's first packets could go unstamped: this sends itself datagrams until one comes back stamped
    (for at most `wait` seconds), so that when it returns stamping is on. None where the platform has
    no stamps or they did not come on."""
    if not SUPPORTED:
        return None
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(_SOL_SOCKET, SO_TIMESTAMPNS, 1)
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(wait)
        deadline = _perf() + wait
        while _perf() < deadline:
            sock.sendto(b"?", sock.getsockname())
            _, ancillary, _, _ = sock.recvmsg(1, _ANCILLARY)
            if _stamp(ancillary) is not None:
                return sock
    except OSError:
        pass
    sock.close()
    return None
