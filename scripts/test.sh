#!/usr/bin/env bash
# The whole test suite: install structgen (scripts/install.sh) and the engine servers the
# server tests start (each in its own venv under $STRUCTGEN_ENGINES, default
# ${XDG_CACHE_HOME:-~/.cache}/structgen/engines, skipped when present), then run pytest
# with the given arguments after ruff and mypy (strict for structgen/; both fail the run),
# and say at the end which engines were missing.
#
# llama.cpp compiles from source (10-80 min on 2 cores), so it is installed only when its
# venv exists or pip has its built wheel cached; otherwise its server tests skip, saying so.
# An engine whose install fails is left out the same way; nothing else depends on it.
# STRUCTGEN_REQUIRE_ENGINES=1 makes a missing engine fail the run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
export STRUCTGEN_ENGINES=${STRUCTGEN_ENGINES:-${XDG_CACHE_HOME:-$HOME/.cache}/structgen/engines}
engines=(vllm triton)
if [ -x "$STRUCTGEN_ENGINES/llamacpp/bin/python" ] || python3 -m pip cache list 'llama_cpp_python*' 2>/dev/null | grep -q llama; then
  engines+=(llamacpp)
fi
bash tests/servers/install_engines.sh "${engines[@]}" || echo "an engine install failed: its server tests will skip"
echo "ruff check (config in pyproject.toml) ..."
.venv/bin/ruff check .
echo "mypy --strict on structgen/ ..."
.venv/bin/mypy
status=0
.venv/bin/python -m pytest "$@" || status=$?
echo "engine servers for the server tests (tests/servers/engines.py):"
if ! .venv/bin/python -m tests.servers.engines; then
  [ "${STRUCTGEN_REQUIRE_ENGINES:-0}" = 1 ] && [ $status = 0 ] && status=1
fi
exit $status
