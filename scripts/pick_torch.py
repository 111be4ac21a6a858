"""Pick and install the torch build for this machine (used by scripts/install.sh).

    python scripts/pick_torch.py --python .venv/bin/python [--torch auto|cpu|cuda|skip]
                                 [--version 2.13.0] [--dry-run | --pip-args]

A bare ``pip install torch`` on Linux takes PyPI's CUDA build (several GB of nvidia-*
packages) even where no GPU exists, and a ``+cpu`` pin cannot resolve from PyPI at all.
So: ``auto`` (the default; ``STRUCTGEN_TORCH`` or ``--torch`` override it) takes the CUDA
build where an NVIDIA GPU is present (``nvidia-smi -L`` lists one, or
``/proc/driver/nvidia/gpus`` has one) and the CPU build otherwise. The CPU build comes from
pip's own sources when they have it (a local wheel, a mirror), else from PyTorch's CPU
index. Outside Linux, PyPI's build is the right one. ``skip`` leaves torch alone.

``--dry-run`` prints the decision and the pip command; ``--pip-args`` prints only the
requirement and index options (for installers of other venvs). Exit status 1 with a
message saying what to do when the install fails; 2 for a bad option.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

VERSION = "2.13.0"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
MODES = ("auto", "cpu", "cuda", "skip")


@dataclass
class Plan:
    mode: str  # cpu | cuda | skip
    why: str  # one line for a person
    requirement: str | None = None  # e.g. torch==2.13.0+cpu; None: nothing to install
    variant: str = "any"  # the build an installed torch of the version must be to be kept: cpu | cuda | any
    index_args: list[str] = field(default_factory=list)
    on_failure: str = ""

    def pip_args(self) -> list[str]:
        return [self.requirement, *self.index_args] if self.requirement else []


def detect_gpu(which: Callable[[str], str | None] = shutil.which,
               proc: Path = Path("/proc/driver/nvidia")) -> str | None:
    """A line naming the NVIDIA GPU found, or None."""
    gpus = proc / "gpus"
    if gpus.is_dir() and any(gpus.iterdir()):
        return f"NVIDIA driver reports a GPU ({gpus})"
    smi = which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "-L"], check=False, capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError):
            return None
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("GPU")]
        if out.returncode == 0 and lines:
            return f"nvidia-smi: {lines[0].strip()}"
    return None


def decide(requested: str, *, system: str, gpu: str | None, installed: str | None, local_cpu_wheel: bool,
           version: str = VERSION) -> Plan:
    """The plan for ``requested`` (auto|cpu|cuda|skip) given what was found on the machine.

    ``gpu``: what detect_gpu found; ``installed``: the torch version already in the target
    venv; ``local_cpu_wheel``: pip's configured sources have ``torch==VERSION+cpu``.
    """
    if requested not in MODES:
        raise ValueError(f"STRUCTGEN_TORCH / --torch must be one of {', '.join(MODES)}, not {requested!r}")
    if requested == "skip":
        return Plan("skip", f"torch left as it is (STRUCTGEN_TORCH=skip; installed: {installed or 'none'})")
    explicit = requested != "auto"
    if system != "Linux":  # PyPI's macOS / Windows builds are the CPU (and MPS) ones
        mode, why = "cpu", f"PyPI's build for {system}"
        if requested == "cuda":
            why += " (no CUDA builds of torch for this system on PyPI)"
        return _install_or_keep(Plan(mode, why, f"torch=={version}"), installed, version, explicit)  # any build
    if requested == "cuda" or (requested == "auto" and gpu):
        why = "CUDA build: " + (gpu or "requested (STRUCTGEN_TORCH=cuda)")
        plan = Plan("cuda", why, f"torch=={version}", variant="cuda", on_failure=(
            f"could not install torch {version} (CUDA build) from PyPI. Check the network, or install torch "
            "yourself and rerun with STRUCTGEN_TORCH=skip (STRUCTGEN_TORCH=cpu installs the CPU build)"))
        return _install_or_keep(plan, installed, version, explicit)
    why = "CPU build: " + ("requested (STRUCTGEN_TORCH=cpu)" if explicit else "no NVIDIA GPU found")
    requirement = f"torch=={version}+cpu"
    if local_cpu_wheel:
        plan = Plan("cpu", why + ", from pip's configured sources", requirement, variant="cpu", on_failure=(
            f"pip found {requirement} in its configured sources but could not install it; install torch yourself "
            "and rerun with STRUCTGEN_TORCH=skip"))
    else:
        plan = Plan("cpu", why + f", from {CPU_INDEX}", requirement, variant="cpu",
                    index_args=["--extra-index-url", CPU_INDEX], on_failure=(
            f"could not install {requirement}: pip's sources do not have it and {CPU_INDEX} failed (is it "
            "reachable from here?). Install a torch build yourself and rerun with STRUCTGEN_TORCH=skip, "
            "or STRUCTGEN_TORCH=cuda for PyPI's (CUDA) build"))
    return _install_or_keep(plan, installed, version, explicit)


def _install_or_keep(plan: Plan, installed: str | None, version: str, explicit: bool) -> Plan:
    """Keep an installed torch of ``version``: always when it is the planned build, else unless
    the build was asked for explicitly (then it is replaced)."""
    if installed is None or installed.split("+")[0] != version:
        return plan
    build = "cpu" if installed.endswith("+cpu") else "cuda"
    if plan.variant in ("any", build):
        return Plan("skip", f"torch {installed} already installed")
    if not explicit:
        return Plan("skip", f"torch {installed} already installed (STRUCTGEN_TORCH={plan.variant} replaces it)")
    plan.why += f"; replaces the installed torch {installed}"
    return plan


def installed_version(python: str | None) -> str | None:
    if not python or not Path(python).exists():
        return None
    out = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('torch'))"],
                         check=False, capture_output=True, text=True)
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def pip_has(python: str, requirement: str) -> bool:
    """Whether pip's configured sources (find-links, indexes) resolve ``requirement`` alone."""
    out = subprocess.run([python, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed",
                          "--quiet", "--disable-pip-version-check", requirement],
                         check=False, capture_output=True, text=True)
    return out.returncode == 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--python", help="the target venv's python (default: this one)")
    ap.add_argument("--torch", default=os.environ.get("STRUCTGEN_TORCH", "auto"),
                    help="auto | cpu | cuda | skip (default: $STRUCTGEN_TORCH or auto)")
    ap.add_argument("--version", default=VERSION)
    ap.add_argument("--log", help="append pip's output here (printed only when it fails)")
    out = ap.add_mutually_exclusive_group()
    out.add_argument("--dry-run", action="store_true", help="print the decision and the pip command only")
    out.add_argument("--pip-args", action="store_true", help="print the requirement and index options only")
    args = ap.parse_args(argv)
    python = args.python or sys.executable
    requested = args.torch.strip().lower() or "auto"
    if requested not in MODES:
        print(f"error: STRUCTGEN_TORCH / --torch must be one of {', '.join(MODES)}, not {args.torch!r}",
              file=sys.stderr)
        return 2
    system = platform.system()
    gpu = detect_gpu() if system == "Linux" and requested == "auto" else None
    needs_probe = system == "Linux" and requested in ("auto", "cpu") and not gpu
    local = needs_probe and pip_has(python if Path(python).exists() else sys.executable, f"torch=={args.version}+cpu")
    installed = None if args.pip_args else installed_version(python)
    plan = decide(requested, system=system, gpu=gpu, installed=installed, local_cpu_wheel=local,
                  version=args.version)
    if args.pip_args:
        print(shlex.join(plan.pip_args()))
        return 0
    command = [python, "-m", "pip", "install", "--disable-pip-version-check", "--quiet", *plan.pip_args()]
    if args.dry_run:
        print(f"torch: {plan.mode}: {plan.why}")
        print("pip: " + (shlex.join(command) if plan.requirement else "(nothing to install)"))
        return 0
    if not plan.requirement:
        print(f"torch: {plan.why}", flush=True)
        return 0
    print(f"installing {plan.requirement} ({plan.why}) ... ", end="", flush=True)
    t0 = time.monotonic()
    done = subprocess.run(command, check=False, capture_output=True, text=True)
    if args.log:
        with open(args.log, "a") as log:
            log.write(f"$ {shlex.join(command)}\n{done.stdout}{done.stderr}\n")
    if done.returncode != 0:
        print("FAILED", flush=True)
        print((done.stdout + done.stderr).strip()[-3000:], file=sys.stderr)
        print(f"error: {plan.on_failure}", file=sys.stderr)
        return 1
    print(f"ok ({time.monotonic() - t0:.0f} s)", flush=True)
    got = installed_version(python)
    if plan.mode == "cuda" and got and got.endswith("+cpu"):
        print(f"warning: pip installed torch {got}, a CPU build (a local wheel took precedence over PyPI's "
              "CUDA build); remove it from pip's find-links to get CUDA", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
