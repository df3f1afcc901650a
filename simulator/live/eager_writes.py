"""Request bodies go out in the sending task, on every Python version.

aiohttp writes a request's body in a task of its own (``ClientRequest.write_bytes``). On Python 3.12 and
newer it starts that task eagerly, so the body leaves in the same step of the event loop as the call to
``session.post``. On Python 3.11, which has no eager tasks, the task waits for its turn in the loop's
ready queue, behind every callback already there: under a thousand streams that is a whole loop turn,
tens of milliseconds, so the server sees the request that much later than the tool meant to send it
(the client lag grows; TTFT stays right, since it runs from the real write).

`eager_body_writes` installs, on Python 3.11 only, a task factory that runs the first step of that one
coroutine at once (up to its first real wait, normally to the end: the body is written and nothing is
left to wait for), which is what aiohttp itself does on newer Pythons. Every other task is created as
before.
"""

from __future__ import annotations

import asyncio
import sys
import types
from contextlib import contextmanager
from typing import Any, Coroutine, Generator, Iterator

WRITER = "ClientRequest.write_bytes"
"""The qualified name of aiohttp's body-writer coroutine."""

NEEDED = sys.version_info < (3, 12)
"""Whether this Python needs the shim (3.12+ has eager tasks, which aiohttp uses itself)."""


@types.coroutine
def _resume(coro: Coroutine[Any, Any, Any], yielded: Any) -> Generator[Any, Any, Any]:
    """Drive `coro`, already advanced to its first wait (it yielded `yielded`), under a Task."""
    while True:
        try:
            sent = yield yielded
        except BaseException as exc:  # cancellation and errors go on into the coroutine
            try:
                yielded = coro.throw(exc)
            except StopIteration as stop:
                return stop.value
        else:
            try:
                yielded = coro.send(sent)
            except StopIteration as stop:
                return stop.value


async def _finish(coro: Coroutine[Any, Any, Any], yielded: Any) -> Any:
    return await _resume(coro, yielded)


async def _raise(exc: BaseException) -> None:
    raise exc


def _factory(previous: Any):
    def create(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> "asyncio.Future[Any]":
        if getattr(coro, "__qualname__", None) == WRITER:
            try:
                yielded = coro.send(None)
            except StopIteration as stop:
                done = loop.create_future()  # aiohttp only asks whether its writer is done
                done.set_result(stop.value)
                return done
            except BaseException as exc:  # surfaces where aiohttp awaits its writer, as before
                coro = _raise(exc)
            else:
                coro = _finish(coro, yielded)
        if previous is not None:
            return previous(loop, coro, **kwargs)
        return asyncio.Task(coro, loop=loop, **kwargs)

    create.eager_body_writes = True  # type: ignore[attr-defined]
    return create


@contextmanager
def eager_body_writes(loop: asyncio.AbstractEventLoop) -> Iterator[None]:
    """While inside, aiohttp's request bodies are written in the sending task (a no-op on 3.12+)."""
    previous = loop.get_task_factory()
    if not NEEDED or getattr(previous, "eager_body_writes", False):
        yield
        return
    loop.set_task_factory(_factory(previous))
    try:
        yield
    finally:
        loop.set_task_factory(previous)
