"""How agentload launches a server (a study's config, a fleet's replica): any command (`ServerCommand`)
or a vLLM server of the CPU build (`VLLMCommand`)."""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class ServerCommand(_Strict):
    """A server agentload launches: `argv` (``{host}`` and ``{port}`` are filled in), its environment
    and folder; ready once `health` answers 200 within `startup_timeout`; stopped with SIGTERM, killed
    after `stop_timeout`."""

    argv: list[str] = Field(min_length=1)
    env: dict[str, str] = {}
    cwd: Optional[str] = None
    """Folder the server runs in (relative to the study file; default: the current one)."""
    health: str = "/health"
    host: str = "127.0.0.1"
    port: Optional[int] = Field(None, ge=1, le=65535)
    """Default: a free port, new at each start."""
    startup_timeout: float = Field(300.0, gt=0)
    stop_timeout: float = Field(20.0, gt=0)


class VLLMCommand(_Strict):
    """A vLLM server of the CPU build (`simulator.live.vllm.VLLMServer`): the model folder, extra
    flags and environment; its python is ``$AGENTLOAD_VLLM_VENV`` or ``.vllm-venv`` unless given."""

    model: str
    """Local model folder (relative to the study file)."""
    args: list[str] = []
    env: dict[str, str] = {}
    python: Optional[str] = None
    startup_timeout: float = Field(600.0, gt=0)
    stop_timeout: float = Field(20.0, gt=0)
