"""Torch storage for the KV cache, addressed by slot index.

``KVPool`` holds keys and values as ``[layers, slots, kv_heads, head_dim]`` tensors. A
slot is one token position's K/V in every layer. The pool never decides which slots a
sequence gets: the runtime does (``BlockPool`` block ``b`` with ``page_size`` p owns
slots ``b*p .. b*p+p-1``; ``BlockPool.slot_mapping`` turns a sequence's blocks into
slots; with ``page_size=1`` a radix-tree block id *is* a slot). Slots shared in the
radix tree are shared here too: two sequences whose slot lists start the same read the
same memory, which is what cascade attention exploits.

Reads take a :class:`SlotRange`: a contiguous run of slots is a slice (a view, no
copy); anything else is an ``index_select`` (a gather).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

__all__ = ["KVPool", "SlotRange"]


@dataclass(frozen=True)
class SlotRange:
    """Slots to read: ``index`` (a 1-D long tensor) or, when contiguous, ``start..stop``."""

    index: torch.Tensor
    start: int = -1
    stop: int = -1

    @classmethod
    def of(cls, slots: torch.Tensor | list[int]) -> SlotRange:
        """Wrap ``slots``; detect a contiguous run (read later as a slice)."""
        if not isinstance(slots, torch.Tensor):
            if slots and slots[-1] - slots[0] == len(slots) - 1 and all(
                    b - a == 1 for a, b in itertools.pairwise(slots)):
                return cls(torch.tensor(slots, dtype=torch.long), slots[0], slots[-1] + 1)
            return cls(torch.tensor(slots, dtype=torch.long))
        slots = slots.to(torch.long)
        n = slots.numel()
        if n and int(slots[-1] - slots[0]) == n - 1 and bool((slots.diff() == 1).all()):
            return cls(slots, int(slots[0]), int(slots[-1]) + 1)
        return cls(slots)

    @property
    def contiguous(self) -> bool:
        return self.start >= 0

    def __len__(self) -> int:
        return self.index.numel()


class KVPool:
    """K and V for ``num_slots`` token slots in every layer.

    ``write(layer, slots, k, v)`` stores ``k``/``v`` of shape ``[n, kv_heads, head_dim]``
    at ``slots`` (a long tensor of ``n`` slot ids, on the pool's device);
    ``read(layer, slot_range)`` returns ``(k, v)`` of shape ``[n, kv_heads, head_dim]``.
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, num_slots: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        for name, value in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads),
                            ("head_dim", head_dim), ("num_slots", num_slots)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.num_slots = num_slots
        self.dtype = dtype
        self.device = torch.device(device)
        shape = (num_layers, num_slots, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=self.device)
        self.v = torch.zeros(shape, dtype=dtype, device=self.device)

    @classmethod
    def for_config(cls, config: object, num_slots: int, dtype: torch.dtype = torch.float32,
                   device: torch.device | str = "cpu") -> KVPool:
        """A pool shaped for a transformers Llama-style ``config``."""
        heads = config.num_attention_heads  # type: ignore[attr-defined]
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads  # type: ignore[attr-defined]
        return cls(config.num_hidden_layers, config.num_key_value_heads,  # type: ignore[attr-defined]
                   head_dim, num_slots, dtype, device)

    @property
    def bytes_per_slot(self) -> int:
        """Memory one token slot takes (K and V, all layers)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.k.element_size()

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store ``k``, ``v`` (``[n, kv_heads, head_dim]``) at ``slots`` of ``layer``."""
        self.k[layer].index_copy_(0, slots, k.to(self.dtype))
        self.v[layer].index_copy_(0, slots, v.to(self.dtype))

    def read(self, layer: int, slots: SlotRange) -> tuple[torch.Tensor, torch.Tensor]:
        """``(k, v)`` at ``slots`` of ``layer``: a view when contiguous, else a gather."""
        if slots.contiguous:
            return self.k[layer, slots.start:slots.stop], self.v[layer, slots.start:slots.stop]
        return (self.k[layer].index_select(0, slots.index),
                self.v[layer].index_select(0, slots.index))

    def __repr__(self) -> str:
        return (f"KVPool(layers={self.num_layers}, slots={self.num_slots}, "
                f"kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, dtype={self.dtype})")
