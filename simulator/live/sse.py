"""An incremental parser for server-sent events (the `text/event-stream` of streaming OpenAI responses).

Bytes go in as they arrive, in chunks of any size; complete events come out as bytes (the caller
decodes or parses them: orjson reads bytes directly). A line may be split across chunks anywhere, even
inside a UTF-8 character or between the ``\\r`` and ``\\n`` of a line ending. Only the ``data`` field
matters for OpenAI-style streams; ``event``, ``id`` and ``retry`` are accepted and ignored, comment
lines (starting with ``:``) are skipped, and any other line is malformed.

The usual event, one ``data: ...`` line and a blank line, is cut out of the buffer in bulk (one split
per read, not a Python step per line); anything else goes through the line-by-line rules.
"""

from __future__ import annotations

KNOWN_FIELDS = frozenset((b"event", b"id", b"retry"))


class SSEError(ValueError):
    """A line that is not valid server-sent-event syntax for an OpenAI stream."""


class SSEParser:
    """Turns a byte stream into the data payloads of its events, one `feed` at a time.

    ``feed(chunk)`` returns the events completed by that chunk, each as the bytes of its data lines
    joined with newlines (the SSE rule). A stream that ends without a final blank line leaves its last
    event in `pending`; `close` returns it.
    """

    __slots__ = ("_buffer", "_data", "_skip_lf")

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[bytes] = []
        self._skip_lf = False

    def feed(self, chunk: bytes) -> list[bytes]:
        """Parse `chunk`; return the data of every event it completed. Raises `SSEError` on a bad line."""
        if not chunk:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        buffer = self._buffer + chunk if self._buffer else chunk
        if b"\r" in buffer:
            if buffer.endswith(b"\r"):
                # The '\n' of a '\r\n' may come in the next chunk; the line is complete either way.
                self._skip_lf = True
            buffer = buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        blocks = buffer.split(b"\n\n")
        tail = blocks.pop()  # after the last blank line: lines of an unfinished event
        events: list[bytes] = []
        for block in blocks:
            if not self._data and block[:6] == b"data: " and b"\n" not in block:
                events.append(block[6:])  # the common case: one data line, then the blank line
                continue
            for line in block.split(b"\n"):
                self._line(line, events)
            self._line(b"", events)
        if tail:
            lines = tail.split(b"\n")
            self._buffer = lines.pop()
            for line in lines:
                self._line(line, events)
        else:
            self._buffer = b""
        return events

    def _line(self, line: bytes, events: list[bytes]) -> None:
        if not line:
            if self._data:
                events.append(b"\n".join(self._data))
                self._data = []
        elif line.startswith(b"data:"):
            value = line[5:]
            self._data.append(value[1:] if value.startswith(b" ") else value)
        elif not line.startswith(b":") and line.split(b":", 1)[0] not in KNOWN_FIELDS:
            raise SSEError(f"not a server-sent-event line: {line[:80]!r}")

    @property
    def pending(self) -> bool:
        """Whether part of a line or an unterminated event is buffered."""
        return bool(self._buffer or self._data)

    def close(self) -> list[bytes]:
        """End of stream: return the last event if it was not followed by a blank line."""
        events = self.feed(b"\n\n") if self._buffer else []
        if self._data:
            events.append(b"\n".join(self._data))
            self._data = []
        return events
