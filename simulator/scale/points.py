"""Independent callables run as Ray tasks: a study's points (twin points always; live points when each
targets a server of its own), or anything else that needs no shared state.

    from simulator.scale.points import map_points

    outcomes = map_points(run_point, points, address=None, cpus_per_point=1, on_done=print)
    values = [o.value for o in outcomes if o.ok]

`fn` must be picklable by reference or by value (a module-level function, or a closure of picklable
values: Ray pickles it with cloudpickle) and so must each point and result; every Ray node needs
agentload installed. A point that raises, or whose worker dies, comes back as an outcome with its
error; the others are unaffected. A point is never retried (a live point is a measurement: running
it twice would measure twice).
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from . import connect, plain, ray_module


@dataclass(frozen=True)
class PointOutcome:
    """What one point gave: its value, or the error that ended it."""

    index: int
    """The point's position in the sequence given."""
    value: Any = None
    error: Optional[str] = None
    """The exception's type and message (and the point's traceback, when it raised)."""

    @property
    def ok(self) -> bool:
        return self.error is None


def _call(fn: Callable[[Any], Any], point: Any) -> tuple[bool, Any]:
    """Run one point in a Ray worker; its exception comes back as text (it may not pickle)."""
    try:
        return True, fn(point)
    except Exception as exc:  # noqa: BLE001 - the outcome carries it
        return False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"


def map_points(
    fn: Callable[[Any], Any],
    points: Iterable[Any],
    address: Optional[str] = None,
    *,
    cpus_per_point: float = 1.0,
    on_done: Optional[Callable[[PointOutcome], None]] = None,
) -> list[PointOutcome]:
    """Run ``fn(point)`` for every point as a Ray task on the cluster at `address` (None: the one this
    process is connected to, else RAY_ADDRESS, else a new local one), each reserving `cpus_per_point`
    CPUs (the cluster runs as many at once as its CPUs allow); `on_done` is told each outcome as it
    comes. Returns the outcomes in the points' order. Raises `InputError` when Ray is not installed."""
    ray = ray_module("running points on Ray")
    connected = connect(ray, address)
    try:
        task = ray.remote(num_cpus=cpus_per_point, max_retries=0)(_call)
        shared_fn = ray.put(fn)
        pending = {task.remote(shared_fn, point): i for i, point in enumerate(points)}
        outcomes: list[Optional[PointOutcome]] = [None] * len(pending)
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                index = pending.pop(ref)
                try:
                    ok, value = ray.get(ref)
                    outcome = PointOutcome(index, value) if ok else PointOutcome(index, error=value)
                except Exception as exc:  # noqa: BLE001 - a worker that died, a result that did not pickle
                    outcome = PointOutcome(index, error=f"{type(exc).__name__}: {plain(exc)[:500]}")
                outcomes[index] = outcome
                if on_done is not None:
                    on_done(outcome)
        return [o for o in outcomes if o is not None]
    finally:
        if connected:
            ray.shutdown()
