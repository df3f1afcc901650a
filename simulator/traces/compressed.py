"""JSON Lines traces that may come gzip-compressed (TraceLab's release, Dynamo's rolled segments): the
decompressed start of a file for `sniff`, and its lines for `read`, however it is stored."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import Iterator

GZIP_MAGIC = b"\x1f\x8b"


def plain_head(head: bytes, limit: int = 65536) -> bytes:
    """`head` as text: decompressed (up to `limit` bytes) when it is the start of a gzip file, b'' when
    that gzip data is damaged, else unchanged."""
    if not head.startswith(GZIP_MAGIC):
        return head
    try:
        return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, limit)
    except zlib.error:
        return b""


class DamagedGzip(Exception):
    """The compressed stream ends early or is not valid gzip after `line` lines were read."""

    def __init__(self, line: int, truncated: bool, detail: str) -> None:
        super().__init__(detail)
        self.line = line
        self.truncated = truncated


def lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(line number from 1, bytes) of each line of a plain or gzip file (one or several members);
    `DamagedGzip` where the compressed stream breaks."""
    with open(path, "rb") as raw:
        zipped = raw.read(2) == GZIP_MAGIC
    number = 0
    try:
        with (gzip.open(path, "rb") if zipped else open(path, "rb")) as fh:
            for number, line in enumerate(fh, start=1):
                yield number, line
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise DamagedGzip(number, isinstance(exc, EOFError), str(exc)) from None
