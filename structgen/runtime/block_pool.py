"""A fixed-size pool of KV block ids with reference counts.

The pool only does bookkeeping: a block id ``b`` stands for ``page_size`` token slots
``b * page_size ... b * page_size + page_size - 1`` in a KV tensor some backend owns.
``num_blocks`` is the budget: the pool never hands out more.

Error contract: exhaustion is not an error. :meth:`BlockPool.allocate` returns
``None`` when fewer than the requested blocks are free (and allocates nothing), so a
scheduler can evict or queue. Misuse -- freeing a free block, an out-of-range id --
raises :class:`~structgen.runtime.errors.KVCacheError`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from structgen.runtime.errors import KVCacheError

__all__ = ["BlockPool", "blocks_for_tokens"]


def blocks_for_tokens(num_tokens: int, page_size: int) -> int:
    """How many blocks of ``page_size`` tokens hold ``num_tokens`` tokens (ceiling)."""
    return -(-num_tokens // page_size)


class BlockPool:
    """``num_blocks`` block ids of ``page_size`` token slots each, with ref counts.

    A block is free (ref count 0) or in use (ref count >= 1). :meth:`allocate` hands out
    blocks with ref count 1; :meth:`incref` shares one; :meth:`free` drops one reference
    per id and returns a block to the free list when its count reaches 0. Free blocks
    are reused in FIFO order (the least recently freed first).
    """

    def __init__(self, num_blocks: int, page_size: int = 16) -> None:
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be a positive int, got {num_blocks!r}")
        if not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"page_size must be a positive int, got {page_size!r}")
        self.num_blocks = num_blocks
        self.page_size = page_size
        self._ref = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))

    # -- sizes -------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks that :meth:`allocate` can hand out now."""
        return len(self._free)

    @property
    def num_used(self) -> int:
        """Blocks with a ref count of at least 1."""
        return self.num_blocks - len(self._free)

    @property
    def capacity_tokens(self) -> int:
        """Token slots in the whole pool (``num_blocks * page_size``)."""
        return self.num_blocks * self.page_size

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens."""
        return blocks_for_tokens(num_tokens, self.page_size)

    def can_allocate(self, n: int) -> bool:
        """Whether ``n`` blocks are free now."""
        return n <= len(self._free)

    def ref_count(self, block: int) -> int:
        """The reference count of ``block`` (0 when free)."""
        self._check_id(block)
        return self._ref[block]

    # -- state changes -------------------------------------------------------------
    def allocate(self, n: int) -> list[int] | None:
        """Take ``n`` free blocks (ref count 1 each), or return ``None`` if fewer are free.

        Nothing is allocated when ``None`` is returned. ``allocate(0)`` returns ``[]``.
        """
        if n < 0:
            raise ValueError(f"cannot allocate {n} blocks")
        if n > len(self._free):
            return None
        out = [self._free.popleft() for _ in range(n)]
        for b in out:
            self._ref[b] = 1
        return out

    def incref(self, blocks: Iterable[int]) -> None:
        """Add one reference to each (in-use) block, e.g. to share it with a fork."""
        for b in blocks:
            self._check_id(b)
            if self._ref[b] == 0:
                raise KVCacheError(f"incref of free block {b}")
            self._ref[b] += 1

    def free(self, blocks: Iterable[int]) -> None:
        """Drop one reference to each block; a block whose count reaches 0 becomes free.

        Raises :class:`KVCacheError` on a block that is already free (a double free).
        """
        for b in blocks:
            self._check_id(b)
            if self._ref[b] == 0:
                raise KVCacheError(f"double free of block {b}")
            self._ref[b] -= 1
            if self._ref[b] == 0:
                self._free.append(b)

    # -- helpers for a model runner ---------------------------------------------------
    def slot_mapping(self, blocks: list[int], start: int, end: int) -> list[int]:
        """Token slot indices for positions ``start .. end-1`` of a sequence in ``blocks``."""
        if start < 0 or end < start or blocks_for_tokens(end, self.page_size) > len(blocks):
            raise KVCacheError(f"positions {start}..{end} are outside {len(blocks)} blocks")
        p = self.page_size
        if p == 1:  # a block is a slot
            return blocks[start:end]
        return [blocks[i // p] * p + i % p for i in range(start, end)]

    def _check_id(self, block: int) -> None:
        if not 0 <= block < self.num_blocks:
            raise KVCacheError(f"block id {block} outside the pool of {self.num_blocks}")

    def __repr__(self) -> str:
        return (f"BlockPool(num_blocks={self.num_blocks}, page_size={self.page_size}, "
                f"free={self.num_free})")
