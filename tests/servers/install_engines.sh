#!/usr/bin/env bash
# Install engine servers for the server tests, each in its own venv, skipping those present.
#
#   bash tests/servers/install_engines.sh [vllm] [triton] [llamacpp] [outlines]  (default: vllm triton)
#
# Venvs: $STRUCTGEN_ENGINES (default /work/venvs)/{vllm,triton,llamacpp}; the tests find
# them there (or via STRUCTGEN_VLLM_VENV / STRUCTGEN_TRITON_VENV / STRUCTGEN_LLAMACPP_VENV).
# Times on this project's 2-core machine: vllm ~6 min (3.4 GB, torch from the local wheel),
# triton ~1 min, llamacpp 15-60 min (compiles llama.cpp; pip caches the wheel afterwards).
# A failed install leaves no venv behind, so its tests skip with a reason instead of failing.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BASE=${STRUCTGEN_ENGINES:-/work/venvs}
PY=${PYTHON:-python3}
mkdir -p "$BASE"
engines=("$@")
[ ${#engines[@]} -eq 0 ] && engines=(vllm triton)

install() {  # name, check-import, pip args...
  local name=$1 check=$2; shift 2
  local venv="$BASE/$name"
  if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import $check" 2>/dev/null; then
    echo "[$name] present in $venv"; return 0
  fi
  local t0=$SECONDS
  rm -rf "$venv"
  echo "[$name] installing into $venv ..."
  if "$PY" -m venv "$venv" && nice -n 10 "$venv/bin/pip" install -q "$@"; then
    echo "[$name] installed in $((SECONDS - t0))s"
  else
    echo "[$name] install FAILED after $((SECONDS - t0))s; its server tests will skip"; rm -rf "$venv"; return 1
  fi
}

status=0
for e in "${engines[@]}"; do
  case $e in
    vllm)
      install vllm vllm -r "$ROOT/backends/vllm/requirements.txt" || status=1
      [ -x "$BASE/vllm/bin/pip" ] && "$BASE/vllm/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null
      ;;
    triton) install triton pytriton -r "$ROOT/backends/triton/requirements.txt" || status=1 ;;
    # for bench/prefix_sharing.py --competitors outlines (P2), not for the tests;
    # torch is pinned in the same command so pip takes the local CPU wheel
    outlines) install outlines outlines torch==2.13.0 outlines transformers jsonschema || status=1 ;;
    llamacpp) CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
                install llamacpp llama_cpp.server -r "$ROOT/backends/llamacpp/requirements.txt" || status=1 ;;
    *) echo "unknown engine $e"; status=2 ;;
  esac
done
exit $status
