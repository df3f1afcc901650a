"""Reading text trace files (CSV) whatever encoding a spreadsheet saved them in.

Files are UTF-8 as a rule, but Excel and older tools export Latin-1 / Windows-1252, or UTF-16 ("Unicode
text"). A user expects such a file to be read, so:

- a byte-order mark decides: UTF-8 (BOM dropped), UTF-16 or UTF-32 (little or big endian);
- otherwise the text is read as UTF-8, and any byte sequence that is not valid UTF-8 is read as Latin-1,
  byte by byte (a Latin-1 or Windows-1252 export reads the same as Latin-1; its numbers, which is what
  a trace is read for, are ASCII in every one of these encodings). `TextFile.fallback_bytes` counts such
  bytes so the importer can say so in its notes.

A file that still holds NUL characters (UTF-16 without a BOM), or a field longer than the csv module's
limit (128 KiB: a cap on the memory of one row), is bad input, reported by `csv_rows`.
"""

from __future__ import annotations

import codecs
import csv
from pathlib import Path
from typing import IO, Iterator, Optional

from ..errors import InputError

_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)
_HANDLER = "agentload-latin1-fallback"
_fallback_count = [0]



def _latin1(error: UnicodeError) -> tuple[str, int]:
    if not isinstance(error, UnicodeDecodeError):
        raise error
    bad = error.object[error.start:error.end]
    _fallback_count[0] += len(bad)
    return bytes(bad).decode("latin-1"), error.end


codecs.register_error(_HANDLER, _latin1)


def encoding_of(head: bytes) -> str:
    """The encoding its byte-order mark says, else UTF-8."""
    for bom, name in _BOMS:
        if head.startswith(bom):
            return name
    return "utf-8"


def head_text(head: bytes) -> str:
    """The first bytes of a file as text (a cut-off last character is dropped)."""
    name = encoding_of(head)
    return codecs.getincrementaldecoder(name)(_HANDLER if name == "utf-8" else "replace").decode(head, final=False)


def first_line(head: bytes) -> str:
    """The first non-blank line of a file's head, as text."""
    return head_text(head).lstrip().split("\n", 1)[0].rstrip("\r")


class TextFile:
    """An open text file in the encoding its head says (see the module doc)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        with open(self.path, "rb") as fh:
            head = fh.read(4)
        self.encoding = encoding_of(head)
        self.fallback_bytes = 0
        self._fh: Optional[IO[str]] = None

    def __enter__(self) -> TextFile:
        errors = _HANDLER if self.encoding == "utf-8" else "strict"
        self._fh = open(self.path, encoding=self.encoding, errors=errors, newline="")
        _fallback_count[0] = 0
        return self

    def __exit__(self, *exc: object) -> None:
        self.fallback_bytes = _fallback_count[0]
        if self._fh is not None:
            self._fh.close()

    def note(self) -> Optional[str]:
        """What to tell the user about the decoding, if anything."""
        if self.fallback_bytes:
            return (f"{self.fallback_bytes} bytes were not UTF-8 and were read as Latin-1 "
                    "(a spreadsheet export?); numbers are unaffected")
        if self.encoding not in ("utf-8", "utf-8-sig"):
            return f"read as {self.encoding.upper()} (byte-order mark)"
        return None

    def csv_rows(self, name: str) -> Iterator[tuple[int, list[str]]]:
        """(line number, row) of each CSV row; a file the csv module cannot split is an InputError."""
        assert self._fh is not None, "use TextFile as a context manager"
        reader = csv.reader(self._fh)
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                raise InputError(f"not a readable CSV row: {exc}", file=name, line=reader.line_num) from None
            except UnicodeError as exc:
                raise InputError(f"not {self.encoding.upper()} text: {exc.reason}", file=name,
                                 line=reader.line_num + 1) from None
            if any("\x00" in value for value in row):
                raise InputError("holds NUL characters: a UTF-16 file without a byte-order mark? "
                                 "Save it as UTF-8 (or UTF-16 with a BOM)", file=name, line=reader.line_num)
            yield reader.line_num, row
