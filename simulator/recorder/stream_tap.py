"""What the recorder reads from a response while passing it on: usage, first token, finish reason.

A streamed response (server-sent events) goes to the client chunk by chunk as it arrives. `StreamTap`
looks at each chunk on the way: the first chunk with a choice marks the first token, a ``finish_reason``
gives the stop reason, an event with ``usage`` gives the token counts (the last such wins: vLLM's
continuous usage stats send one per chunk). When the recorder asked for usage the client did not ask for
(``stream_options.include_usage``), the usage-only event (``"choices":[]``) is held back from the client:
the client gets what it would have got without the recorder. Only then does the tap hold back bytes, and
only an event not yet complete. Chunks without ``usage`` (all but the last, as a rule) are looked at
whole, with a few byte searches; only those with it are cut into events and parsed.
"""

from __future__ import annotations

import re
from typing import Any, Optional

import orjson

_BOUNDARY = re.compile(rb"\r\n\r\n|\n\n|\r\r")
_FINISH = re.compile(rb'"finish_reason":\s*"([^"\\]{1,64})"')
_CHOICE = b'"choices":[{'
_USAGE = b'"usage"'


class StreamTap:
    """Feed it the response's chunks; it returns the bytes to pass on and keeps what it saw."""

    __slots__ = ("strip_usage", "_tail", "usage", "first_token", "finish_reason")

    def __init__(self, strip_usage: bool = False) -> None:
        self.strip_usage = strip_usage
        self._tail = b""
        """The bytes after the last complete event (held back from the client only when stripping)."""
        self.usage: Optional[dict[str, Any]] = None
        self.first_token = False
        self.finish_reason: Optional[str] = None

    def feed(self, chunk: bytes) -> tuple[bytes, bool]:
        """The bytes of `chunk` to pass on now, and whether this chunk brought the first token."""
        data = self._tail + chunk if self._tail else chunk
        first = not self.first_token and _CHOICE in data
        if first:
            self.first_token = True
        if b'"finish_reason":' in data or b'"finish_reason": ' in data:
            found = _FINISH.findall(data)
            if found:
                self.finish_reason = found[-1].decode("ascii", "replace")
        if _USAGE not in data and b"\r" not in data:
            cut = data.rfind(b"\n\n") + 2 if b"\n\n" in data else 0
            self._tail = data[cut:]
            return (data[:cut] if self.strip_usage else chunk), first
        cut = 0
        kept: list[bytes] = []
        for match in _BOUNDARY.finditer(data):
            event = data[cut:match.end()]
            if not (self._usage_of(event) and self.strip_usage):
                kept.append(event)
            cut = match.end()
        self._tail = data[cut:]
        return (b"".join(kept) if self.strip_usage else chunk), first

    def close(self) -> bytes:
        """What is left at the end of the stream (an event without its closing blank line)."""
        tail, self._tail = self._tail, b""
        if tail.strip() and self._usage_of(tail) and self.strip_usage:
            return b""
        return tail if self.strip_usage else b""

    def _usage_of(self, event: bytes) -> bool:
        """Read an event's usage, if it has one; True when it is a usage-only event (no choices)."""
        if _USAGE not in event:
            return False
        payload = _payload(event)
        if payload is None or not isinstance(payload.get("usage"), dict):
            return False
        self.usage = payload["usage"]
        return payload.get("choices") == []


def _payload(event: bytes) -> Optional[dict[str, Any]]:
    """The JSON object an event's data lines hold, or None."""
    lines = [line[5:].lstrip(b" ") for line in event.splitlines() if line.startswith(b"data:")]
    try:
        value = orjson.loads(b"\n".join(lines))
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None
