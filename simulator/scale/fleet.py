"""The shards of one sharded run as Ray actors, seen from the run's own process: created, brought to
a barrier, started at one wall-clock t0, watched (counters polled, parts of shards on other machines
copied), stopped; each one's result or the error that ended it."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ..errors import InputError
from ..metrics.results import LiveCounters
from . import parts, plain
from .shard import Shard, ShardResult, ShardSpec

START_MARGIN = 1.0
"""Seconds from the barrier to t0: for the start message to reach every shard and each to open its
warm pool (a shard that gets there late shows it as client lag and in its ``start_ahead_ms``)."""
READY_TIMEOUT = 300.0
"""Most seconds the shards may take to be created and set up."""
WATCH = 0.5
"""Seconds between two polls of the shards."""
CPUS_PER_SHARD = 1


@dataclasses.dataclass
class Member:
    """One shard as the driver follows it."""

    index: int
    actor: Any
    spec: ShardSpec
    run: asyncio.Future
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    progress: dict[str, Any] = dataclasses.field(default_factory=dict)
    heard: float = 0.0
    """Seconds since t0 when the shard last answered."""
    result: Optional[ShardResult] = None
    error: Optional[str] = None
    offsets: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def running(self) -> bool:
        return self.result is None and self.error is None


class Fleet:
    """The shards of one run as Ray actors: created, brought to the barrier, started, watched, stopped."""

    def __init__(self, ray: Any, specs: Sequence[ShardSpec]) -> None:
        self.ray = ray
        name = f"agentload-{specs[0].token}"
        actor_class = ray.remote(Shard)
        self.members: list[Member] = []
        for spec in specs:
            actor = actor_class.options(num_cpus=CPUS_PER_SHARD, max_concurrency=8, max_restarts=0,
                                        name=f"{name}-shard-{spec.index}").remote(spec.index)
            self.members.append(Member(spec.index, actor, spec, _future(actor.run.remote(spec))))
        self.t0_wall: Optional[float] = None
        self.stopped = False

    async def ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Wait until every shard is set up (the barrier), or has ended after a stop; raises
        `ShardError` when one failed or time ran out."""
        waits = {_future(m.actor.wait_ready.remote(timeout)): m for m in self.members}
        runs = {m.run: m for m in self.members}
        pending = set(waits) | set(runs)
        deadline = time.monotonic() + timeout
        while any(not m.info and not m.run.done() for m in self.members):
            left = deadline - time.monotonic()
            done, pending = await asyncio.wait(pending, timeout=max(0.0, left), return_when=asyncio.FIRST_COMPLETED)
            if not done:
                break
            for future in done:
                if future in waits:
                    if future.exception() is None and future.result() is not None:
                        waits[future].info = future.result()
                elif not self.stopped:  # a shard's run ended before the barrier: it failed
                    raise ShardError(f"shard {runs[future].index} failed to set up: {_reason(future)}")
        missing = [m.index for m in self.members if not m.info and not m.run.done()]
        if missing:
            raise ShardError(f"shards {missing} were not ready within {timeout:g} s (each takes "
                             f"{CPUS_PER_SHARD} CPU of the Ray cluster; see `ray status`)")

    def start(self) -> float:
        """Send every shard the same start time (none after a stop: they end without starting);
        returns it (wall clock, `time.time()`)."""
        self.t0_wall = time.time() + START_MARGIN
        if not self.stopped:
            for m in self.members:
                m.actor.start.remote(self.t0_wall)
        return self.t0_wall

    def stop(self) -> None:
        """Stop every shard (Ctrl-C, SIGTERM): arrivals stop, calls in flight are recorded as cancelled."""
        self.stopped = True
        for m in self.members:
            if m.running:
                m.actor.stop.remote()

    def now(self) -> float:
        """Seconds since t0."""
        return time.time() - self.t0_wall if self.t0_wall is not None else 0.0

    async def watch(self, on_tick: Callable[[], None]) -> None:
        """Follow the shards until every one has ended or died: results collected, counters polled, the
        parts of shards that do not see the result folder copied; `on_tick` after each poll."""
        while any(m.running for m in self.members):
            running = {m.run: m for m in self.members if m.running}
            done, _ = await asyncio.wait(set(running), timeout=WATCH)
            for future in done:
                self._ended(running[future], future)
            await self._poll()
            on_tick()
        await self._mirror(final=True)

    def _ended(self, member: Member, future: asyncio.Future) -> None:
        if future.exception() is None:
            member.result = future.result()
            member.heard = max(member.heard, member.result.end)
        else:
            member.error = _reason(future)

    async def _poll(self) -> None:
        alive = [m for m in self.members if m.running]
        asks = {_future(m.actor.progress.remote()): m for m in alive}
        if asks:
            done, _ = await asyncio.wait(set(asks), timeout=WATCH)
            for future in done:
                if future.exception() is None:
                    member = asks[future]
                    member.progress = future.result()
                    if member.progress.get("elapsed") is not None:
                        member.heard = max(member.heard, member.progress["elapsed"])
        await self._mirror()

    async def _mirror(self, final: bool = False) -> None:
        """Copy what is new in the parts of shards that write elsewhere (on another machine)."""
        for m in self.members:
            if m.info.get("shared", True) or (m.error is not None and not final):
                continue
            try:
                new = await _future(m.actor.read_new.remote(m.offsets))
            except Exception:  # noqa: BLE001 - a dead shard's part is what was copied so far
                continue
            part = Path(m.spec.part)
            part.mkdir(parents=True, exist_ok=True)
            for name, data in new.items():
                if name in parts.RECORD_FILES:
                    if data:
                        with open(part / name, "ab") as fh:
                            fh.write(data)
                        m.offsets[name] = m.offsets.get(name, 0) + len(data)
                elif data:
                    (part / name).write_bytes(data)

    def counters(self) -> tuple[int, int, LiveCounters]:
        """(tasks started, tasks in flight, counters) summed over the shards' last answers."""
        total = LiveCounters()
        started = in_flight = 0
        for m in self.members:
            p = m.progress
            started += p.get("started", 0)
            in_flight += p.get("in_flight", 0) if m.running else 0
            for name in ("tasks_done", "tasks_failed", "calls_ok", "calls_failed", "output_tokens"):
                setattr(total, name, getattr(total, name) + p.get(name, 0))
            total.errors.update(p.get("errors", {}))
        return started, in_flight, total

    def kill(self) -> None:
        """End the actors (their CPUs go back to the cluster)."""
        for m in self.members:
            try:
                self.ray.kill(m.actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass


class ShardError(InputError):
    """Shards could not be set up or started (before anything was measured)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, file="Ray cluster")


def _future(ref: Any) -> asyncio.Future:
    return asyncio.wrap_future(ref.future())


def _reason(future: asyncio.Future) -> str:
    exc = future.exception()
    return f"{type(exc).__name__}: {plain(exc)[:300]}"
