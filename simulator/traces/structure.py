"""Prefix hash ids from the structure of a conversation, for traces that give token counts only.

An agent loop keeps one growing context: each call sends the previous call's prompt, the previous
call's answer, and what came back from tools or the user. Under that assumption (`assume_append_only`)
a call's prompt starts with the previous call's prompt, so its hash ids start with the previous call's
ids (all of its full blocks) and continue with new ones for the rest: the previous answer, which a
replay's server regenerates differently and so can never serve from cache, and what was appended.

The counts say where the assumption holds. Of each call after the first of a (sub-)task:

- *fits*: its prompt holds at least the previous prompt plus the previous output;
- *grew by less than the previous output*: the previous prompt still fits (the answer was shortened in
  the history, as agents do with reasoning tokens), so the previous prompt is still taken as its prefix;
- *shrank*: the prompt is shorter than the previous one, so something was removed (the context was
  compacted, or a new conversation began): the call gets all new ids, and the calls after it chain on it.

A first call gets new ids; sub-tasks chain within themselves, not with their parent. A (sub-)task whose
calls already carry hash ids (recorded, or derived from content) is left as it is. New ids come from one
counter for the whole workload, in a namespace named after its sources (`simulator.traces.prefix`), so
tasks share nothing (the counts cannot say what two conversations have in common), and workloads
converted from different files do not collide when replayed together.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterator, Optional

from ..workload import Call, Provenance, Task, Workload
from .prefix import extend_prefix, fresh_ids

DEFAULT_BLOCK_SIZE = 16
"""Tokens per block of structure-derived ids: vLLM's default KV block size (and the emulator's)."""
OPTION = "assume_append_only"
"""The name of the option, in provenance options and the scenario's `workload` section."""


@dataclass
class AppendOnlyCounts:
    """How the calls of a workload fared under the append-only assumption."""

    tasks: int = 0
    """(Sub-)tasks given ids."""
    first_calls: int = 0
    """First calls of those (sub-)tasks (all new ids)."""
    fits: int = 0
    """Calls whose prompt holds at least the previous prompt and output."""
    trimmed: int = 0
    """Calls that grew by less than the previous output (previous prompt kept as the prefix)."""
    shrank: int = 0
    """Calls whose prompt is shorter than the previous one (all new ids)."""
    recorded: int = 0
    """(Sub-)tasks left as they were because their calls already carry hash ids."""

    def note(self, block_size: int) -> str:
        """One line for the workload's provenance."""
        later = self.fits + self.trimmed + self.shrank
        text = (f"hash ids assumed from an append-only context (block size {block_size}) for {self.tasks} "
                f"(sub-)tasks: of {later} calls after a first call, {self.fits} fit (prompt >= previous prompt + "
                f"output), {self.trimmed} grew by less than the previous output (previous prompt kept as prefix), "
                f"{self.shrank} broke it (prompt shrank: compaction or a new conversation; new ids from there)")
        if self.recorded:
            text += f"; {self.recorded} (sub-)tasks already had hash ids and kept them"
        return text


def _task(task: Task, block_size: int, counts: AppendOnlyCounts, fresh: Iterator[int]) -> Task:
    subtasks = tuple(dataclasses.replace(s, task=_task(s.task, block_size, counts, fresh)) for s in task.subtasks)
    if not task.calls:
        return dataclasses.replace(task, subtasks=subtasks)
    if any(c.hash_ids for c in task.calls):
        counts.recorded += 1
        return dataclasses.replace(task, subtasks=subtasks)
    counts.tasks += 1
    calls = []
    previous: Optional[Call] = None
    ids: tuple[int, ...] = ()
    for call in task.calls:
        if previous is None:
            counts.first_calls += 1
            reused = 0
        elif call.input_tokens >= previous.input_tokens + previous.output_tokens:
            counts.fits += 1
            reused = previous.input_tokens
        elif call.input_tokens >= previous.input_tokens:
            counts.trimmed += 1
            reused = previous.input_tokens
        else:
            counts.shrank += 1
            reused = 0
        ids = extend_prefix(ids, reused, call.input_tokens, block_size, fresh)
        calls.append(dataclasses.replace(call, hash_ids=ids, block_size=block_size if ids else 0))
        previous = call
    return dataclasses.replace(task, calls=tuple(calls), subtasks=subtasks)


def assume_append_only(workload: Workload, block_size: int = DEFAULT_BLOCK_SIZE) -> tuple[Workload, AppendOnlyCounts]:
    """The workload with hash ids derived from the append-only assumption (see the module doc), and how its
    calls fared. The provenance records the option and a note."""
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    counts = AppendOnlyCounts()
    fresh = fresh_ids("append-only:" + ",".join(p.source for p in workload.provenance))
    tasks = tuple(_task(t, block_size, counts, fresh) for t in workload.tasks)
    provenance = workload.provenance or (Provenance("?", "?"),)
    first = provenance[0]
    first = dataclasses.replace(first, options={**first.options, OPTION: True},
                                notes=first.notes + (counts.note(block_size),))
    rest = tuple(dataclasses.replace(p, options={**p.options, OPTION: True}) for p in provenance[1:])
    return Workload(tasks, (first,) + rest), counts

