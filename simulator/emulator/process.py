"""The emulator in a child process, off this process's event loop and CPU."""

from __future__ import annotations

import asyncio
import sys
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import AsyncIterator


@dataclass(frozen=True)
class EmulatorProcess:
    """An emulator running in a child process."""

    url: str
    pid: int


@asynccontextmanager
async def emulator_process(*cli_args: str, python: str = sys.executable) -> AsyncIterator[EmulatorProcess]:
    """Run ``agentload serve-emulator`` in a child process on a free loopback port for the duration
    of the block. `cli_args` are further command-line options, e.g. ``("--ttft", "0.05", "--itl",
    "0.01")``. Keeps the server off this process's event loop (and CPU)."""
    proc = await asyncio.create_subprocess_exec(
        python, "-m", "simulator", "serve-emulator", "--host", "127.0.0.1", "--port", "0", *cli_args,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        if " on http" not in line:
            raise RuntimeError(f"emulator did not start (exit code {await proc.wait()})")
        yield EmulatorProcess(url=line.rsplit(" ", 1)[1].strip(), pid=proc.pid)
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()
