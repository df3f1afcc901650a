"""One shard of a sharded run: a Ray actor (`Shard`) that replays its part of the workload in its own
event loop, with its own HTTP client and prompt builder, through the same driver as a single-process
run.

The actor is threaded: `run` holds one thread for the whole replay (its own asyncio loop, as `agentload run`
has), while the run's driver calls `wait_ready`, `start`, `progress`, `read_new` and `stop` on others.
A shard's life:

1. `run(spec)`: the client is set up (model, chat calibration) and the bodies of the first second of
   arrivals are built; then the shard is ready and waits.
2. `start(t0)`: t0 is a wall-clock time (`time.time()`) a little ahead, the same for every shard;
   the shard opens its warm pool, then converts t0 to its own `time.perf_counter` (a per-process
   clock) and its driver starts there, so every shard's schedule and records share one zero.
3. The replay streams records into the shard's part (`simulator.scale.parts`), feeding the shard's
   `RunTally` as they finish; `run` returns a `ShardResult` with the tally packed
   (`simulator.scale.merge`) and the live ITL histogram encoded, and what the shard cost.
"""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..metrics import histograms
from ..metrics.results import ResultWriter, Window
from ..metrics.slo import Slo
from ..metrics.tally import RunTally
from ..workload import Workload
from . import merge, parts


@dataclass(frozen=True)
class ShardSpec:
    """What one shard replays and how (built by the run's driver)."""

    index: int
    workload: Workload
    target: Any
    """The `simulator.live.client.Target` (with the API key: given to `run`, never to the actor's
    constructor, which Ray keeps in its control store)."""
    seed: int
    driver: dict[str, Any]
    """`simulator.task_run.driver_settings`, with this shard's share of `max_in_flight`."""
    window: Window
    slo: Slo
    part: str
    """This shard's part folder as the driver sees it; used when the shard sees it too (`token`)."""
    token: str
    warm: int
    """Connections to open before the start."""


@dataclass
class ShardResult:
    """What a shard did: how it ended, its tally (packed), and its cost."""

    index: int
    host: str
    pid: int
    part: str
    """Where the shard wrote its records (its own temporary folder when it did not see the result folder)."""
    shared: bool
    stop_reason: str
    tasks: int
    tasks_started: int
    end: float
    tally: merge.Packed
    itl: bytes
    """The live ITL histogram, encoded."""
    cpu_s: float
    """CPU seconds of the shard's process (its loop, and Ray's threads) over the replay."""
    loop_cpu_s: float
    """CPU seconds of the thread running the event loop."""
    wall_s: float
    loop_wait_s: Optional[float]
    """Seconds the event loop's thread was ready to run but waited for a CPU (Linux; None elsewhere):
    a large share of `wall_s` means other processes took the machine, and timings carry that."""
    connections_warm: int
    connections_opened: int
    bodies_prepared: int
    start_late_s: float
    """Seconds after t0 when the shard's driver was ready to start: negative, that long ahead; positive,
    the start came late (the warm pool took longer than the margin, or the message came late), and the
    first calls show it as client lag."""
    counters: dict[str, Any] = field(default_factory=dict)


class Shard:
    """A shard of a run; Ray makes it an actor (`simulator.scale.fleet`). See the module docstring."""

    def __init__(self, index: int) -> None:
        self.index = index
        self._ready = threading.Event()
        self._info: dict[str, Any] = {}
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._start: Optional[asyncio.Future] = None
        self._driver: Any = None
        self._writer: Optional[ResultWriter] = None
        self._stop_asked = False
        self._part: Optional[Path] = None

    # --- called by the run's driver, each on a thread of its own -----------------------------------

    def run(self, spec: ShardSpec) -> ShardResult:
        """Replay the shard's part of the workload (returns once it ended or was stopped)."""
        with asyncio.Runner() as runner:
            return runner.run(_main(self, spec))

    def wait_ready(self, timeout: float) -> Optional[dict[str, Any]]:
        """Block until the shard is ready to start (returns where it is and where it writes), or None
        after `timeout` seconds."""
        return dict(self._info) if self._ready.wait(timeout) else None

    def start(self, t0_wall: float) -> None:
        """Start the replay at the wall-clock time `t0_wall` (`time.time()`)."""
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(self._started, t0_wall)

    def stop(self) -> None:
        """Stop as Ctrl-C stops a run: arrivals stop, calls in flight are recorded as cancelled."""
        self._stop_asked = True
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(self._stop_in_loop)

    def progress(self) -> dict[str, Any]:
        """Counters for the live display and the run's watch (read without locking: a snapshot)."""
        driver, writer = self._driver, self._writer
        if driver is None or writer is None:
            return {"started": 0, "in_flight": 0, "elapsed": None}
        c = writer.counters
        return {"elapsed": driver.now(), "started": driver.started, "in_flight": driver.in_flight,
                "tasks_done": c.tasks_done, "tasks_failed": c.tasks_failed, "calls_ok": c.calls_ok,
                "calls_failed": c.calls_failed, "output_tokens": c.output_tokens, "errors": dict(c.errors)}

    def read_new(self, offsets: dict[str, int]) -> dict[str, bytes]:
        """What is new in this shard's part files since `offsets` (bytes read per file name): complete
        lines of the record files, the whole of the JSON ones. For a shard that does not see the result
        folder, the driver keeps a copy this way."""
        part = self._part
        if part is None:
            return {}
        out = {}
        for name in parts.MIRRORED:
            if name in parts.RECORD_FILES:
                out[name] = parts.read_new(part / name, offsets.get(name, 0))
            else:
                try:
                    out[name] = (part / name).read_bytes()
                except OSError:
                    out[name] = b""
        return out

    # --- on the shard's own loop --------------------------------------------------------------------

    def _started(self, t0_wall: float) -> None:
        if self._start is not None and not self._start.done():
            self._start.set_result(t0_wall)

    def _stop_in_loop(self) -> None:
        if self._driver is not None:
            self._driver.stop()
        elif self._start is not None and not self._start.done():
            self._start.set_result(None)

    def _where(self, spec: ShardSpec) -> tuple[Path, bool]:
        """The part folder: the result folder's when this process sees it, else a temporary one."""
        part = Path(spec.part)
        if parts.sees(part.parent.parent, spec.token):
            return part, True
        return Path(tempfile.gettempdir()) / "agentload-shards" / spec.token / str(spec.index), False


# The replay's coroutines are functions, not methods of `Shard`: Ray makes a class with any async
# method an asyncio actor, whose methods all run on Ray's own loop, and a shard runs its own.


async def _main(shard: Shard, spec: ShardSpec) -> ShardResult:
    """Set up (client, first bodies), report ready, wait for the start, replay."""
    from ..live.ahead import get_ready  # noqa: PLC0415 - the actor imports the live stack itself
    from ..live.client import Client
    from ..live.prompts import PromptBuilder

    shard._loop = asyncio.get_running_loop()
    shard._start = shard._loop.create_future()
    part, shared = shard._where(spec)
    part.mkdir(parents=True, exist_ok=True)
    shard._part = part
    target = spec.target
    prompts = PromptBuilder(vocab_size=target.vocab_size, share_prefixes=target.share_prefixes, seed=spec.seed)
    async with Client(target, time.perf_counter(), prompts) as client:
        await client.setup()
        ahead = await get_ready(client, spec.workload, warm=0)
        shard._info = {"host": socket.gethostname(), "pid": os.getpid(), "part": str(part), "shared": shared}
        shard._ready.set()
        if shard._stop_asked:
            shard._stop_in_loop()
        t0_wall = await shard._start
        return await _replay(shard, spec, client, ahead, part, shared, t0_wall)


async def _replay(shard: Shard, spec: ShardSpec, client: Any, ahead: Any, part: Path, shared: bool,
                  t0_wall: Optional[float]) -> ShardResult:
    """Open the warm pool, start at `t0_wall` (None: stopped before the start, nothing is started)
    and replay the shard's tasks into its part."""
    from ..live.driver import Driver  # noqa: PLC0415

    tally = RunTally(spec.window, spec.slo)
    warm = await client.warm(spec.warm) if t0_wall is not None else 0
    # time.time() agrees across processes (and, NTP-synced, across machines); perf_counter does not
    t0 = time.perf_counter() + ((t0_wall if t0_wall is not None else time.time()) - time.time())
    client.t0 = t0
    cpu0, thread0, wall0, wait0 = time.process_time(), time.thread_time(), time.perf_counter(), run_queue_seconds()
    with ResultWriter(part, spec.window, sinks=(tally,)) as writer:
        driver = Driver(client, spec.workload, writer, t0=t0, on_start=writer.started, **spec.driver)
        shard._writer, shard._driver = writer, driver
        if t0_wall is None or shard._stop_asked:
            driver.stop()
        late = driver.now()
        async with ahead.running(driver.now):
            outcome = await driver.run()
        writer.close()
    c = writer.counters
    return ShardResult(
        index=spec.index, host=shard._info["host"], pid=shard._info["pid"], part=str(part), shared=shared,
        stop_reason=outcome.stop_reason, tasks=len(spec.workload.tasks), tasks_started=outcome.tasks_started,
        end=outcome.end, tally=merge.pack(tally), itl=writer.itl.encode(),
        cpu_s=time.process_time() - cpu0, loop_cpu_s=time.thread_time() - thread0,
        wall_s=time.perf_counter() - wall0, loop_wait_s=_since(wait0, run_queue_seconds()), connections_warm=warm,
        connections_opened=client.connections_opened, bodies_prepared=ahead.prepared, start_late_s=late,
        counters={"calls_ok": c.calls_ok, "calls_failed": c.calls_failed, "output_tokens": c.output_tokens,
                  "tasks_done": c.tasks_done, "tasks_failed": c.tasks_failed},
    )


def run_queue_seconds() -> Optional[float]:
    """Seconds this thread has been ready to run but waiting for a CPU (/proc/thread-self/schedstat,
    Linux), or None where there is no such file."""
    try:
        with open("/proc/thread-self/schedstat") as fh:
            return int(fh.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def _since(start: Optional[float], end: Optional[float]) -> Optional[float]:
    return None if start is None or end is None else end - start


def decode_itl(encoded: bytes) -> Any:
    """A shard's live ITL histogram from its encoded form."""
    from hdrh.histogram import HdrHistogram  # noqa: PLC0415

    return HdrHistogram.decode(encoded) if encoded else histograms.new_histogram()
