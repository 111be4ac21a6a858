#!/usr/bin/env bash
# Live check of structgen's TensorRT-LLM adapter on a GPU machine.
#
#   TRTLLM_BIN=/path/to/venv/bin MODEL=/path/to/hf_model bash backends/trtllm/gpu_check.sh
#
# The lent GPU machine cannot install packages: TensorRT-LLM must already be installed
# there (backends/trtllm/requirements.txt) and a model directory present. Without them
# this script says so and exits 0 -- nothing is verified, and the README keeps
# TensorRT-LLM marked "unverified against a live engine".
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=${TRTLLM_BIN:-$(dirname "$(command -v python3)")}
PORT=${PORT:-8000}
if [ ! -x "$BIN/trtllm-serve" ]; then
  echo "SKIP: trtllm-serve not found in $BIN -- cannot verify the TensorRT-LLM backend here"; exit 0
fi
if [ -z "${MODEL:-}" ] || [ ! -d "$MODEL" ]; then
  echo "SKIP: set MODEL to a local Hugging Face model directory"; exit 0
fi
printf 'guided_decoding_backend: llguidance\n' > /tmp/trtllm-structgen.yaml
"$BIN/trtllm-serve" "$MODEL" --host 127.0.0.1 --port "$PORT" --backend pytorch \
  --config /tmp/trtllm-structgen.yaml > /tmp/trtllm-gpu-check.log 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null' EXIT
for _ in $(seq 1 300); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
  kill -0 $SERVER 2>/dev/null || { echo "server exited:"; tail -40 /tmp/trtllm-gpu-check.log; exit 1; }
  sleep 2
done
STRUCTGEN_TRTLLM_URL="http://127.0.0.1:$PORT" STRUCTGEN_TRTLLM_GUIDED=llguidance \
  python3 -m pytest -q tests/backends/test_trtllm.py -m server -rA
