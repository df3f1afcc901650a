"""A live fleet brought up for a run: its replicas (the built-in emulator, vLLM, any command, or existing
URLs), each health-checked, then sglang-router in front of them with the scenario's policy and settings
(or an existing router); watched while the run goes, stopped at its end (SIGTERM, then SIGKILL).

`open_fleet` does all of it as an ``async with`` block, whose end stops what it started however the block
ends (an error, Ctrl-C). The logs go to the result folder's ``fleet/``: ``r0.log``, ``r1.log``, ...,
``router.log``. Each replica names itself in its responses (`spec.REPLICA_HEADER`): the emulator with
its ``--replica`` option, vLLM through a middleware (`asgi/agentload_replica_header.py`). A replica that
exits during the run is only noted (`Fleet.died`): the router sends its calls elsewhere or they fail,
and the client counts them as usual. A router that exits ends the run (nothing reaches the replicas).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import math
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Mapping, Optional, Sequence

from pydantic import ValidationError

from .. import validation
from ..emulator.settings import EmulatorSettings
from ..errors import InputError
from ..live.vllm.server import ServerError, ServerProcess, VLLMServer, free_port
from ..redact import mask_url
from ..scenario.fleet import LIVE_POLICIES, REPLICA_HEADER, FleetSpec, RouterSpec

FLEET_DIR = "fleet"
"""The result folder's subfolder of the fleet's logs and per-replica scrapes."""
ROUTER_PACKAGE = "sglang_router"
ROUTER_MODULE = "sglang_router.launch_router"
INSTALL_HINT = "pip install 'agentload[fleet]'"
ROUTER_HEALTH = "/readiness"
"""sglang-router answers 200 here once its workers are registered and healthy (503 before)."""
ROUTER_LOG_LEVEL = "warn"
"""The router's log level unless its `args` set one (at info it writes two lines a request)."""
REPLICA_MIDDLEWARE_DIR = Path(__file__).with_name("asgi")
"""The folder put on a vLLM replica's PYTHONPATH: the middleware with which it names itself."""
REPLICA_MIDDLEWARE = "agentload_replica_header.ReplicaHeader"
HEALTH_POLL_S = 0.2
WATCH_INTERVAL_S = 0.5
STOP_GRACE_S = 20.0

EMULATOR_FLAGS: dict[str, str] = {
    "model": "--model", "max_model_len": "--max-model-len", "vocab_size": "--vocab-size", "profile": "--profile",
    "ttft": "--ttft", "itl": "--itl", "prefill_per_token": "--prefill-per-token", "decode_per_seq": "--decode-per-seq",
    "decode_base": "--decode-base", "max_num_seqs": "--max-num-seqs", "block_size": "--block-size", "seed": "--seed",
    "retry_after": "--retry-after",
}
"""The emulator settings a replica takes, and the `agentload serve-emulator` option of each."""


class FleetError(InputError):
    """A fleet that could not be brought up: sglang-router not installed, a replica or the router never
    healthy, settings a live fleet cannot take. Said as bad input (the command's exit code 2), with the
    last lines of the log of what failed."""


@dataclass
class Replica:
    """One replica: its name, URL and, when agentload launched it, its process."""

    name: str
    url: str
    server: Optional[ServerProcess] = None
    """None: an existing replica (`fleet.urls`), neither started nor stopped here."""
    stop_grace: float = STOP_GRACE_S
    """Seconds between its SIGTERM and its SIGKILL."""
    exit_code: Optional[int] = None
    """Its exit code, once it exited during the run."""
    seen_exited_at: Optional[float] = None
    """Seconds after the fleet was up when the watch found it gone."""

    @property
    def log(self) -> Optional[Path]:
        return None if self.server is None else self.server.log_path

    def exited(self) -> Optional[int]:
        """Its exit code once its process has exited (None while it runs, or for an existing replica)."""
        if self.server is None or self.server.process is None:
            return None
        return self.server.process.poll()

    def note(self) -> Optional[str]:
        """How it died, for the summary (None while it lives)."""
        if self.exit_code is None:
            return None
        how = (f"killed by {_signal_name(-self.exit_code)}" if self.exit_code < 0
               else f"exited with code {self.exit_code}")
        when = f" (found {self.seen_exited_at:.1f} s after the fleet was up)" if self.seen_exited_at is not None else ""
        return f"{how} during the run{when}; its log: {FLEET_DIR}/{self.name}.log"


@dataclass
class Fleet:
    """A fleet up for a run: its replicas and the router's URL (and process, when launched)."""

    spec: FleetSpec
    replicas: list[Replica]
    router_url: str
    router: Optional[ServerProcess] = None
    folder: Optional[Path] = None
    """Where its logs are (the result folder's ``fleet/``)."""
    router_exit: Optional[int] = None
    """The router's exit code, once it exited during the run."""
    on_router_exit: Optional[Callable[[int], None]] = None
    """Told the router's exit code when the watch finds it gone (the run then stops)."""

    @property
    def names(self) -> list[str]:
        return [r.name for r in self.replicas]

    @property
    def policy(self) -> str:
        """The router's policy ("unknown" for an existing router: it runs what it was started with)."""
        return self.spec.router.policy if self.router is not None else "unknown (an existing router)"

    def died(self) -> dict[str, str]:
        """The replicas that exited during the run, each with how (`Replica.note`)."""
        return {r.name: r.note() or "" for r in self.replicas if r.exit_code is not None}

    def check(self, now: Optional[float] = None) -> list[Replica]:
        """Note the replicas that exited since the last check (`now`: seconds since the fleet was up), and
        the router; returns the replicas."""
        gone = []
        for replica in self.replicas:
            if replica.exit_code is None and (code := replica.exited()) is not None:
                replica.exit_code, replica.seen_exited_at = code, now
                gone.append(replica)
        if self.router is not None and self.router_exit is None and self.router.process is not None:
            self.router_exit = self.router.process.poll()
            if self.router_exit is not None and self.on_router_exit is not None:
                self.on_router_exit(self.router_exit)
        return gone

    def describe(self) -> dict[str, Any]:
        """run.json's ``fleet``: the replicas (URLs masked, logs, startup seconds) and the router (URL
        masked, policy, command line)."""
        replicas = []
        for r in self.replicas:
            entry: dict[str, Any] = {"name": r.name, "url": mask_url(r.url), "launched": r.server is not None}
            if r.server is not None:
                entry["log"] = f"{FLEET_DIR}/{r.name}.log"
                entry["startup_s"] = r.server.startup_seconds
            replicas.append(entry)
        router: dict[str, Any] = {"url": mask_url(self.router_url), "launched": self.router is not None,
                                  "policy": self.policy}
        if self.router is not None:
            router["log"] = f"{FLEET_DIR}/router.log"
            router["command"] = self.router.command()[1:]  # without the path of this machine's python
            router["startup_s"] = self.router.startup_seconds
        return {"kind": self.spec.kind, "replicas": replicas, "router": router}

    def stop(self) -> None:
        """Stop what was launched: the router first (so that it sends nothing more), then the replicas
        together; each SIGTERM, then SIGKILL after its grace period."""
        if self.router is not None:
            self.router.stop(STOP_GRACE_S)
        launched = [r for r in self.replicas if r.server is not None]
        if launched:
            with ThreadPoolExecutor(max_workers=min(32, len(launched))) as pool:
                list(pool.map(lambda r: r.server.stop(r.stop_grace), launched))


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def router_installed() -> bool:
    """Whether this Python can run sglang-router (the ``fleet`` extra)."""
    return importlib.util.find_spec(ROUTER_PACKAGE) is not None


def emulator_argv(settings: Mapping[str, Any], replica: str) -> list[str]:
    """The command of one emulator replica: `agentload serve-emulator` with the settings as its options
    (``{host}`` and ``{port}`` to fill in) and the replica's name. FleetError for a setting that is bad
    or that the command has no option for."""
    try:
        checked = EmulatorSettings.model_validate(dict(settings))
    except ValidationError as exc:
        raise FleetError.several([
            FleetError(f"fleet.emulator: {problem.text()}", path=".".join(["fleet", "emulator", *map(str, problem.loc)]),
                       field=problem.field) for problem in validation.problems(exc, EmulatorSettings)]) from None
    unsupported = sorted(set(settings) - set(EMULATOR_FLAGS) - {"faults"})
    if unsupported:
        raise FleetError(f"fleet.emulator: {', '.join(unsupported)} cannot be given to a fleet's emulator replicas "
                         f"(they take {', '.join(sorted([*EMULATOR_FLAGS, 'faults']))})",
                         path=f"fleet.emulator.{unsupported[0]}", field=unsupported[0])
    argv = [sys.executable, "-m", "simulator", "serve-emulator", "--host", "{host}", "--port", "{port}"]
    for name, flag in EMULATOR_FLAGS.items():
        value = getattr(checked, name)
        if name in settings and value is not None:
            argv += [flag, str(value)]
    for kind, rate in checked.faults:
        argv += ["--fault", f"{kind}:{rate!r}"]
    return argv + ["--replica", replica]


def replica_servers(spec: FleetSpec, folder: Path, resolve: Callable[[str], Path]) -> list[Replica]:
    """The replicas to launch (not started yet), or the existing ones; `resolve` turns a path of the
    scenario (a model folder, a profile file, a folder to run in) into one relative to where it is."""
    names = spec.replica_names()
    kind = spec.kind
    if kind is None:
        raise FleetError("a live fleet needs its replicas: fleet.emulator, fleet.vllm, fleet.server or fleet.urls",
                         path="fleet")
    if kind == "urls":
        return [Replica(name, url) for name, url in zip(names, spec.urls or [])]
    replicas = []
    for name in names:
        log = folder / f"{name}.log"
        server: ServerProcess
        grace = STOP_GRACE_S
        if kind == "emulator":
            settings = dict(spec.emulator or {})
            profile = settings.get("profile")
            if isinstance(profile, str) and resolve(profile).is_file():
                settings["profile"] = str(resolve(profile))
            server = ServerProcess(emulator_argv(settings, name), log_path=log,
                                   startup_timeout_s=spec.startup_timeout)
        elif kind == "vllm":
            v = spec.vllm
            assert v is not None
            server = VLLMServer(resolve(v.model), python=v.python, extra_args=[*v.args, "--middleware", REPLICA_MIDDLEWARE],
                                env=named_replica_env(v.env, name), log_path=log, startup_timeout_s=_timeout(spec, v))
            grace = v.stop_timeout
        else:
            s = spec.server
            assert s is not None
            if s.port is not None and spec.replicas > 1:
                raise FleetError(f"fleet.server.port: {spec.replicas} replicas cannot share port {s.port}; leave it "
                                 "out (each replica gets a free port, given to its command as {port})",
                                 path="fleet.server.port", field="port")
            server = ServerProcess(s.argv, port=s.port, host=s.host, env=s.env,
                                   cwd=resolve(s.cwd) if s.cwd else None, health_path=s.health,
                                   startup_timeout_s=_timeout(spec, s), log_path=log)
            grace = s.stop_timeout
        server.name = f"fleet replica {name}"
        replicas.append(Replica(name, "", server, grace))
    return replicas


def named_replica_env(env: Mapping[str, str], name: str) -> dict[str, str]:
    """A vLLM replica's environment: `env`, with what its middleware needs to name it in every
    response (`asgi/agentload_replica_header.py`, on its PYTHONPATH)."""
    path = env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    return {**env, "AGENTLOAD_REPLICA": name, "AGENTLOAD_REPLICA_HEADER": REPLICA_HEADER,
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPLICA_MIDDLEWARE_DIR), path) if p)}


def _timeout(spec: FleetSpec, command: Any) -> float:
    """A launched replica's startup timeout: its command's when given there, else the fleet's."""
    return command.startup_timeout if "startup_timeout" in command.model_fields_set else spec.startup_timeout


def check_router(router: RouterSpec) -> None:
    """FleetError for router settings sglang-router cannot take (said before anything starts)."""
    if router.policy not in LIVE_POLICIES:
        raise FleetError(f"fleet.router.policy: sglang-router has no policy {router.policy!r} (it has "
                         f"{', '.join(LIVE_POLICIES)}; the others run on the twin only)",
                         path="fleet.router.policy", field="policy")
    if router.eviction_interval != math.floor(router.eviction_interval):
        raise FleetError(f"fleet.router.eviction_interval: sglang-router takes whole seconds, not "
                         f"{router.eviction_interval:g}", path="fleet.router.eviction_interval",
                         field="eviction_interval")


def router_argv(router: RouterSpec, worker_urls: Sequence[str], metrics_port: int, host: str = "127.0.0.1") -> list[str]:
    """sglang-router's command line (``{port}`` to fill in) for the spec's policy and settings."""
    check_router(router)
    argv = [sys.executable, "-m", ROUTER_MODULE, "--host", host, "--port", "{port}",
            "--worker-urls", *worker_urls, "--policy", router.policy,
            "--prometheus-host", host, "--prometheus-port", str(metrics_port),
            "--cache-threshold", repr(router.cache_threshold),
            "--balance-abs-threshold", str(router.balance_abs_threshold),
            "--balance-rel-threshold", repr(router.balance_rel_threshold),
            "--eviction-interval-secs", str(int(router.eviction_interval)),
            "--max-tree-size", str(router.max_tree_size),
            "--assignment-mode", router.assignment_mode]
    if not any(arg.startswith("--log-level") for arg in router.args):
        argv += ["--log-level", ROUTER_LOG_LEVEL]
    return argv + list(router.args)


@contextlib.asynccontextmanager
async def open_fleet(spec: FleetSpec, folder: Path, resolve: Callable[[str], Path] = Path,
                     clock: Callable[[], float] = time.perf_counter, source: Optional[str] = None) -> AsyncIterator[Fleet]:
    """The fleet of `spec` up for the block (logs in ``folder/fleet``), stopped at its end; a replica
    found exited is noted while the block runs (seconds on `clock` since the block began; `Fleet.check`
    notes the rest). FleetError when it cannot be brought up (after stopping what had started), naming
    `source`, the scenario file."""
    try:
        async with _fleet(spec, folder, resolve, clock) as fleet:
            yield fleet
    except FleetError as exc:
        if exc.file is None and source is not None:
            for problem in (exc, *exc.problems):
                problem.file = problem.file or source
        raise


@contextlib.asynccontextmanager
async def _fleet(spec: FleetSpec, folder: Path, resolve: Callable[[str], Path],
                 clock: Callable[[], float]) -> AsyncIterator[Fleet]:
    launching = spec.kind != "urls"
    if spec.router.url is not None and launching:
        raise FleetError("fleet.router.url: an existing router knows its own replicas; give them as fleet.urls "
                         "(launched replicas get new ports that it cannot know)", path="fleet.router.url", field="url")
    if spec.router.url is None and not router_installed():
        raise FleetError(f"sglang-router is not installed for {sys.executable}: {INSTALL_HINT} (or give an existing "
                         "router as fleet.router.url)", path="fleet.router", field="router")
    if spec.router.url is None:
        check_router(spec.router)
    logs = Path(folder) / FLEET_DIR
    replicas = replica_servers(spec, logs, resolve)
    fleet = Fleet(spec, replicas, router_url=spec.router.url or "", folder=logs)
    try:
        launched = [r.server for r in replicas if r.server is not None]
        if launched:
            logs.mkdir(parents=True, exist_ok=True)
            await _bring_up(launched)
            for replica in replicas:
                if replica.server is not None:
                    replica.url = replica.server.base_url
        if spec.router.url is None:
            logs.mkdir(parents=True, exist_ok=True)
            argv = router_argv(spec.router, [r.url for r in replicas], free_port())
            fleet.router = ServerProcess(argv, health_path=ROUTER_HEALTH, log_path=logs / "router.log",
                                         startup_timeout_s=spec.router.startup_timeout, name="sglang-router")
            await _bring_up([fleet.router])
            fleet.router_url = fleet.router.base_url
        began = clock()
        watch = asyncio.ensure_future(_watch(fleet, lambda: clock() - began))
        try:
            yield fleet
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
            fleet.check()
    finally:
        fleet.stop()


async def _bring_up(servers: Sequence[ServerProcess]) -> None:
    """Start the servers side by side and wait until each answers its health check; FleetError naming
    the first that failed (they are then all stopped by the caller)."""
    for server in servers:
        try:
            server.spawn()
        except ServerError as exc:
            raise FleetError(str(exc), path="fleet") from None
    pending = list(servers)
    while pending:
        ready = await asyncio.gather(*(asyncio.to_thread(server.poll_ready) for server in pending),
                                     return_exceptions=True)
        failed = [(server, outcome) for server, outcome in zip(pending, ready) if isinstance(outcome, BaseException)]
        if failed:
            server, first = failed[0]
            if not isinstance(first, ServerError):
                raise first
            also = "".join(f"\n({s.name} failed too)" for s, _ in failed[1:])
            raise FleetError(str(first).rstrip("\n") + also, path="fleet")
        pending = [server for server, up in zip(pending, ready) if not up]
        if pending:
            await asyncio.sleep(HEALTH_POLL_S)  # the health checks' polling interval


async def _watch(fleet: Fleet, now: Callable[[], float]) -> None:
    """Note replicas that exit while the run goes (their calls fail or go elsewhere; the run goes on)."""
    while True:
        fleet.check(now())
        await asyncio.sleep(WATCH_INTERVAL_S)  # a poll interval, not a stand-in for synchronisation


def fleet_spec_text(spec: FleetSpec) -> str:
    """What a fleet is, in words (the run's banner): its replicas and its router; URLs masked."""
    kinds = {"emulator": "built-in emulator", "vllm": "vLLM", "server": "launched server", "urls": "existing"}
    words = [str(spec.replicas), kinds.get(spec.kind or ""), "replica" if spec.replicas == 1 else "replicas"]
    what = "a fleet of " + " ".join(w for w in words if w)
    profile = (spec.emulator or {}).get("profile") if spec.kind == "emulator" else None
    if profile:
        what += f" (profile {profile})"
    if spec.router.url is not None:
        return f"{what} behind the router at {mask_url(spec.router.url)}"
    return f"{what} behind sglang-router (policy {spec.router.policy})"


def fleet_text(fleet: Fleet) -> str:
    """A fleet that is up, in words: where its replicas and router listen, and where its logs are."""
    replicas = ", ".join(f"{r.name} {mask_url(r.url)}" for r in fleet.replicas)
    logs = f"; logs in {fleet.folder}" if fleet.folder is not None and fleet.folder.exists() else ""
    return f"{replicas}; router {mask_url(fleet.router_url)} ({fleet.policy}){logs}"
