"""The installers: torch build selection (scripts/pick_torch.py), the --dry-run commands of
scripts/install.sh and tests/servers/install_engines.sh, and defaults that name no machine path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.pick_torch import CPU_INDEX, decide, detect_gpu
from tests.servers import engines

ROOT = Path(__file__).resolve().parents[1]


# -- the decision, with faked machines ---------------------------------------------------------
def test_linux_without_gpu_takes_the_cpu_build_from_pips_sources_when_they_have_it():
    plan = decide("auto", system="Linux", gpu=None, installed=None, local_cpu_wheel=True)
    assert plan.mode == "cpu" and plan.pip_args() == ["torch==2.13.0+cpu"]
    assert "no NVIDIA GPU" in plan.why


def test_linux_without_gpu_takes_the_cpu_build_from_pytorchs_index_otherwise():
    plan = decide("auto", system="Linux", gpu=None, installed=None, local_cpu_wheel=False)
    assert plan.pip_args() == ["torch==2.13.0+cpu", "--extra-index-url", CPU_INDEX]
    assert CPU_INDEX in plan.on_failure and "STRUCTGEN_TORCH=skip" in plan.on_failure


def test_linux_with_gpu_takes_pypis_cuda_build():
    plan = decide("auto", system="Linux", gpu="nvidia-smi: GPU 0: NVIDIA H200", installed=None,
                  local_cpu_wheel=True)
    assert plan.mode == "cuda" and plan.pip_args() == ["torch==2.13.0"]
    assert "H200" in plan.why


@pytest.mark.parametrize(("requested", "gpu", "mode", "args"), [
    ("cpu", "GPU 0", "cpu", ["torch==2.13.0+cpu", "--extra-index-url", CPU_INDEX]),
    ("cuda", None, "cuda", ["torch==2.13.0"]),
    ("skip", "GPU 0", "skip", []),
])
def test_the_override_wins_over_detection(requested, gpu, mode, args):
    plan = decide(requested, system="Linux", gpu=gpu, installed=None, local_cpu_wheel=False)
    assert (plan.mode, plan.pip_args()) == (mode, args)


def test_other_systems_take_pypis_build():
    plan = decide("auto", system="Darwin", gpu=None, installed=None, local_cpu_wheel=False)
    assert plan.pip_args() == ["torch==2.13.0"]


def test_an_installed_torch_of_the_version_is_kept_unless_another_build_is_asked_for():
    same = decide("auto", system="Linux", gpu=None, installed="2.13.0+cpu", local_cpu_wheel=True)
    assert same.mode == "skip" and same.pip_args() == [] and "already installed" in same.why
    other_build = decide("auto", system="Linux", gpu=None, installed="2.13.0", local_cpu_wheel=True)
    assert other_build.pip_args() == [] and "STRUCTGEN_TORCH=cpu replaces it" in other_build.why
    asked = decide("cpu", system="Linux", gpu=None, installed="2.13.0", local_cpu_wheel=True)
    assert asked.pip_args() == ["torch==2.13.0+cpu"] and "replaces the installed torch 2.13.0" in asked.why
    older = decide("auto", system="Linux", gpu=None, installed="2.4.0+cpu", local_cpu_wheel=True)
    assert older.pip_args() == ["torch==2.13.0+cpu"]


def test_an_unknown_choice_is_refused():
    with pytest.raises(ValueError, match="auto, cpu, cuda, skip"):
        decide("rocm", system="Linux", gpu=None, installed=None, local_cpu_wheel=False)


def _fake_smi(tmp_path: Path, output: str, status: int = 0) -> Path:
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir(parents=True, exist_ok=True)
    smi.write_text(f"#!/bin/sh\nprintf '%s\\n' '{output}'\nexit {status}\n")
    smi.chmod(0o755)
    return smi


def test_gpu_detection_reads_nvidia_smi_and_the_driver(tmp_path):
    no_proc = tmp_path / "no-driver"
    assert detect_gpu(which=lambda _: None, proc=no_proc) is None
    smi = _fake_smi(tmp_path, "GPU 0: NVIDIA H200 (UUID: GPU-1234)")
    assert "NVIDIA H200" in (detect_gpu(which=lambda _: str(smi), proc=no_proc) or "")
    broken = _fake_smi(tmp_path / "broken", "NVIDIA-SMI has failed because it couldn't communicate with the driver", 9)
    assert detect_gpu(which=lambda _: str(broken), proc=no_proc) is None
    (tmp_path / "driver" / "gpus" / "0000:01:00.0").mkdir(parents=True)
    assert "driver" in (detect_gpu(which=lambda _: None, proc=tmp_path / "driver") or "")


# -- the scripts' --dry-run: what they would run -------------------------------------------------
def _run(argv: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "STRUCTGEN_VENV": str(tmp_path / "venv"), "PYTHON": sys.executable, **env}
    full.pop("STRUCTGEN_TORCH", None)
    full.update(env)
    return subprocess.run(argv, cwd=ROOT, env=full, capture_output=True, text=True, timeout=120, check=False)


def test_install_dry_run_takes_cuda_where_nvidia_smi_lists_a_gpu(tmp_path):
    smi = _fake_smi(tmp_path, "GPU 0: NVIDIA H200 (UUID: GPU-1234)")
    out = _run(["bash", "scripts/install.sh", "--dry-run"], tmp_path, PATH=f"{smi.parent}:{os.environ['PATH']}")
    assert out.returncode == 0, out.stderr
    assert "torch: cuda" in out.stdout and "install --disable-pip-version-check --quiet torch==2.13.0\n" in out.stdout
    assert "-e .[embedded,test," in out.stdout
    assert not (tmp_path / "venv").exists()  # a dry run creates nothing


@pytest.mark.parametrize(("how", "expect"), [
    ({"STRUCTGEN_TORCH": "cpu"}, "torch==2.13.0+cpu"),
    ({"STRUCTGEN_TORCH": "skip"}, "(nothing to install)"),
    ({"flag": "--torch=skip"}, "(nothing to install)"),
])
def test_install_dry_run_follows_the_override(tmp_path, how, expect):
    flag = how.pop("flag", None)
    out = _run(["bash", "scripts/install.sh", "--dry-run", *([flag] if flag else [])], tmp_path, **how)
    assert out.returncode == 0, out.stderr
    assert expect in out.stdout


def test_install_refuses_an_unknown_torch_choice_and_an_old_python(tmp_path):
    bad = _run(["bash", "scripts/install.sh", "--dry-run"], tmp_path, STRUCTGEN_TORCH="rocm")
    assert bad.returncode == 2 and "must be auto, cpu, cuda or skip" in bad.stderr
    old = _run(["bash", "scripts/install.sh", "--dry-run"], tmp_path, PYTHON="no-such-python3")
    assert old.returncode == 1 and "needs Python >= 3.11" in old.stderr


def test_engine_installer_dry_run_pins_the_cpu_torch_for_vllm_under_the_given_folder(tmp_path):
    out = _run(["bash", "tests/servers/install_engines.sh", "--dry-run", "vllm", "triton"], tmp_path,
               STRUCTGEN_ENGINES=str(tmp_path / "engines"))
    assert out.returncode == 0, out.stderr
    vllm = next(line for line in out.stdout.splitlines() if line.startswith("[vllm]"))
    assert f"{tmp_path}/engines/vllm/bin/pip install -r {ROOT}/backends/vllm/requirements.txt torch==2.13.0+cpu" in vllm
    assert any(line.startswith("[triton] would run") for line in out.stdout.splitlines())
    assert not (tmp_path / "engines").exists()


# -- defaults that name no machine path ----------------------------------------------------------
def test_engine_venvs_default_to_the_users_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("STRUCTGEN_ENGINES", raising=False)
    monkeypatch.delenv("STRUCTGEN_VLLM_VENV", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert engines.venv("vllm") == tmp_path / "structgen" / "engines" / "vllm"
    assert engines.python("vllm") is None
    reason = engines.skip_reason("vllm")
    assert str(tmp_path / "structgen" / "engines" / "vllm") in reason
    assert "install_engines.sh vllm" in reason
    monkeypatch.setenv("STRUCTGEN_ENGINES", str(tmp_path / "e"))
    assert engines.venv("triton") == tmp_path / "e" / "triton"
    monkeypatch.setenv("STRUCTGEN_TRITON_VENV", str(tmp_path / "t"))
    assert engines.venv("triton") == tmp_path / "t"


def test_no_tracked_file_names_this_machines_layout():
    """No default (nor doc) may point at this machine's folders: caches and data are found
    relative to the user's cache dir or the repository."""
    try:
        files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    offenders = []
    for name in files.splitlines():
        path = ROOT / name
        if path.is_symlink() or not path.is_file() or path.stat().st_size > 2_000_000:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        offenders += [f"{name}:{i}" for i, line in enumerate(text.splitlines(), 1)
                      if "/work/" in line and name != "tests/test_install.py"]
    assert not offenders, offenders
