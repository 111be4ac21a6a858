#!/usr/bin/env bash
# The whole test suite: install structgen (scripts/install.sh) and the engine servers the
# server tests start (each in its own venv, skipped when present), then run pytest.
#
# llama.cpp compiles from source (10-80 min on 2 cores), so it is installed only when its
# venv exists or pip has its built wheel cached; otherwise its server tests skip, saying so.
# An engine whose install fails is left out the same way; nothing else depends on it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
engines=(vllm triton)
base=${STRUCTGEN_ENGINES:-/work/venvs}
if [ -x "$base/llamacpp/bin/python" ] || python3 -m pip cache list 'llama_cpp_python*' 2>/dev/null | grep -q llama; then
  engines+=(llamacpp)
fi
bash tests/servers/install_engines.sh "${engines[@]}" || echo "an engine install failed: its server tests will skip"
exec .venv/bin/python -m pytest "$@"
