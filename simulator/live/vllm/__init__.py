"""A real vLLM server (CPU build) for tests and local runs: the tiny model builder and the launcher.

Nothing here imports vLLM itself: vLLM lives in its own virtual environment and runs as a subprocess.
"""

from .server import ServerError, VLLMServer, build_tiny_model, find_python, find_venv, free_port

__all__ = ["ServerError", "VLLMServer", "build_tiny_model", "find_python", "find_venv", "free_port"]
