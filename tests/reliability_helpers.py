"""Helpers of the reliability, fault and secrets tests: an emulator in a thread of its own (so that
`agentload run` can run in the test's main thread with its own event loop), an emulator child process
on a fixed port (to be killed), small workloads and scenario files."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

from simulator.emulator.server import Emulator
from simulator.emulator.settings import EmulatorSettings
from simulator.traces.native import write
from simulator.workload import Call, SubTask, Task, Workload

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def emulator_thread(**settings: Any) -> Iterator[Emulator]:
    """An `Emulator` serving from its own thread and event loop; yields it (its `url` set). Its counters
    are read once the block ends (the thread has stopped)."""
    emulator = Emulator(EmulatorSettings(**settings))
    ready = threading.Event()
    loop = asyncio.new_event_loop()
    stop: Optional[asyncio.Future] = None

    async def serve() -> None:
        nonlocal stop
        stop = loop.create_future()
        await emulator.start()
        ready.set()
        await stop
        await emulator.stop()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(30), "the emulator did not start"
    try:
        yield emulator
    finally:
        loop.call_soon_threadsafe(stop.set_result, None)  # type: ignore[union-attr]
        thread.join(30)
        loop.close()


class EmulatorChild:
    """``agentload serve-emulator`` as a child process on `port`, to be killed and started again."""

    def __init__(self, port: int, *args: str) -> None:
        self.port = port
        self.args = args
        self.url = f"http://127.0.0.1:{port}"
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> "EmulatorChild":
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "simulator", "serve-emulator", "--port", str(self.port), *self.args],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        assert " on http" in line, f"emulator did not start: {line!r}"
        return self

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + "/agentload/stats", timeout=10) as resp:
            return json.loads(resp.read())

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


def workload(tasks: int = 4, calls: int = 3, out: int = 6, gap: float = 0.01, every: float = 0.02,
             subtasks: bool = True) -> Workload:
    """`tasks` tasks of `calls` calls in two classes, the first two with a sub-agent."""
    out_tasks = []
    for i in range(tasks):
        chain = tuple(Call(input_tokens=64 * (j + 2), output_tokens=out, gap=gap if j else 0.0,
                           hash_ids=tuple(range(j + 2)), block_size=64) for j in range(calls))
        subs = ()
        if subtasks and i < 2:
            subs = (SubTask(0, Task(f"t{i}-sub", (Call(input_tokens=80, output_tokens=4),)), wait=i % 2 == 0),)
        out_tasks.append(Task(f"t{i}", chain, arrival=every * i, task_class="odd" if i % 2 else "even", subtasks=subs))
    return Workload(tuple(out_tasks))


def scenario_file(tmp_path: Path, text: str, load: Optional[Workload] = None) -> Path:
    """A scenario YAML (`text`, without the workload) replaying `load` (default: `workload()`)."""
    write(load or workload(), tmp_path / "load.jsonl")
    path = tmp_path / "scenario.yaml"
    path.write_text("workload: {trace: load.jsonl}\n" + text)
    return path


def run_cli(*args: str, env: Optional[dict[str, str]] = None, cwd: Optional[Path] = None) -> subprocess.Popen:
    """``agentload`` in a child process (stdout and stderr piped)."""
    return subprocess.Popen([sys.executable, "-m", "simulator", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}, cwd=cwd)


def wait_for(condition, timeout: float = 120.0, every: float = 0.02, proc: Optional[subprocess.Popen] = None) -> None:
    """Poll `condition()` until it holds (an observable state, not a guess at how long things take);
    fails at once when `proc` has exited meanwhile."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the process exited ({proc.returncode}): {proc.stderr.read() if proc.stderr else ''}")
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(every)


def lines(path: Path) -> int:
    """Complete lines of a file (0 when it does not exist)."""
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0
