"""An incremental parser for server-sent events (the `text/event-stream` of streaming OpenAI responses).

Bytes go in as they arrive, in chunks of any size; complete events come out. A line may be split across
chunks anywhere, even inside a UTF-8 character or between the ``\\r`` and ``\\n`` of a line ending.
Only the ``data`` field matters for OpenAI-style streams; ``event``, ``id`` and ``retry`` are accepted
and ignored, comment lines (starting with ``:``) are skipped, and any other line is malformed.
"""

from __future__ import annotations

KNOWN_FIELDS = frozenset((b"event", b"id", b"retry"))


class SSEError(ValueError):
    """A line that is not valid server-sent-event syntax for an OpenAI stream."""


class SSEParser:
    """Turns a byte stream into the data payloads of its events, one `feed` at a time.

    ``feed(chunk)`` returns the events completed by that chunk, each as the text of its data lines
    joined with newlines (the SSE rule). A stream that ends without a final blank line leaves its last
    event in `pending`; `close` returns it.
    """

    __slots__ = ("_buffer", "_data", "_skip_lf")

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[bytes] = []
        self._skip_lf = False

    def feed(self, chunk: bytes) -> list[str]:
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
        lines = buffer.split(b"\n")
        self._buffer = lines.pop()
        events: list[str] = []
        for line in lines:
            if not line:
                if self._data:
                    events.append(b"\n".join(self._data).decode("utf-8", "replace"))
                    self._data = []
                continue
            if line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)
            elif line.startswith(b":"):
                continue
            else:
                name = line.split(b":", 1)[0]
                if name not in KNOWN_FIELDS:
                    raise SSEError(f"not a server-sent-event line: {line[:80]!r}")
        return events

    @property
    def pending(self) -> bool:
        """Whether part of a line or an unterminated event is buffered."""
        return bool(self._buffer or self._data)

    def close(self) -> list[str]:
        """End of stream: return the last event if it was not followed by a blank line."""
        events = self.feed(b"\n\n") if self._buffer else []
        if self._data:
            events.append(b"\n".join(self._data).decode("utf-8", "replace"))
            self._data = []
        return events
