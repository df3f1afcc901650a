"""Azure LLM inference traces (Azure/AzurePublicDataset): CSV of single requests.

Columns ``TIMESTAMP`` (``2023-11-16 18:17:03.9799600``: date and time with up to 7 fractional digits,
optionally with a UTC offset as in the 2024 release), ``ContextTokens`` and ``GeneratedTokens``. Every row
becomes a task of one call (ids ``azure-<row>``, the row counted from 0 after the header); its arrival is
seconds since the first row. Rows must be in time order: a row earlier than the one before it is bad input.
"""

from __future__ import annotations

from datetime import date, datetime, timezone
from pathlib import Path

from ..errors import ErrorPolicy, InputError
from ..workload import MAX_SECONDS, Call, Provenance, Task, Workload
from .csvfields import check_width, tokens
from .text import TextFile, first_line

FORMAT = "azure"
TIME, INPUT, OUTPUT = "TIMESTAMP", "ContextTokens", "GeneratedTokens"
COLUMNS = (TIME, INPUT, OUTPUT)


def sniff(path: Path, head: bytes) -> bool:
    """True when the CSV header names the three Azure columns."""
    names = {c.strip() for c in first_line(head).split(",")}
    return all(c in names for c in COLUMNS)


class _Clock:
    """Parses timestamps to (day number, seconds into the day); dates are cached, they rarely change."""

    def __init__(self) -> None:
        self.days: dict[str, int] = {}

    def parse(self, text: str) -> tuple[int, float]:
        """(proleptic day number, seconds since midnight UTC); ValueError when not a timestamp."""
        if len(text) >= 19 and text[10] in " T" and text[13] == ":" and text[16] == ":":
            try:
                sec = float(text[17:])
            except ValueError:
                sec = -1.0  # an offset or suffix follows the seconds: take the general path
            if 0.0 <= sec < 61.0:
                day = self.days.get(text[:10])
                if day is None:
                    day = self.days[text[:10]] = date.fromisoformat(text[:10]).toordinal()
                return day, int(text[11:13]) * 3600 + int(text[14:16]) * 60 + sec
        return self._general(text)

    @staticmethod
    def _general(text: str) -> tuple[int, float]:
        # datetime takes at most 6 fractional digits: drop the 7th (100 ns) before parsing
        head, dot, rest = text.strip().partition(".")
        if dot:
            digits = len(rest) - len(rest.lstrip("0123456789"))
            rest = rest[: min(digits, 6)] + rest[digits:]
        stamp = datetime.fromisoformat(head + dot + rest)
        if stamp.tzinfo is not None:
            stamp = stamp.astimezone(timezone.utc)
        seconds = stamp.hour * 3600 + stamp.minute * 60 + stamp.second + stamp.microsecond / 1e6
        return stamp.toordinal(), seconds


def read(path: Path, policy: ErrorPolicy) -> Workload:
    """Read an Azure LLM inference CSV: one single-call task per row."""
    name = str(path)
    clock = _Clock()
    tasks: list[Task] = []
    text = TextFile(path)
    with text:
        rows = text.csv_rows(name)
        header = next(rows, (1, None))[1]
        if not header:
            raise InputError("empty file: no CSV header", file=name, line=1)
        where = {c.strip(): i for i, c in enumerate(header)}
        for column in COLUMNS:
            if column not in where:
                raise InputError(f"missing column (header has: {', '.join(header)})", file=name, line=1, field=column)
        i_time, i_in, i_out = (where[c] for c in COLUMNS)
        width = max(i_time, i_in, i_out) + 1
        origin: tuple[int, float] | None = None
        last = -1.0
        for row_number, (line, row) in enumerate(rows):
            if not row:
                continue
            try:
                check_width(row, width, header, name, line)
                try:
                    stamp = clock.parse(row[i_time])
                except (ValueError, OverflowError):
                    raise InputError("not a timestamp", file=name, line=line, field=TIME) from None
                n_in = tokens(row[i_in], name, line, INPUT)
                n_out = tokens(row[i_out], name, line, OUTPUT)
                if origin is None:
                    origin = stamp
                # rounded to the trace's 100 ns resolution, which float subtraction blurs
                arrival = round((stamp[0] - origin[0]) * 86400 + (stamp[1] - origin[1]), 7)
                if arrival < last:
                    raise InputError(
                        "goes backwards: earlier than the row before it",
                        file=name, line=line, field=TIME,
                    )
                if arrival > MAX_SECONDS:
                    raise InputError(f"more than {MAX_SECONDS:g} s after the first row", file=name, line=line,
                                     field=TIME)
            except InputError as exc:
                policy.bad(exc)
                continue
            last = arrival
            tasks.append(Task(f"azure-{row_number:06d}", (Call(n_in, n_out),), arrival))
    if not tasks:
        raise InputError("no requests found", file=name)
    notes = ("single requests: one call per task, no sessions or prefix hashes in this trace",)
    if text.note():
        notes += (text.note(),)
    return Workload(tuple(tasks), (Provenance(name, FORMAT, {"on_error": policy.on_error}, notes),))
