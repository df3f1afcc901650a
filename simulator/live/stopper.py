"""Stop signals during a live run (SIGINT, SIGTERM, SIGHUP): the run stops cleanly and keeps what it
measured; one before its result folder exists cancels the setup."""

from __future__ import annotations

import asyncio
import signal
from typing import Any, Callable, Optional

STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))
"""Signals that stop a run as Ctrl-C does: the partial summary is written."""


class RunAborted(Exception):
    """A stop signal came before the run's arrivals started: nothing was measured, no result folder."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name} before the run started")
        self.signum = signum


class Stopper:
    """SIGINT, SIGTERM and SIGHUP during a run: the first stops it as Ctrl-C does (arrivals stop, calls
    in flight are recorded as cancelled, the partial summary is written); a second one of the same
    signal acts as it would without agentload. One before the result folder is made cancels the setup
    (`RunAborted`); one after it, before the driver runs, stops the driver as it starts."""

    def __init__(self, on_signal: Optional[Callable[[int], None]]) -> None:
        self.driver: Optional[Any] = None
        """What to stop: a driver, or a sharded run's fleet (anything with `stop()`)."""
        self.folder_made = False
        self.signum: Optional[int] = None
        self._on_signal = on_signal
        self._main = asyncio.current_task()
        self._loop = asyncio.get_running_loop()
        self._installed: list[int] = []

    def install(self) -> None:
        for signum in STOP_SIGNALS:
            try:
                self._loop.add_signal_handler(signum, self._received, signum)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, no such signal
                continue
            self._installed.append(signum)

    def remove(self) -> None:
        for signum in self._installed:
            self._loop.remove_signal_handler(signum)
        self._installed.clear()

    def _received(self, signum: int) -> None:
        self._loop.remove_signal_handler(signum)
        self._installed.remove(signum)
        if self.signum is None:
            self.signum = signum
            if self._on_signal is not None:
                self._on_signal(signum)
        if self.driver is not None:
            self.driver.stop()
        elif not self.folder_made and self._main is not None:
            self._main.cancel()
