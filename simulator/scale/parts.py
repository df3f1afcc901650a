"""The shards' parts of a result folder: where each shard streams its records, and how the parts
become the folder's own files.

During a sharded run each shard writes its records as a single-process run does (`ResultWriter`:
flushed every 100 ms) into its part, ``shards/<i>/`` of the result folder (calls.jsonl, tasks.jsonl,
progress.json, histograms.json). A shard on another machine that does not see the result folder
writes them in its own temporary folder, and the run's driver copies what is new every half second
(`read_new`). So a shard that dies, or a driver that dies, loses nothing that was written.

At the end, `merge_parts` joins the parts into the folder's calls.jsonl and tasks.jsonl (merged by
end time, each line as the shard wrote it) and progress.json, then removes the parts' record files;
each part keeps its shard.json (what that shard did). When the driver died before that, the parts
are still there: ``python -m simulator.scale.parts FOLDER`` merges them, and `agentload report`
then rebuilds the summary from the records.
"""

from __future__ import annotations

import heapq
import secrets
import sys
from collections import Counter
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence

import orjson

from ..metrics import results
from ..metrics.records import TaskRecord
from ..workload import Task

SHARDS_DIR = "shards"
SHARD_FILE = "shard.json"
MARKER_FILE = "marker"
LOST = "shard_lost"
"""Error class of a task that was running in a shard that died."""
RECORD_FILES = (results.CALLS_FILE, results.TASKS_FILE)
MIRRORED = (*RECORD_FILES, results.PROGRESS_FILE, results.HISTOGRAMS_FILE)


def part_folder(folder: Path, index: int) -> Path:
    """Shard `index`'s part of the result folder."""
    return Path(folder) / SHARDS_DIR / str(index)


def mark(folder: Path) -> str:
    """Write a token under the result folder's shards/ and return it: a shard that reads the same token
    at that path sees the folder, and writes its part there."""
    token = secrets.token_hex(8)
    shards = Path(folder) / SHARDS_DIR
    shards.mkdir(parents=True, exist_ok=True)
    (shards / MARKER_FILE).write_text(token)
    return token


def sees(folder: Path, token: str) -> bool:
    """Whether this process sees the result folder that `mark` wrote `token` into."""
    try:
        return (Path(folder) / SHARDS_DIR / MARKER_FILE).read_text() == token
    except OSError:
        return False


def read_new(path: Path, offset: int) -> bytes:
    """The complete lines of a file from byte `offset` on (a line still being written is left for
    the next read); empty when there are none."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except FileNotFoundError:
        return b""
    end = data.rfind(b"\n")
    return data[: end + 1] if end >= 0 else b""


def _lines(path: Path) -> Iterator[bytes]:
    """The complete lines of a JSONL file (a last line cut short by a crash is left out)."""
    if not path.exists():
        return
    with open(path, "rb") as fh:
        for line in fh:
            if line.endswith(b"\n") and line.strip():
                yield line


def _end(line: bytes) -> float:
    return float(orjson.loads(line)["end"])


def merge_parts(folder: Path, count: int, *, keep: bool = False) -> int:
    """Join the `count` parts of `folder` into its calls.jsonl and tasks.jsonl (merged by end time)
    and progress.json (the top-level tasks the shards started, summed); returns that sum. Unless
    `keep`, the parts' record files are removed once merged."""
    folder = Path(folder)
    parts = [part_folder(folder, i) for i in range(count)]
    for name in RECORD_FILES:
        tmp = folder / (name + ".tmp")
        with open(tmp, "wb") as out:
            out.writelines(heapq.merge(*(_lines(p / name) for p in parts), key=_end))
        tmp.replace(folder / name)
    started = 0
    for part in parts:
        progress = results.read_json(part, results.PROGRESS_FILE) or {}
        started += int(progress.get("tasks_started") or 0)
    results.write_json(folder, results.PROGRESS_FILE, {"tasks_started": started})
    if not keep:
        for part in parts:
            for name in (*RECORD_FILES, results.PROGRESS_FILE, results.HISTOGRAMS_FILE):
                (part / name).unlink(missing_ok=True)
    return started


def lost_records(tasks: Sequence[Task], started: int, finished: Iterable[str], ok_calls: Counter,
                 at: float) -> list[TaskRecord]:
    """Records for a dead shard's top-level tasks that it had started (the first `started` of
    `tasks`, by arrival) and that never ended (not in `finished`): failed, error class `LOST`,
    ended at `at` (seconds since t0, when the shard was last heard from)."""
    done = set(finished)
    ordered = sorted(tasks, key=lambda t: t.arrival)
    return [TaskRecord(task_id=t.id, task_class=t.task_class, arrival=t.arrival, end=max(at, t.arrival), ok=False,
                       calls=ok_calls[t.id], calls_planned=len(t.calls), time_in_calls=0.0, time_in_gaps=0.0,
                       client_lag=0.0, error_class=LOST)
            for t in ordered[:started] if t.id not in done]


def append_tasks(part: Path, records: Iterable[TaskRecord]) -> None:
    """Append task records to a part's tasks.jsonl, after its last complete line (a line a killed
    shard left cut short is dropped: it is no record)."""
    path = Path(part) / results.TASKS_FILE
    if path.exists():
        with open(path, "rb+") as fh:
            data = fh.read()
            fh.truncate(data.rfind(b"\n") + 1)
    with open(path, "ab") as fh:
        for record in records:
            fh.write(results.record_line(record))


def unmerged(folder: Path) -> Optional[int]:
    """The number of parts of a sharded result folder whose parts were not merged (its driver died),
    else None."""
    shards = Path(folder) / SHARDS_DIR
    if not shards.is_dir() or (Path(folder) / results.CALLS_FILE).exists():
        return None
    return sum(1 for p in shards.iterdir() if p.is_dir() and p.name.isdigit())


def main(argv: Sequence[str]) -> int:
    """``python -m simulator.scale.parts FOLDER``: merge the parts a killed sharded run left."""
    if len(argv) != 1:
        print("usage: python -m simulator.scale.parts RESULT_FOLDER", file=sys.stderr)
        return 2
    count = unmerged(Path(argv[0]))
    if count is None:
        print(f"{argv[0]}: no unmerged shard parts", file=sys.stderr)
        return 2
    started = merge_parts(Path(argv[0]), count, keep=True)
    print(f"{argv[0]}: merged {count} parts ({started} tasks started); `agentload report` rebuilds the summary")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
