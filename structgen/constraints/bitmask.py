"""Token bitmasks: allocate them, read them, and apply them to logits.

A bitmask is an ``int32`` array of shape ``[batch, ceil(vocab / 32)]``; bit ``t % 32`` of
word ``t // 32`` in a row is set when token ``t`` is allowed. Matchers write rows
(:meth:`structgen.constraints.base.Matcher.fill_bitmask`); the embedded backend applies
them to logits with :func:`apply_token_bitmask_inplace`.

Both torch tensors and numpy arrays are accepted. torch is imported lazily, only when a
torch function is asked for, so the constraint engine works without it.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

__all__ = [
    "allocate_token_bitmask",
    "allowed_token_ids",
    "apply_token_bitmask_inplace",
    "bitmask_shape",
    "bitmask_words",
    "row_pointer",
]


def bitmask_words(vocab_size: int) -> int:
    """Number of int32 words per bitmask row for ``vocab_size`` tokens."""
    return (vocab_size + 31) // 32


def bitmask_shape(batch_size: int, vocab_size: int) -> tuple[int, int]:
    return (batch_size, bitmask_words(vocab_size))


def allocate_token_bitmask(batch_size: int, vocab_size: int, *,
                           kind: Literal["torch", "numpy"] = "torch") -> Any:
    """A CPU bitmask with every token allowed (all bits set), as torch or numpy."""
    if batch_size < 1 or vocab_size < 1:
        raise ValueError(f"batch_size and vocab_size must be positive, not {batch_size}, {vocab_size}")
    shape = bitmask_shape(batch_size, vocab_size)
    if kind == "numpy":
        return np.full(shape, -1, dtype=np.int32)
    if kind == "torch":
        import torch

        return torch.full(shape, -1, dtype=torch.int32)
    raise ValueError(f"kind must be 'torch' or 'numpy', not {kind!r}")


def row_pointer(bitmask: Any, index: int, words: int) -> tuple[int, int]:
    """``(address, byte size)`` of row ``index`` of a CPU int32 bitmask, checked.

    Raises ``TypeError`` / ``ValueError`` on misuse (wrong dtype, device, shape, index):
    a wrong pointer here would corrupt memory, so nothing is left to ``assert``.
    """
    if isinstance(bitmask, np.ndarray):
        if bitmask.dtype != np.int32:
            raise TypeError(f"bitmask must be int32, not {bitmask.dtype}")
        if bitmask.ndim != 2:
            raise ValueError(f"bitmask must be 2-D [batch, words], not shape {bitmask.shape}")
        _check_row(bitmask.shape, index, words)
        row = bitmask[index]
        if not row.flags["C_CONTIGUOUS"] or not bitmask.flags["WRITEABLE"]:
            raise ValueError("bitmask rows must be contiguous and writeable")
        return row.ctypes.data, words * 4
    if type(bitmask).__module__.startswith("torch"):
        import torch

        if bitmask.dtype != torch.int32:
            raise TypeError(f"bitmask must be int32, not {bitmask.dtype}")
        if bitmask.device.type != "cpu":
            raise ValueError("bitmask must be on the CPU (fill it there, then copy it to the device)")
        if bitmask.dim() != 2:
            raise ValueError(f"bitmask must be 2-D [batch, words], not shape {tuple(bitmask.shape)}")
        _check_row(tuple(bitmask.shape), index, words)
        row = bitmask[index]
        if not row.is_contiguous():
            raise ValueError("bitmask rows must be contiguous")
        return row.data_ptr(), words * 4
    raise TypeError(f"bitmask must be a torch tensor or a numpy array, not {type(bitmask).__name__}")


def _check_row(shape: tuple[int, ...], index: int, words: int) -> None:
    if not 0 <= index < shape[0]:
        raise IndexError(f"bitmask row {index} out of range for batch size {shape[0]}")
    if shape[1] != words:
        raise ValueError(f"bitmask rows must have {words} int32 words for this vocabulary, not {shape[1]}")


def allowed_token_ids(bitmask: Any, index: int = 0, vocab_size: int | None = None) -> np.ndarray:
    """The token ids allowed by row ``index`` (a numpy ``int64`` array, ascending)."""
    row = bitmask[index]
    if not isinstance(row, np.ndarray):
        row = row.cpu().numpy()
    bits = np.unpackbits(np.ascontiguousarray(row, dtype=np.int32).view(np.uint8), bitorder="little")
    if vocab_size is not None:
        bits = bits[:vocab_size]
    return np.flatnonzero(bits)


_BIT_TABLES: dict[Any, Any] = {}  # device -> [256, 8] bool: bit j of byte b


def _bit_table(device: Any) -> Any:
    table = _BIT_TABLES.get(device)
    if table is None:
        import torch

        bits = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little")
        table = _BIT_TABLES.setdefault(device, torch.from_numpy(bits.astype(bool)).to(device))
    return table


def apply_token_bitmask_inplace(logits: Any, bitmask: Any) -> None:
    """Set disallowed logits to ``-inf`` in place (torch tensors; any device).

    ``logits`` is ``[batch, vocab]`` or ``[vocab]``; ``bitmask`` is ``[batch, words]`` or
    ``[words]``. Logit columns beyond the mask's ``32 * words`` are disallowed; mask bits
    beyond the logits' width are ignored. No ``torch.compile`` (no warm-up): on CPU the
    bits are unpacked with numpy; on an accelerator the mask is
    copied there (4 bytes per 32 tokens) and unpacked with a 256-entry lookup table.
    """
    import torch

    if bitmask.dtype != torch.int32:
        raise TypeError(f"bitmask must be int32, not {bitmask.dtype}")
    if logits.dim() == 1:
        logits = logits.unsqueeze(0)
    if bitmask.dim() == 1:
        bitmask = bitmask.unsqueeze(0)
    if logits.dim() != 2 or bitmask.dim() != 2:
        raise ValueError("logits must be [batch, vocab] and bitmask [batch, words]")
    if logits.shape[0] != bitmask.shape[0]:
        raise ValueError(f"batch size mismatch: logits {logits.shape[0]}, bitmask {bitmask.shape[0]}")
    vocab = logits.shape[1]
    cutoff = 32 * bitmask.shape[1]
    if vocab > cutoff:
        logits[:, cutoff:] = float("-inf")
    n = min(vocab, cutoff)
    if logits.device.type == "cpu":
        _apply_unpacked(logits, bitmask, n)
    else:
        _apply_table(logits, bitmask, n)


def _apply_unpacked(logits: Any, bitmask: Any, n: int) -> None:
    """CPU: unpack the bits with numpy (bit ``t % 32`` of word ``t // 32``, any byte order)."""
    import torch

    packed = bitmask.cpu().contiguous().numpy().astype("<i4", copy=False).view(np.uint8)
    allowed = torch.from_numpy(np.unpackbits(packed, axis=1, count=n, bitorder="little"))
    logits[:, :n].masked_fill_(allowed == 0, float("-inf"))


def _apply_table(logits: Any, bitmask: Any, n: int) -> None:
    """Any device: copy the packed mask there and unpack it with a byte lookup table."""
    import torch

    device = logits.device
    if bitmask.device != device:
        bitmask = bitmask.to(device, non_blocking=True)
    packed = bitmask.contiguous().view(torch.uint8).long()
    allowed = _bit_table(device)[packed].reshape(bitmask.shape[0], -1)[:, :n]
    logits[:, :n].masked_fill_(~allowed, float("-inf"))
