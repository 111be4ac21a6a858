"""Bounded oneDNN kernel caches for a reduced-precision model on the CPU.

On the CPU a bf16 (or fp16) linear layer runs through oneDNN, which JIT-compiles a kernel
for each new input shape and keeps it in two caches, 1024 entries each by default:
oneDNN's own primitive cache (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``) and ideep's
(``LRU_CACHE_CAPACITY``). The engine's shapes follow its batches -- packed prefill lengths,
decode batch sizes -- so a long job keeps meeting new ones, and every cached kernel holds
native memory that ``malloc_trim`` cannot return (about 0.5 MB each here). Measured: in
``bench/extract.py``'s RSS job (bf16, ``max_tokens=1``) resident memory grew by ~80 MB
per 1,000 records, all of it anonymous native memory; a bf16 linear over 1,200 distinct
shapes alone grew 263 -> 778 MB with the default capacities and 263 -> 306 MB with 256.
A float32 forward goes through the BLAS and caches nothing. Bounded at :data:`CAPACITY`,
the 20,000-record RSS job (``bench/extract.py --docs 8 --skip vllm,outlines,ray
--rss-records 20000``) read 1157 MB after 1,000 records and 1194 MB after 20,000, with no
trend between (samples every 1,000 records: 1195-1501 MB, the swing of in-flight batches
and trims); with the default capacities the same job read 1430 and 1776 MB, having climbed
to 2019-2263 MB between 13,000 and 19,000 records.

:func:`bound_kernel_caches` sets both capacities to :data:`CAPACITY` unless the user set
them. oneDNN and ideep read them once, at their first kernel, so it must run before the
process's first reduced-precision CPU matmul: the backend calls it before it loads such a
model. A shape that was evicted is compiled again when it comes back (~0.7 ms for a
576x576 bf16 layer here, against ~0.8 ms for the call itself at a few hundred rows).
"""

from __future__ import annotations

import os

__all__ = ["CAPACITY", "ENV", "bound_kernel_caches"]

#: kernels kept per cache. Small: most shapes (packed prefill lengths, attention over each
#: context length) never come back, and recompiling one that does costs less than its call.
#: Measured on ``bench/extract.py --docs 300`` (bf16): 3.99 docs/s with 64 against 3.78
#: with the default 1024, one run each; the RSS job stayed within ~1.2-1.5 GB over 6,000
#: records with 64, where 512 still grew ~100 MB per 1,000 records over its first 4,000
CAPACITY = 64
#: the environment variables oneDNN and ideep read their capacities from
ENV = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def bound_kernel_caches(capacity: int = CAPACITY) -> dict[str, str]:
    """Set each cache's capacity to ``capacity`` where the environment does not already
    name one; returns the capacities now in the environment."""
    for name in ENV:
        os.environ.setdefault(name, str(int(capacity)))
    return {name: os.environ[name] for name in ENV}
