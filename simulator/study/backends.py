"""A config as something that runs points: the twin of a profile, or a live target (a server agentload
launches and watches, an existing URL, the built-in emulator).

A launched server starts on the first point (`ensure`), its log in the study folder (servers/NAME.log,
NAME.2.log after a restart); a point during which it exits fails with its exit code and last log lines
(its records stay in the point's folder), and the next point starts it again. `close` stops it:
SIGTERM, then SIGKILL after the config's stop timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from ..behaviour import CallRequest
from ..emulator.settings import section_of
from ..errors import InputError
from ..live.client import Client, PreflightError, Target
from ..pipeline.live import run_scenario
from ..live.stopper import RunAborted
from ..live.vllm.server import ServerError, ServerProcess, VLLMServer
from ..metrics.summary import Summary
from ..pipeline.execute import execute
from ..pipeline.plan import plan_run
from ..scenario import Scenario, TargetSpec
from ..scenario.fleet import FleetSpec
from ..sim.profile import ServerProfile
from ..pipeline.twin import TwinExecutor
from ..workload import Workload
from .configs import Config

WATCH_INTERVAL_S = 0.5
"""How often a launched server is checked during a point."""


class PointError(RuntimeError):
    """A point could not run, or its server failed during it."""


class TwinBackend:
    """A config on the server twin: each point simulated (a fleet config's on as many replica twins of
    `profile` behind the twin's model of its router, `simulator.pipeline.fleet_twin`)."""

    live = False

    def __init__(self, profile: ServerProfile, fleet: Optional[FleetSpec] = None) -> None:
        self.profile = profile
        self.fleet = fleet

    def ensure(self) -> float:
        """Nothing to start; 0 seconds."""
        return 0.0

    def run_point(self, scenario: Scenario, workload: Workload, folder: Path) -> Summary:
        """Simulate the point into `folder` (its scenario's `fleet` this config's, or none)."""
        scenario = scenario.model_copy(update={"fleet": self.fleet})
        executor: Any = TwinExecutor(self.profile, keep_gaps=False)
        if self.fleet is not None:
            from ..pipeline.fleet_twin import FleetTwinExecutor  # noqa: PLC0415 - the fleet's twin, only when used

            executor = FleetTwinExecutor(self.fleet, self.profile, keep_gaps=False)
        summary, _ = execute(plan_run(scenario, workload, folder), executor)
        return summary

    def server_info(self) -> Optional[dict[str, Any]]:
        """No server: None."""
        return None

    def close(self) -> None:
        """Nothing to stop."""


class LiveBackend:
    """A config with a server on the other end of HTTP."""

    live = True

    def __init__(self, config: Config, target: dict[str, Any], study_dir: Path,
                 warmup: Sequence[CallRequest] = ()) -> None:
        self.config = config
        self.warmup = list(warmup)
        """Calls sent to a newly started server before its first point."""
        self.target_fields = target
        """TargetSpec fields other than base_url (from the scenario and the study)."""
        self.study_dir = study_dir
        self.server: Optional[ServerProcess] = None
        self.starts = 0
        self.startup_s: Optional[float] = None
        self.log: Optional[Path] = None
        self.start_failed: Optional[str] = None
        """Why the last start failed; the config's later points fail at once instead of waiting again."""

    def ensure(self) -> float:
        """Start the config's server when it is launched and not running; the seconds it took.
        PointError when it cannot start."""
        if not self.config.launched or (self.server is not None and self.server.running()):
            return 0.0
        if self.start_failed is not None:
            raise PointError(f"server not started again (it failed to start before): {self.start_failed}")
        began = time.perf_counter()
        if self.server is not None:
            self.server.stop(self._stop_timeout())
        self.starts += 1
        self.log = self.study_dir / "servers" / (f"{self.config.name}.log" if self.starts == 1
                                                 else f"{self.config.name}.{self.starts}.log")
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.server = self._make_server(self.log)
        try:
            self.server.start()
        except ServerError as exc:
            self.start_failed = str(exc).splitlines()[0]
            raise PointError(f"server did not start: {exc}") from None
        self.startup_s = self.server.startup_seconds
        self.start_failed = None
        if self.warmup:
            self._warm_up()
        return time.perf_counter() - began

    def _make_server(self, log: Path) -> ServerProcess:
        c = self.config
        if c.vllm is not None:
            v = c.vllm
            server: ServerProcess = VLLMServer(v.model, python=v.python, extra_args=v.args, env=v.env,
                                               startup_timeout_s=v.startup_timeout, log_path=log)
        else:
            s = c.server
            assert s is not None
            server = ServerProcess(s.argv, port=s.port, host=s.host, env=s.env, cwd=s.cwd, health_path=s.health,
                                   startup_timeout_s=s.startup_timeout, log_path=log, name="server")
        server.name = f"server of config {c.name}"
        return server

    def _stop_timeout(self) -> float:
        c = self.config
        return (c.vllm or c.server).stop_timeout if (c.vllm or c.server) else 20.0

    def base_url(self) -> Optional[str]:
        """The URL of the config's server (None for the built-in emulator, started per point)."""
        if self.config.kind == "url":
            return self.config.url
        return self.server.base_url if self.server is not None else None

    def target_spec(self) -> Optional[TargetSpec]:
        """The scenario's target for this config (None: the built-in emulator)."""
        url = self.base_url()
        if url is None:
            return None
        fields = dict(self.target_fields)
        if self.config.model:
            fields["model"] = self.config.model
        try:
            return TargetSpec(base_url=url, **fields)
        except ValueError as exc:
            raise InputError(f"config {self.config.name}: bad target settings: {exc}", path="target") from None

    def client_target(self) -> Optional[Target]:
        """The HTTP client's target for this config (None: the built-in emulator)."""
        spec = self.target_spec()
        if spec is None:
            return None
        api_key = os.environ.get(spec.api_key_env) if spec.api_key_env else None
        return Target(api_key=api_key, **spec.client_fields())

    def _warm_up(self) -> None:
        """Send the warm-up calls one after another (first requests pay one-time costs); unmeasured."""
        target = self.client_target()
        if target is None:
            return

        async def send() -> None:
            async with Client(target, time.perf_counter()) as client:
                for request in self.warmup:
                    await client.send(request, 0.0)

        with asyncio.Runner() as runner:
            runner.run(send())

    def scenario_for(self, scenario: Scenario) -> Scenario:
        """`scenario` aimed at this config."""
        if self.config.kind == "emulator":
            settings = section_of(self.config.emulator or {}, f"config {self.config.name}")
            return _copy(scenario, target=None, emulator=settings, fleet=None)
        return _copy(scenario, target=self.target_spec(), fleet=None)

    def run_point(self, scenario: Scenario, workload: Workload, folder: Path) -> Summary:
        """Run the point live into `folder`; PointError when the server exits during it,
        KeyboardInterrupt after a Ctrl-C (the point's records kept)."""
        aimed = self.scenario_for(scenario)
        exited: list[int] = []
        signals: list[int] = []
        try:
            with asyncio.Runner() as runner:
                summary, _ = runner.run(self._run(aimed, workload, folder, exited, signals))
        except RunAborted:
            raise KeyboardInterrupt from None
        except PreflightError as exc:
            raise PointError(self._exited_text(f"the server failed the check before the point: {exc}")) from None
        if signals:
            raise KeyboardInterrupt
        if not exited and self.server is not None and self.server.process is not None:
            code = self.server.process.poll()  # gone after the watch's last look, before the run ended
            if code is not None:
                exited.append(code)
        if exited:
            raise PointError(self._exited_text(f"the server exited with code {exited[0]} during the point"))
        return summary

    def _exited_text(self, what: str) -> str:
        """`what`, with the exit code when the launched server is gone, and its last log lines."""
        if self.server is None:
            return what
        code = self.server.process.poll() if self.server.process is not None else None
        if code is not None and "exited with code" not in what:
            what += f" (the server exited with code {code})"
        return f"{what}; last log lines ({self.log}):\n{self.server.log_tail(20)}"

    async def _run(self, scenario: Scenario, workload: Workload, folder: Path, exited: list[int], signals: list[int]):
        watch: Optional[asyncio.Task] = None

        def on_driver(driver: Any) -> None:
            nonlocal watch
            if self.server is not None:
                watch = asyncio.ensure_future(self._watch(driver, exited))

        try:
            return await run_scenario(scenario, workload, folder, on_driver=on_driver, on_signal=signals.append)
        finally:
            if watch is not None:
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch

    async def _watch(self, driver: Any, exited: list[int]) -> None:
        """Stop the run as soon as the launched server has exited."""
        assert self.server is not None and self.server.process is not None
        while True:
            code = self.server.process.poll()
            if code is not None:
                exited.append(code)
                driver.stop("server_exited")
                return
            await asyncio.sleep(WATCH_INTERVAL_S)  # a poll interval, not a stand-in for synchronisation

    def server_info(self) -> Optional[dict[str, Any]]:
        """study.json's ``server`` of this config."""
        if not self.config.launched:
            return None
        log = str(self.log.relative_to(self.study_dir)) if self.log else None
        url = self.server.base_url if self.server is not None and self.server.port is not None else None
        return {"log": log, "startup_s": self.startup_s, "starts": self.starts, "url": url}

    def close(self) -> None:
        """Stop the launched server (SIGTERM, SIGKILL after the stop timeout)."""
        if self.server is not None:
            self.server.stop(self._stop_timeout())


def _copy(scenario: Scenario, **update: Any) -> Scenario:
    """A copy of `scenario` with fields replaced (a copy keeps where it was read from)."""
    return scenario.model_copy(update=update)
