"""Errors for bad input, and the policy that decides whether a bad record stops an import or is skipped."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal, Optional, Sequence

OnError = Literal["raise", "skip"]


class InputError(Exception):
    """Bad input: names the file, the line (or JSON path) and the field, so a user can fix it.

    One error may hold several problems of one file (`several`): its `message`, `file`, `line`, `path`
    and `field` are then the first problem's, `problems` holds them all, and its text is a line of
    count followed by one line per problem. The command line prints it and exits with code 2, never a
    traceback."""

    MAX_SHOWN = 20
    """Most problems the text lists; the rest are counted."""

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
        self._problems: tuple[InputError, ...] = ()

    @classmethod
    def several(cls, problems: Sequence["InputError"]) -> "InputError":
        """One error for all of `problems` (at least one); a single problem is returned as it is."""
        if not problems:
            raise ValueError("several() needs at least one problem")
        if len(problems) == 1:
            return problems[0]
        first = problems[0]
        error = cls(first.message, file=first.file, line=first.line, path=first.path, field=first.field)
        error._problems = tuple(problems)
        return error

    @property
    def problems(self) -> tuple["InputError", ...]:
        """Every problem this error reports, in order (itself alone unless made by `several`)."""
        return self._problems or (self,)

    def __str__(self) -> str:
        if not self._problems:
            return self._located()
        files = {p.file for p in self._problems}
        head = f"{files.pop() or '<input>'}: " if len(files) == 1 else ""
        lines = [f"{head}{len(self._problems)} problems"]
        lines += [f"  {p}" for p in self._problems[: self.MAX_SHOWN]]
        if len(self._problems) > self.MAX_SHOWN:
            lines.append(f"  ... and {len(self._problems) - self.MAX_SHOWN} more")
        return "\n".join(lines)

    def _located(self) -> str:
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
