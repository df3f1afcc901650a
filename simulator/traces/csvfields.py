"""Checked fields of CSV trace rows, shared by the CSV importers: each bad value is an InputError
naming the file, line and column."""

from __future__ import annotations

import math

from ..errors import InputError
from ..workload import MAX_TOKENS


def tokens(text: str, name: str, line: int, field: str) -> int:
    """A non-negative whole token count up to `MAX_TOKENS` (pandas-written files may say "18.0")."""
    try:
        value = int(text)
    except ValueError:
        try:
            as_float = float(text)
        except ValueError:
            as_float = math.nan
        if not as_float.is_integer():
            raise InputError("expected a whole number of tokens", file=name, line=line, field=field) from None
        value = int(as_float)
    if value < 0:
        raise InputError("negative token count", file=name, line=line, field=field)
    if value > MAX_TOKENS:
        raise InputError(f"{value} tokens is more than the {MAX_TOKENS:,} a call may have", file=name, line=line,
                         field=field)
    return value


def check_width(row: list[str], width: int, header: list[str], name: str, line: int) -> None:
    """Raise when a row is too short to hold the columns read from it, naming the first missing one."""
    if len(row) < width:
        raise InputError("row has too few fields", file=name, line=line, field=header[len(row)].strip())
