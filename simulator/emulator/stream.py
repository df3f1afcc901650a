"""Writing one streamed (SSE) completion's token chunks straight to its connection."""

from __future__ import annotations

from typing import Optional

from aiohttp import web


class ChunkWriter:
    """Writes the token chunks of one SSE response straight to its connection, from the timing model's
    loop (no task switch per token). Each chunk is its pre-encoded head, the word and a tail, framed for
    HTTP chunked transfer encoding (the response was prepared chunked and its headers already sent)."""

    __slots__ = ("transport", "head", "opening", "prefix", "tail", "last_tail", "words", "sent", "max_tokens", "fault", "stop")

    def __init__(self, request: web.Request, head: str, chat: bool, max_tokens: int, words: list[bytes], fault: Optional[str]) -> None:
        self.transport = request.transport
        self.head = head
        raw = head.encode()
        if chat:
            self.opening: bytes = b"data: " + raw + b',"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
            self.prefix = b"data: " + raw + b',"choices":[{"index":0,"delta":{"content":'
            self.tail = b'},"logprobs":null,"finish_reason":null}]}\n\n'
            self.last_tail = b'},"logprobs":null,"finish_reason":"length"}]}\n\n'
        else:
            self.opening = b""
            self.prefix = b"data: " + raw + b',"choices":[{"index":0,"text":'
            self.tail = b',"logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'
            self.last_tail = b',"logprobs":null,"finish_reason":"length","stop_reason":null}]}\n\n'
        self.words = words
        self.sent = 0
        self.max_tokens = max_tokens
        self.fault = fault
        self.stop: Optional[str] = None
        """Why the stream stopped early: a fault kind, or 'closed' when the connection went."""

    def __call__(self, count: int) -> bool:
        """The request's `Emit`: write `count` more tokens (and a due fault); False once the stream stops."""
        transport = self.transport
        if transport is None or transport.is_closing():
            self.stop = "closed"
            return False
        parts = [self.opening] if self.sent == 0 and self.opening else []
        words, prefix, tail = self.words, self.prefix, self.tail
        sent, last = self.sent, self.max_tokens
        for _ in range(count):
            sent += 1
            parts += (prefix, words[sent % len(words)], tail if sent != last else self.last_tail)
        self.sent = sent
        fault = self.fault
        if fault is not None and sent >= min(2, last):
            if fault == "reset":
                self._write(parts)
                transport.abort()
                self.stop = fault
                return False
            if fault == "stall":
                self._write(parts)
                self.stop = fault
                return False
            parts.append(b'data: {"choices": [\n\n')  # malformed, once
            self.fault = None
        self._write(parts)
        return True

    def _write(self, parts: list[bytes]) -> None:
        data = b"".join(parts)
        self.transport.write(b"%x\r\n%b\r\n" % (len(data), data))  # type: ignore[union-attr]
