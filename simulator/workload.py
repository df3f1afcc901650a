"""The normalized workload schema: every importer produces these types, everything downstream reads them.

A `Workload` is a set of agent `Task`s. A task is a chain of `Call`s to the model, each sent after the
previous one ended plus its `gap` (tool or think time), and may spawn `SubTask`s (sub-agents) after a
given call. Prefix reuse is carried by `hash_ids`: one id per `block_size` tokens of the prompt, equal
ids meaning equal token blocks, so two calls that share leading ids share a prompt prefix.

The classes are frozen, slotted dataclasses of plain values (cheap for a million calls) that pydantic
validates and serialises directly, so the native file format and its JSON Schema come from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Iterator, Optional

from pydantic import ConfigDict, Field

NonNegInt = Annotated[int, Field(ge=0)]
NonNegFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]

DEFAULT_CLASS = "default"

# Field docstrings become descriptions in the generated JSON Schema.
_SCHEMA_CONFIG = ConfigDict(use_attribute_docstrings=True)


@dataclass(frozen=True, slots=True)
class Call:
    """One request to the model inside a task."""

    __pydantic_config__ = _SCHEMA_CONFIG

    input_tokens: NonNegInt
    """Prompt length in tokens (the whole context sent, cached or not)."""
    output_tokens: NonNegInt
    """Tokens generated."""
    gap: NonNegFloat = 0.0
    """Seconds between the end of the previous call (or the task's start) and this call: tool or think time."""
    hash_ids: tuple[int, ...] = ()
    """Prefix blocks of the prompt, one id per `block_size` tokens; equal ids mean equal token blocks."""
    block_size: NonNegInt = 0
    """Tokens per hash block (0 when the trace has no block hashes)."""
    server_time: Optional[NonNegFloat] = None
    """Recorded time the server took for this call, in seconds, if the trace has it."""
    sent_at: Optional[float] = None
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

    after_call: Annotated[int, Field(ge=-1)]
    """Index of the parent's call after whose end the sub-task starts (-1: at the parent's start)."""
    task: Task
    """The sub-agent's own task; its `arrival` is ignored (it starts at its spawn point)."""
    wait: bool = True
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
        shared = 0
        for a, b in zip(call.hash_ids, previous.hash_ids):
            if a != b:
                break
            shared += 1
        return max(0, call.input_tokens - shared * call.block_size)
    return max(0, call.input_tokens - previous.input_tokens)
