"""What a result folder's run.json says of every run, however it ran: the planned counts, the
fingerprint of what was replayed, and the common tail (`run_info`); `simulator.pipeline.record` writes
it."""

from __future__ import annotations

import datetime as _dt
import hashlib
from typing import TYPE_CHECKING, Any, Mapping, Optional

import orjson

from .results import Window

if TYPE_CHECKING:
    from ..workload import Workload


def planned_counts(workload: Workload, window: Window = Window(), duration: Optional[float] = None) -> dict[str, Any]:
    """What the run means to do, as run.json and the summary's accounting hold it: the top-level tasks
    it will start (those arriving before `duration`, the run's `run.duration`, when set), their calls
    and sub-tasks, and `judged`: those tasks whose intended arrival is in the measurement `window` (in
    all and by task class), the tasks that a task SLO and the tasks' shares count."""
    calls = subtasks = 0
    by_class: dict[str, int] = {}
    tasks = [t for t in workload.tasks if duration is None or t.arrival < duration]
    for task in tasks:
        if window.contains(task.arrival):
            by_class[task.task_class] = by_class.get(task.task_class, 0) + 1
        for part in task.walk():
            calls += len(part.calls)
            subtasks += len(part.subtasks)
    return {"tasks": len(tasks), "calls": calls, "subtasks": subtasks, "judged": sum(by_class.values()),
            "judged_by_class": dict(sorted(by_class.items()))}


RUN_KEYS_OUTSIDE_FINGERPRINT = ("output", "scrape_interval", "workers")
"""Run settings that change where results go, how often /metrics is read or how many client processes
send the load, not the load replayed."""


def _digest(value: Any) -> str:
    """The SHA-256 of `value`'s JSON (orjson, keys sorted). A list or tuple (a workload's tasks) is
    hashed item by item, the same bytes as written whole, without holding the whole JSON at once
    (~200 MB for a workload of 16k calls of long prompts: its hash ids)."""
    from ..hash_ids import json_default  # noqa: PLC0415 - calls' hash ids may be shared views

    def dumps(item: Any) -> bytes:
        return orjson.dumps(item, default=json_default, option=orjson.OPT_SORT_KEYS)

    if type(value) not in (list, tuple):
        return "sha256:" + hashlib.sha256(dumps(value)).hexdigest()
    digest = hashlib.sha256()
    separator = b"["
    for item in value:
        digest.update(separator)
        digest.update(dumps(item))
        separator = b","
    digest.update(b"]" if value else b"[]")
    return "sha256:" + digest.hexdigest()


def fingerprint(workload: Workload, settings: Optional[Mapping[str, Any]] = None) -> dict[str, str]:
    """What a comparison checks before it compares two result folders: a digest of the tasks replayed
    (every task, call and sub-task field; not where the workload was read from), and, from the
    scenario's settings, one of the run settings that shape the replay and one of the SLO."""
    out = {"workload": _digest(workload.tasks)}
    if settings is not None:
        run = {k: v for k, v in (settings.get("run") or {}).items() if k not in RUN_KEYS_OUTSIDE_FINGERPRINT}
        out["run"] = _digest(run)
        out["slo"] = _digest(settings.get("slo") or {})
    return out


def run_info(what: Mapping[str, Any], window: Window, planned: Mapping[str, int],
             workload: Optional[Workload] = None) -> dict[str, Any]:
    """run.json: what ran (`what`, in its order), then when it started, the measurement window, the
    planned counts (what a summary rebuilt from the records needs) and, given the `workload`, its
    `fingerprint` (with the run and SLO settings of ``what["settings"]``)."""
    info = {
        **what,
        "started_at": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "window": {"start": window.start, "end": window.end},
        "planned": dict(planned),
    }
    if workload is not None:
        info["fingerprint"] = fingerprint(workload, what.get("settings"))
    return info
