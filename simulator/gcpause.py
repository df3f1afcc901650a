"""Pausing Python's cyclic garbage collector while bulk data is built.

Importing or generating a workload creates millions of tuples and frozen dataclasses that hold no
reference cycles; each allocation burst would otherwise trigger collections over and over (25% to
3x slower) that can never free anything.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def gc_paused() -> Iterator[None]:
    """Disable the cyclic collector inside the block (re-enabled after, if it was on)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
