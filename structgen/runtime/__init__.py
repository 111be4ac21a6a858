"""The pure-Python runtime core for shared-prefix runs (no torch, no model).

* :class:`BlockPool` -- fixed pool of KV block ids with ref counts (the KV budget).
* :class:`RadixCache` -- radix tree of cached token prefixes owning KV blocks.
* :class:`SeqState` -- one request's tokens, status, KV blocks and counters.
* :class:`Scheduler` -- cache-aware continuous batching with eviction and preemption;
  it returns a :class:`Batch` per forward pass and keeps :class:`SchedulerStats`.

Errors are :class:`KVCacheError` (API misuse), :class:`KVCapacityError` (a sequence
larger than the whole pool) and :class:`ContextLengthError` (a prompt that fills the
model's context), all :class:`structgen.errors.BackendError`.
"""

from structgen.runtime.batch import Batch, BatchEntry
from structgen.runtime.block_pool import BlockPool, blocks_for_tokens
from structgen.runtime.errors import ContextLengthError, KVCacheError, KVCapacityError
from structgen.runtime.radix_cache import (
    InsertResult,
    MatchResult,
    RadixCache,
    RadixNode,
)
from structgen.runtime.scheduler import Scheduler, SchedulerConfig
from structgen.runtime.seq_state import SeqState, SequenceStatus
from structgen.runtime.stats import SchedulerStats

__all__ = [
    "Batch",
    "BatchEntry",
    "BlockPool",
    "ContextLengthError",
    "InsertResult",
    "KVCacheError",
    "KVCapacityError",
    "MatchResult",
    "RadixCache",
    "RadixNode",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerStats",
    "SeqState",
    "SequenceStatus",
    "blocks_for_tokens",
]
