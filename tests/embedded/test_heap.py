"""backends/embedded/heap.py: freed heap memory goes back to the OS, and the engine trims
every TRIM_EVERY finished sequences."""

from __future__ import annotations

import ctypes
import ctypes.util

import pytest

import structgen as sg
from structgen.backends.embedded import heap


def _rss_mb() -> float:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:")) / 1024


glibc = pytest.mark.skipif(heap._MALLOC_TRIM is None, reason="malloc_trim is glibc's")


@glibc
def test_trim_returns_free_chunks_below_a_live_one() -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    size, n = 64 * 1024, 2048  # 128 MiB in chunks below the mmap threshold: heap memory
    chunks = [libc.malloc(size) for _ in range(n)]
    for c in chunks:
        ctypes.memset(c, 1, size)  # make the pages resident
    for c in chunks[:-1]:  # the last one stays: free memory below it is not trimmed on free
        libc.free(c)
    held = _rss_mb()
    assert heap.trim() is True
    after = _rss_mb()
    libc.free(chunks[-1])
    assert held - after > 64  # most of the 128 MiB went back


def test_trimmer_counts() -> None:
    t = heap.HeapTrimmer(every=3)
    for _ in range(7):
        t.finished_one()
    assert (t.finished, t.trims) == (7, 2)
    off = heap.HeapTrimmer(every=0)
    off.finished_one()
    assert off.trims == 0


@sg.program
def _word(s, i):
    s += sg.user(f"Say a word ({i}).")
    s += sg.assistant(sg.gen("w", max_tokens=2))


@pytest.mark.model
def test_the_engine_trims_every_n_finished_sequences(embedded_backend) -> None:
    engine = embedded_backend.engine
    saved, engine._heap = engine._heap, heap.HeapTrimmer(every=2)
    try:
        states = _word.run_batch([{"i": i} for i in range(6)], backend=embedded_backend)
        assert all(st.error() is None for st in states)
        finished = engine._heap.finished
        assert finished >= 6
        assert embedded_backend.stats()["heap_trims"] == engine._heap.trims == finished // 2
    finally:
        engine._heap = saved
