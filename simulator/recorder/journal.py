"""The recording file: agentload's JSONL of recorded calls, written line by line while traffic flows.

Line 1 of each file is a header (``{"agentload_recording": 1, ...}``: the hash scheme, the block size,
when the recording started, the upstream with its credentials masked, the segment number); every
other line is one finished call::

    {"task": "t3/s1", "i": 0, "parent": "t3", "after_call": 2, "t": 12.504, "end": 13.911, "ttft": 0.21,
     "input_tokens": 5120, "output_tokens": 96, "cached_tokens": 4096, "hash_ids": [...],
     "model": "m", "stop_reason": "stop", "api": "chat", "status": 200}

``t`` and ``end`` are seconds since the recording started (the request's arrival at the recorder and
its response's end). A line ``{"revise": "t3/s1", "parent": "t7", "after_call": 4}`` moves a sub-task
(and the sub-tasks under it) elsewhere (``"parent": null``: makes it a top-level task): the grouping
corrects a guess when later calls disprove it (`simulator.recorder.grouping`). ``hash_keep`` compacts ids as in the native format: the first `hash_keep` ids are
those of the previous call of the same (sub-)task in the same file. A call that failed has ``status``
(and ``error``) and no token counts. Nothing of a prompt's or an answer's content is written, nor any
header value.

Each line is written whole and flushed when its call ends, so the file can be read while it grows (by
`agentload trace inspect` and every other command: `simulator.traces.recording`), and a recorder killed
at any moment leaves every line it finished; `fsync_every` seconds the file is also synced to disk. With
rotation the recording goes on in a new file (``NAME.1.jsonl``, ``NAME.2.jsonl``, ...) once the current
one passes `rotate_bytes` or is `rotate_seconds` old; each file has its own header and no ``hash_keep``
across files, so each reads on its own, and a folder of them reads as one recording.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Optional, Sequence

import orjson

VERSION = 1


def segment_path(path: Path, n: int) -> Path:
    """The file of segment `n` (0: `path` itself)."""
    if n == 0:
        return path
    suffix = path.suffix or ".jsonl"
    return path.with_name(f"{path.stem if path.suffix else path.name}.{n}{suffix}")


class Journal:
    """Appends recorded calls to the recording file(s); see the module docstring."""

    def __init__(self, path: Path, header: dict[str, Any], rotate_bytes: Optional[int] = None,
                 rotate_seconds: Optional[float] = None, fsync_every: float = 1.0) -> None:
        self.path = Path(path)
        self.header = header
        self.rotate_bytes = rotate_bytes
        self.rotate_seconds = rotate_seconds
        self.fsync_every = fsync_every
        self.segment = -1
        self.lines = 0
        self.files: list[Path] = []
        self._last_ids: dict[str, Sequence[int]] = {}
        self._fh: Any = None
        self._syncer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentload-journal-sync")
        self._syncing: Optional[Future] = None
        self._opened = 0.0
        self._synced = 0.0
        self._size = 0
        self._open_next()

    def _open_next(self) -> None:
        if self._fh is not None:
            self._sync(wait=True)
            self._fh.close()
        self.segment += 1
        path = segment_path(self.path, self.segment)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Unbuffered binary: each line reaches the OS in one write, whole, when its call ends.
        self._fh = open(path, "wb", buffering=0)
        self.files.append(path)
        self._last_ids = {}
        self._opened = self._synced = time.monotonic()
        self._size = 0
        self._write({"agentload_recording": VERSION, **self.header, "segment": self.segment})

    def _write(self, line: dict[str, Any]) -> None:
        data = orjson.dumps(line) + b"\n"
        self._fh.write(data)
        self._size += len(data)

    def call(self, line: dict[str, Any], hash_ids: Sequence[int] = ()) -> None:
        """Write one finished call (`line` without its ids, which are given apart and compacted here)."""
        self._maybe_rotate()
        task = line["task"]
        if hash_ids:
            prev = self._last_ids.get(task)
            keep = _shared(prev, hash_ids) if prev else 0
            if keep:
                line["hash_keep"] = keep
            if len(hash_ids) > keep:
                line["hash_ids"] = list(hash_ids[keep:])
            self._last_ids[task] = hash_ids
        self._write(line)
        self.lines += 1
        now = time.monotonic()
        if self.fsync_every is not None and now - self._synced >= self.fsync_every:
            self._sync()

    def _maybe_rotate(self) -> None:
        if self.rotate_bytes is not None and self._size >= self.rotate_bytes:
            self._open_next()
        elif self.rotate_seconds is not None and time.monotonic() - self._opened >= self.rotate_seconds:
            self._open_next()

    def revision(self, task: str, parent: Optional[str], after_call: Optional[int]) -> None:
        """Write that (sub-)task `task` belongs under `parent` after its call `after_call` (no parent: a
        top-level task), whatever its first call's line said; the last revision of a task wins."""
        self._maybe_rotate()
        self._write({"revise": task, "parent": parent, "after_call": after_call if parent is not None else None})

    def forget(self, task: str) -> None:
        """Drop what is kept of a task that will not be written again (its last ids)."""
        self._last_ids.pop(task, None)

    def _sync(self, wait: bool = False) -> None:
        """Sync the file to disk: on the journal's own thread (an fsync can take milliseconds the proxy's
        event loop must not lose), or here and now when `wait` (a file being closed)."""
        self._synced = time.monotonic()
        if wait:
            if self._syncing is not None:
                self._syncing.result()
            _fsync(self._fh.fileno())
        elif self._syncing is None or self._syncing.done():
            self._syncing = self._syncer.submit(_fsync, self._fh.fileno())

    def close(self) -> None:
        """Sync and close the current file."""
        if self._fh is not None:
            self._sync(wait=True)
            self._fh.close()
            self._fh = None
        self._syncer.shutdown()


def _fsync(fd: int) -> None:
    try:
        os.fsync(fd)
    except OSError:
        pass  # a pipe or a file system without fsync: the lines are written all the same


def _shared(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common leading run of `a` and `b` (binary search: the ids are prefix ids, so once
    two differ every later pair differs too)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[mid - 1] == b[mid - 1]:
            lo = mid
        else:
            hi = mid - 1
    return lo
