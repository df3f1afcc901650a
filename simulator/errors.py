"""Errors for bad input, and the policy that decides whether a bad record stops an import or is skipped."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal, Optional

OnError = Literal["raise", "skip"]


class InputError(Exception):
    """Bad input: names the file, the line (or JSON path) and the field, so a user can fix it.

    The command line prints it as one line and exits with code 2, never a traceback."""

    def __init__(
        self,
        message: str,
        *,
        file: Optional[str] = None,
        line: Optional[int] = None,
        path: Optional[str] = None,
        field: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.file = file
        self.line = line
        self.path = path
        self.field = field

    def __str__(self) -> str:
        where = self.file or "<input>"
        if self.line is not None:
            where += f":{self.line}"
        if self.path:
            where += f": at {self.path}"
        if self.field:
            where += f": field '{self.field}'"
        return f"{where}: {self.message}"


@dataclass
class ErrorPolicy:
    """Collects bad records: raises the first one (`raise`) or counts them by reason (`skip`)."""

    on_error: OnError = "raise"
    skipped: Counter = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)

    def bad(self, error: InputError) -> None:
        """Report a bad record: raise it, or count it and go on."""
        if self.on_error == "raise":
            raise error
        reason = f"{error.field}: {error.message}" if error.field else error.message
        self.skipped[reason] += 1
        self.examples.setdefault(reason, str(error))

    @property
    def total_skipped(self) -> int:
        return sum(self.skipped.values())

    def notes(self) -> tuple[str, ...]:
        """One line per reason, for a workload's provenance."""
        return tuple(
            f"skipped {n} record(s): {reason} (first: {self.examples[reason]})"
            for reason, n in self.skipped.most_common()
        )
