#!/usr/bin/env bash
# The whole test suite: install structgen (scripts/install.sh) and the engine servers the
# server tests start (each in its own venv under $STRUCTGEN_ENGINES, default
# ${XDG_CACHE_HOME:-~/.cache}/structgen/engines, skipped when present), then run pytest
# with the given arguments after ruff and mypy (strict for structgen/; both fail the run),
# and say at the end which engines were missing.
#
# llama.cpp's server is Debian's build, unpacked (backends/llamacpp/install_server.py).
# An engine whose install fails is left out: its server tests skip, saying so; nothing else
# depends on it.
# STRUCTGEN_REQUIRE_ENGINES=1 makes a missing engine fail the run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
export STRUCTGEN_ENGINES=${STRUCTGEN_ENGINES:-${XDG_CACHE_HOME:-$HOME/.cache}/structgen/engines}
bash tests/servers/install_engines.sh vllm triton llamacpp || echo "an engine install failed: its server tests will skip"
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
