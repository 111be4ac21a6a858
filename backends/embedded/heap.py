"""Returning freed heap memory to the OS, so a long job's resident memory stays flat.

Every forward pass allocates activations whose shapes follow the batch and its sequence
lengths. glibc keeps freed chunks in its arenas for reuse, and with shapes that never
repeat exactly the kept memory grows: ``bench/extract.py``'s RSS job (20,000 records,
``max_tokens=1``) grew from ~2.4 GB to ~3.4 GB, while the Python objects it held stayed at
~7 MB (tracemalloc) and one ``malloc_trim(0)`` gave back ~150-190 MB at any point. The
engine therefore trims the heap every :data:`TRIM_EVERY` finished sequences
(:class:`HeapTrimmer`); a trim takes milliseconds. Elsewhere than glibc it is a no-op.
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
