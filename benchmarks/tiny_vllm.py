"""The tiny test model on vLLM's CPU build, for the benchmarks that measure a real server: the model
built once into its folder (`ensure_model`), and a server's URL for the length of a block
(`served`: the one given, or one started here)."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Iterator, Optional


def ensure_model(model_dir: Path) -> Path:
    """`model_dir`, with the tiny model built into it first when it holds none."""
    from simulator.live.vllm import build_tiny_model

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").exists():
        print(build_tiny_model(model_dir), file=sys.stderr)
    return model_dir


@contextlib.contextmanager
def served(target: Optional[str], model_dir: Path) -> Iterator[str]:
    """The server's base URL: `target` as given, or a tiny-model vLLM server started for the block."""
    if target:
        yield target.rstrip("/")
        return
    from simulator.live.vllm import VLLMServer

    with VLLMServer(ensure_model(model_dir)) as server:
        print(f"vLLM up at {server.base_url} after {server.startup_seconds:.1f} s (log {server.log_path})",
              flush=True)
        yield server.base_url
