"""Scale-out on Ray: one run's tasks sharded over Ray actors, and independent callables run as Ray tasks.

- `runner.run_sharded`: `agentload run SCENARIO --ray [ADDRESS]`: the workload's top-level tasks (each
  with its sub-agents) split over shards (`plan`), each a Ray actor with its own event loop, HTTP
  client and prompt builder (`shard`), created, started at one time and watched by the run (`fleet`);
  each shard's records streamed to its own part of the result folder (`parts`); the shards' tallies
  merged from HdrHistograms' encoded form (`merge`) into one summary of the same form as a
  single-process run's, with a line per shard (`report`).
- `points.map_points`: independent callables (a study's points) run as Ray tasks.

Ray is an optional extra (``pip install 'agentload[ray]'``); `ray_module` imports it or says how to
get it.
"""

from __future__ import annotations

import logging
import os
import re
from types import ModuleType
from typing import Any, Optional

from ..errors import InputError

INSTALL_HINT = "pip install 'agentload[ray]'"


def ray_module(what: str = "--ray") -> ModuleType:
    """The `ray` module, or an `InputError` saying how to install it."""
    # Ray's C++ core installs a crash handler for SIGTERM in the driver process too, where the run's
    # own handler must stop the shards and write the summary (read when ray is first imported).
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    try:
        import ray  # noqa: PLC0415 - an optional extra
    except ImportError:
        raise InputError(f"{what} needs Ray, which is not installed here; install it with: {INSTALL_HINT}",
                         field=what) from None
    return ray


def connect(ray: Any, address: Optional[str]) -> bool:
    """Connect this process to the Ray cluster at `address` (None: the one it has, else RAY_ADDRESS or
    a cluster started with `ray start` on this machine, else a new local one); returns whether this
    call connected (and the caller must disconnect with ``ray.shutdown()``)."""
    if ray.is_initialized():
        return False
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        raise InputError(f"cannot connect to Ray at {address or 'a local cluster'}: {exc}", field="--ray") from None
    return True


_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


def plain(exc: BaseException) -> str:
    """An exception's text on one line, without the terminal colours Ray puts in its errors."""
    return " ".join(_COLOUR.sub("", str(exc)).split())
