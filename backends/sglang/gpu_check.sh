#!/usr/bin/env bash
# Live check of structgen's SGLang adapter on a GPU machine.
#
#   SGLANG_PYTHON=/path/to/venv/bin/python MODEL=/path/to/hf_model bash backends/sglang/gpu_check.sh
#
# The lent GPU machine cannot install packages: SGLang must already be installed there
# (backends/sglang/requirements.txt) and a model directory present. Without them this
# script says so and exits 0 -- nothing can be verified then, and the README keeps SGLang
# marked "unverified against a live engine".
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${SGLANG_PYTHON:-python3}
PORT=${PORT:-30000}
if ! "$PY" -c "import sglang" 2>/dev/null; then
  echo "SKIP: sglang is not importable by $PY -- cannot verify the SGLang backend here"; exit 0
fi
if [ -z "${MODEL:-}" ] || [ ! -d "$MODEL" ]; then
  echo "SKIP: set MODEL to a local Hugging Face model directory"; exit 0
fi
echo "sglang $("$PY" -c 'import sglang; print(sglang.__version__)')"
"$PY" -m sglang.launch_server --model-path "$MODEL" --host 127.0.0.1 --port "$PORT" \
  --grammar-backend llguidance > /tmp/sglang-gpu-check.log 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null' EXIT
for _ in $(seq 1 180); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
  kill -0 $SERVER 2>/dev/null || { echo "server exited:"; tail -40 /tmp/sglang-gpu-check.log; exit 1; }
  sleep 2
done
STRUCTGEN_SGLANG_URL="http://127.0.0.1:$PORT" python3 -m pytest -q tests/backends/test_sglang.py -m server -rA
