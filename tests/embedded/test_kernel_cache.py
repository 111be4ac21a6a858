"""backends/embedded/kernel_cache.py: a reduced-precision CPU model's oneDNN kernel caches
are bounded, so a long job's new shapes stop adding native memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from structgen.backends.embedded import adapter, kernel_cache

ROOT = Path(__file__).resolve().parents[2]

# bf16 linear layers over `n` distinct input shapes; anonymous resident memory (after a
# heap trim) after the first 200 and after all of them
_SCRIPT = r"""
import ctypes, ctypes.util, json, sys
from backends.embedded.kernel_cache import bound_kernel_caches
if sys.argv[1] != "default":
    bound_kernel_caches(int(sys.argv[1]))
import torch
libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
def anon_mb():
    libc.malloc_trim(0)
    with open("/proc/self/status") as fh:
        return next(int(l.split()[1]) for l in fh if l.startswith("RssAnon:")) / 1024
torch.set_num_threads(1)
w = torch.randn(576, 576, dtype=torch.bfloat16)
marks = []
for n in range(1, 1001):
    torch.nn.functional.linear(torch.ones(n, 576, dtype=torch.bfloat16), w)
    if n in (200, 1000):
        marks.append(anon_mb())
print(json.dumps(marks))
"""


def _growth(capacity: str) -> float:
    env = {k: v for k, v in os.environ.items() if k not in kernel_cache.ENV}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", _SCRIPT, capacity], env=env, capture_output=True, text=True,
                         timeout=300, check=True)
    at_200, at_1000 = json.loads(out.stdout.strip().splitlines()[-1])
    return float(at_1000 - at_200)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_bounded_caches_stop_the_growth_of_new_shapes() -> None:
    unbounded = _growth("default")
    if unbounded < 100:
        pytest.skip(f"this torch/CPU does not cache a kernel per bf16 shape (grew {unbounded:.0f} MB)")
    bounded = _growth("64")
    # 800 new shapes: hundreds of MB with the default 1024-entry caches, none once 64 are full
    assert bounded < 40, f"bounded caches still grew {bounded:.0f} MB over 800 new shapes (unbounded {unbounded:.0f})"


def test_user_settings_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "7")
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    got = kernel_cache.bound_kernel_caches(32)
    assert got == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "32", "LRU_CACHE_CAPACITY": "7"}
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "32"


class _Loaded(Exception):
    pass


@pytest.mark.parametrize(("dtype", "bounded"), [("bfloat16", True), ("float16", True), ("float32", False)])
def test_backend_bounds_before_loading_a_reduced_precision_cpu_model(
        monkeypatch: pytest.MonkeyPatch, dtype: str, bounded: bool) -> None:
    for name in kernel_cache.ENV:
        monkeypatch.delenv(name, raising=False)
    seen: dict[str, str | None] = {}

    def load_model(model: object, *, device: str, dtype: torch.dtype) -> None:
        seen.update({name: os.environ.get(name) for name in kernel_cache.ENV})  # what the load would see
        raise _Loaded

    monkeypatch.setattr(adapter, "load_model", load_model)
    with pytest.raises(_Loaded):
        adapter.EmbeddedBackend(device="cpu", dtype=dtype)
    expected = str(kernel_cache.CAPACITY) if bounded else None
    assert seen == dict.fromkeys(kernel_cache.ENV, expected)


@pytest.mark.parametrize(("rates", "chosen"), [((900.0, 300.0), torch.bfloat16), ((150.0, 300.0), torch.float32)])
def test_auto_probes_with_bounded_caches_and_loads_the_dtype_it_chose(
        monkeypatch: pytest.MonkeyPatch, rates: tuple[float, float], chosen: torch.dtype) -> None:
    from structgen.backends.embedded import dtype_choice

    for name in kernel_cache.ENV:
        monkeypatch.delenv(name, raising=False)
    seen: dict[str, object] = {}

    def probe_rates() -> tuple[float, float]:
        seen["probe"] = {name: os.environ.get(name) for name in kernel_cache.ENV}  # before the first bf16 kernel
        return rates

    def load_model(model: object, *, device: str, dtype: torch.dtype) -> None:
        seen["dtype"] = dtype
        raise _Loaded

    monkeypatch.setattr(dtype_choice, "cpu_has_native_bf16", lambda: True)
    monkeypatch.setattr(dtype_choice, "probe_rates", probe_rates)
    monkeypatch.setattr(adapter, "load_model", load_model)
    dtype_choice.pick_cpu_dtype.cache_clear()
    try:
        with pytest.raises(_Loaded):
            adapter.EmbeddedBackend(device="cpu", dtype="auto")
    finally:
        dtype_choice.pick_cpu_dtype.cache_clear()
    assert seen == {"probe": dict.fromkeys(kernel_cache.ENV, str(kernel_cache.CAPACITY)), "dtype": chosen}
