"""Returning freed heap memory to the OS during a long job.

Every forward pass allocates activations whose shapes follow the batch and its sequence
lengths, and glibc keeps freed chunks in its arenas for reuse. In ``bench/extract.py``'s
RSS job (``max_tokens=1``) one ``malloc_trim(0)`` gave back ~150-190 MB at any point, while
the Python objects the job held stayed at ~7 MB (tracemalloc). The engine therefore trims
the heap every :data:`TRIM_EVERY` finished sequences (:class:`HeapTrimmer`); a trim takes
milliseconds. It lowers the job's resident memory but does not make it flat on its own:
with it the bf16 job still grew from 1239 MB after 1,000 records to 1780 MB after 6,000.
That growth was oneDNN's per-shape kernel caches, which a trim cannot return; they are
bounded by :mod:`~structgen.backends.embedded.kernel_cache`. Elsewhere than glibc it is a
no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from typing import Any

__all__ = ["TRIM_EVERY", "HeapTrimmer", "trim"]

log = logging.getLogger(__name__)

#: finished sequences between two trims
TRIM_EVERY = 256


def _libc() -> Any:
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = lib.malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS, Windows)
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


_MALLOC_TRIM = _libc()


def trim() -> bool:
    """Give free heap pages back to the OS; whether anything was returned (False where
    ``malloc_trim`` does not exist)."""
    if _MALLOC_TRIM is None:
        return False
    try:
        return bool(_MALLOC_TRIM(0))
    except Exception:  # never let housekeeping fail a request
        log.debug("malloc_trim failed", exc_info=True)
        return False


class HeapTrimmer:
    """Counts finished sequences and trims the heap every ``every`` of them."""

    def __init__(self, every: int = TRIM_EVERY) -> None:
        self.every = every
        self.finished = 0
        self.trims = 0

    def finished_one(self) -> None:
        self.finished += 1
        if self.every > 0 and self.finished % self.every == 0:
            trim()
            self.trims += 1
