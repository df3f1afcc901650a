"""The normalized workload schema: every importer produces these types, everything downstream reads them.

A `Workload` is a set of agent `Task`s. A task is a chain of `Call`s to the model, each sent after the
previous one ended plus its `gap` (tool or think time), and may spawn `SubTask`s (sub-agents) after a
given call. Prefix reuse is carried by `hash_ids`: one id per `block_size` tokens of the prompt, equal
ids meaning equal token blocks, so two calls that share leading ids share a prompt prefix.

The classes are frozen, slotted dataclasses of plain values (cheap for a million calls) that pydantic
validates and serialises directly, so the native file format and its JSON Schema come from here. A call's
`hash_ids` is a tuple or, from the importers, a `HashIds` view that shares its ids with the other calls of
its task (`simulator.hash_ids`); both read as a sequence of ints.

Bounds: token counts are whole numbers up to `MAX_TOKENS` per call, times are finite seconds up to
`MAX_SECONDS`, hash ids are integers in [0, 2**63). Importers check them, and the native file's schema
says them, so a workload that loads is one every reader can handle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Iterator, Optional, Sequence, Union

from pydantic import ConfigDict, Field, PlainValidator, Strict, WithJsonSchema

from .hash_ids import ID_LIMIT, HashIds, common_prefix

MAX_TOKENS = 1 << 24
"""Most tokens in one call's prompt or output: 16,777,216, beyond every model's context window today
(10M at most). A larger count in a trace is bad input, not a call to replay."""
MAX_SECONDS = 1e9
"""Longest time a workload holds (an arrival, a gap, a duration): about 31 years."""
MAX_DEPTH = 32
"""Deepest nesting of sub-tasks (a sub-agent of a sub-agent of ...) a workload holds."""

TokenCount = Annotated[int, Strict(), Field(ge=0, le=MAX_TOKENS)]
NonNegFloat = Annotated[float, Strict(), Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False)]
FiniteFloat = Annotated[float, Strict(), Field(ge=-MAX_SECONDS, le=MAX_SECONDS, allow_inf_nan=False)]


def _hash_ids(value: Any) -> Union[HashIds, tuple[()]]:
    """Validator of `Call.hash_ids`: a view passes; a list or tuple of ids becomes one (checked)."""
    if isinstance(value, HashIds):
        return value
    if not isinstance(value, (list, tuple)):
        raise ValueError("must be a list of hash ids")
    return HashIds.of(value) if value else ()


HashIdList = Annotated[
    Sequence[int],
    PlainValidator(_hash_ids),
    WithJsonSchema({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": ID_LIMIT - 1}}),
]

DEFAULT_CLASS = "default"

# Field docstrings become descriptions in the generated JSON Schema.
_SCHEMA_CONFIG = ConfigDict(use_attribute_docstrings=True)


@dataclass(frozen=True, slots=True)
class Call:
    """One request to the model inside a task."""

    __pydantic_config__ = _SCHEMA_CONFIG

    input_tokens: TokenCount
    """Prompt length in tokens (the whole context sent, cached or not)."""
    output_tokens: TokenCount
    """Tokens generated."""
    gap: NonNegFloat = 0.0
    """Seconds between the end of the previous call (or the task's start) and this call: tool or think time."""
    hash_ids: HashIdList = ()
    """Prefix blocks of the prompt, one id per `block_size` tokens; equal ids mean equal token blocks."""
    block_size: TokenCount = 0
    """Tokens per hash block (0 when the trace has no block hashes)."""
    server_time: Optional[NonNegFloat] = None
    """Recorded time the server took for this call, in seconds, if the trace has it."""
    sent_at: Optional[FiniteFloat] = None
    """Recorded send time in seconds from the task's start, if the trace has it."""
    stop_reason: Optional[str] = None
    """Why generation stopped (e.g. 'end_turn', 'tool_use', 'length'), if known."""
    model: Optional[str] = None
    """Model name recorded for this call, if known."""
    messages: Optional[tuple[dict[str, Any], ...]] = None
    """Optional chat messages, when the trace carries content."""


@dataclass(frozen=True, slots=True)
class SubTask:
    """A sub-agent spawned by its parent task."""

    __pydantic_config__ = _SCHEMA_CONFIG

    after_call: Annotated[int, Strict(), Field(ge=-1)]
    """Index of the parent's call after whose end the sub-task starts (-1: at the parent's start)."""
    task: Task
    """The sub-agent's own task; its `arrival` is ignored (it starts at its spawn point)."""
    wait: Annotated[bool, Strict()] = True
    """Whether the parent's next call waits for this sub-task to finish."""


@dataclass(frozen=True, slots=True)
class Task:
    """An agent task: a chain of calls with gaps between them, and the sub-agents it spawns."""

    __pydantic_config__ = _SCHEMA_CONFIG

    id: str
    calls: tuple[Call, ...]
    arrival: NonNegFloat = 0.0
    """Seconds from the start of the workload at which the task arrives."""
    task_class: str = DEFAULT_CLASS
    """A label grouping similar tasks (agent type, tenant, ...)."""
    subtasks: tuple[SubTask, ...] = ()

    def walk(self) -> Iterator[Task]:
        """This task and all its sub-tasks, depth first."""
        yield self
        for sub in self.subtasks:
            yield from sub.task.walk()


@dataclass(frozen=True, slots=True)
class Provenance:
    """Where a workload came from: a file or folder, the format it was read as, and how."""

    source: str
    format: str
    options: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    """What the importer wants a user to know (records joined into sessions, records skipped and why)."""


@dataclass(frozen=True, slots=True)
class Workload:
    """Tasks plus where they came from."""

    tasks: tuple[Task, ...]
    provenance: tuple[Provenance, ...] = ()

    def all_tasks(self) -> Iterator[Task]:
        """Every task including sub-tasks, depth first."""
        for task in self.tasks:
            yield from task.walk()

    def all_calls(self) -> Iterator[Call]:
        """Every call of every task and sub-task."""
        for task in self.all_tasks():
            yield from task.calls

    def arrival_span(self) -> float:
        """Seconds from the first top-level arrival to the last (0 for none or one task): how long a replay's
        arrivals last at recorded speed, before the last tasks run to their end."""
        if not self.tasks:
            return 0.0
        arrivals = [t.arrival for t in self.tasks]
        return max(arrivals) - min(arrivals)

    def counts(self) -> tuple[int, int, int]:
        """(top-level tasks, calls including sub-task calls, sub-tasks)."""
        calls = subtasks = 0
        for task in self.all_tasks():
            calls += len(task.calls)
            subtasks += len(task.subtasks)
        return len(self.tasks), calls, subtasks


def appended_tokens(call: Call, previous: Optional[Call]) -> int:
    """Tokens this call adds to the previous call's prompt: its prompt minus the prefix it shares with
    the previous prompt, counted in hash blocks when both calls have them, else by length."""
    if previous is None:
        return call.input_tokens
    if call.hash_ids and previous.hash_ids and call.block_size == previous.block_size:
        shared = common_prefix(call.hash_ids, previous.hash_ids)
        return max(0, call.input_tokens - shared * call.block_size)
    return max(0, call.input_tokens - previous.input_tokens)


def describe_seconds(seconds: float) -> str:
    """A duration in the largest fitting units, for people: '45 s', '12 min 5 s', '3 h 20 min', '72 days 3 h'."""
    if seconds >= 60 and seconds != float("inf"):
        minutes, secs = divmod(int(round(seconds)), 60)
        hours, minutes = divmod(minutes, 60)
        days, hours = divmod(hours, 24)
        if days:
            return f"{days} days {hours} h" if days != 1 else f"1 day {hours} h"
        if hours:
            return f"{hours} h {minutes} min"
        return f"{minutes} min {secs} s"
    return f"{seconds:.3g} s"  # short, or not finite
