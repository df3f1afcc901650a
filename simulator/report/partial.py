"""How a report says that a result folder holds partial results: the run stopped before its end (the
drain limit, a signal, a crash whose summary was rebuilt from the records), and how many of its judged
tasks did not complete, in the summary's own counts."""

from __future__ import annotations

from typing import Optional

from ..metrics.summary import Summary

NOT_COMPLETED = (("failed", "failed"), ("cancelled", "cancelled"), ("interrupted", "interrupted"),
                 ("not_started", "not started"))
"""The summary's `TaskFigures` counts of judged tasks that did not complete, with their words."""


def is_partial(summary: Summary) -> bool:
    """Whether the run did not end as planned: marked partial, or stopped for another reason than
    completing (which a summary rebuilt from records says too)."""
    return summary.partial or summary.stop_reason != "completed"


def not_completed_text(summary: Summary) -> str:
    """'6 of 17 tasks cancelled, 2 not started' (the judged tasks that did not complete; empty when all
    did)."""
    tasks = summary.tasks
    parts = [f"{count:,} {word}" for count, word in
             ((getattr(tasks, key) or 0, word) for key, word in NOT_COMPLETED) if count]
    if not parts:
        return ""
    of = f" of {tasks.judged:,} tasks" if tasks.judged is not None else " tasks"
    head, *rest = parts
    count, word = head.split(" ", 1)
    return ", ".join([f"{count}{of} {word}", *rest])


def partial_state(summary: Summary) -> Optional[str]:
    """'PARTIAL (drain_timeout): 6 of 17 tasks cancelled' for a folder with partial results; None for a
    run that completed."""
    if not is_partial(summary):
        return None
    counts = not_completed_text(summary)
    return f"PARTIAL ({summary.stop_reason})" + (f": {counts}" if counts else "")
