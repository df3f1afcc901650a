"""The launcher's failure paths and venv discovery, with stand-in 'python' scripts (no vLLM needed)."""

from __future__ import annotations

import stat

import pytest

from simulator.cli import main as cli_main
from simulator.live.vllm import ServerError, VLLMServer, find_venv
from simulator.live.vllm import server as server_module
from simulator.live.vllm.server import VENV_ENV


def _script(path, body):
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_server_that_dies_reports_its_last_log_lines(tmp_path):
    python = _script(tmp_path / "python", 'echo "loading $2"; echo "ValueError: no such model" >&2; exit 3')
    server = VLLMServer(tmp_path / "model", python=python, log_path=tmp_path / "log.txt")
    with pytest.raises(ServerError) as info:
        server.start()
    text = str(info.value)
    assert "exited with code 3" in text
    assert "ValueError: no such model" in text and "loading vllm.entrypoints.openai.api_server" in text
    assert server.process.returncode == 3


def test_server_not_ready_by_the_deadline_is_stopped(tmp_path):
    python = _script(tmp_path / "python", "echo starting; exec sleep 600")
    server = VLLMServer(tmp_path / "model", python=python, startup_timeout_s=1.0, log_path=tmp_path / "log.txt")
    with pytest.raises(ServerError) as info:
        server.start()
    assert "not ready" in str(info.value) and "starting" in str(info.value)
    # stopped: SIGTERM ended the stand-in, so it was reaped with a negative (signal) code
    assert server.process.returncode is not None and server.process.returncode < 0


def test_command_line_has_the_cpu_flags(tmp_path):
    server = VLLMServer(tmp_path / "m", python="/x/python", port=8123, extra_args=["--seed", "1"])
    cmd = server.command()
    assert cmd[:3] == ["/x/python", "-m", "vllm.entrypoints.openai.api_server"]
    for flag in ("--enforce-eager", "--enable-prefix-caching", "--enable-prompt-tokens-details"):
        assert flag in cmd
    assert cmd[cmd.index("--port") + 1] == "8123" and cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--served-model-name") + 1] == "m"
    assert cmd[-2:] == ["--seed", "1"]
    assert server.base_url == "http://127.0.0.1:8123"


def test_environment_preloads_the_systems_tcmalloc_first(tmp_path, monkeypatch):
    monkeypatch.setattr(server_module, "tcmalloc_library", lambda: "libtcmalloc_minimal.so.4")
    monkeypatch.setenv("LD_PRELOAD", "/opt/other.so")
    server = VLLMServer(tmp_path / "m", python="/x/python")
    env = server.environment()
    assert env["LD_PRELOAD"] == "libtcmalloc_minimal.so.4:/opt/other.so"
    assert env["OMP_NUM_THREADS"] == "1"  # the CPU build's settings stay
    # a TCMalloc already named (by the caller's environment or `env`) is left as it is
    server = VLLMServer(tmp_path / "m", python="/x/python", env={"LD_PRELOAD": "/lib/libtcmalloc.so.4"})
    assert server.environment()["LD_PRELOAD"] == "/lib/libtcmalloc.so.4"
    # asked not to, or on a machine without one: LD_PRELOAD untouched
    assert VLLMServer(tmp_path / "m", python="/x/python", tcmalloc=False).environment()["LD_PRELOAD"] == "/opt/other.so"
    monkeypatch.setattr(server_module, "tcmalloc_library", lambda: None)
    monkeypatch.delenv("LD_PRELOAD")
    assert "LD_PRELOAD" not in VLLMServer(tmp_path / "m", python="/x/python").environment()


def test_find_venv_honours_the_environment_variable(tmp_path, monkeypatch):
    venv = tmp_path / "v"
    (venv / "bin").mkdir(parents=True)
    _script(venv / "bin" / "python", "exit 0")
    monkeypatch.setenv(VENV_ENV, str(venv))
    assert find_venv() == venv
    monkeypatch.setenv(VENV_ENV, str(tmp_path / "missing"))
    assert find_venv() is None


def test_find_venv_looks_upward_for_the_default_folder(tmp_path, monkeypatch):
    monkeypatch.delenv(VENV_ENV, raising=False)
    venv = tmp_path / ".vllm-venv"
    (venv / "bin").mkdir(parents=True)
    _script(venv / "bin" / "python", "exit 0")
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    assert find_venv(deep) == venv


def test_cli_serve_fails_cleanly_when_the_server_dies(tmp_path, capsys):
    python = _script(tmp_path / "python", "echo broken >&2; exit 1")
    code = cli_main(["vllm", "serve", "--model", str(tmp_path / "m"), "--python", str(python)])
    assert code == 1
    assert "broken" in capsys.readouterr().err
