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


_SHIFTS: dict[Any, Any] = {}


def apply_token_bitmask_inplace(logits: Any, bitmask: Any) -> None:
    """Set disallowed logits to ``-inf`` in place (torch tensors; any device).

    ``logits`` is ``[batch, vocab]`` or ``[vocab]``; ``bitmask`` is ``[batch, words]`` or
    ``[words]`` (copied to the logits' device if needed). Logit columns beyond the mask's
    ``32 * words`` are disallowed; mask bits beyond the logits' width are ignored.
    A plain tensor expression (no ``torch.compile``), so no warm-up cost on CPU.
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
    device = logits.device
    if bitmask.device != device:
        bitmask = bitmask.to(device, non_blocking=True)
    shifts = _SHIFTS.get(device)
    if shifts is None:
        shifts = _SHIFTS.setdefault(device, torch.arange(32, dtype=torch.int32, device=device))
    vocab = logits.shape[1]
    cutoff = 32 * bitmask.shape[1]
    if vocab > cutoff:
        logits[:, cutoff:] = float("-inf")
    n = min(vocab, cutoff)
    allowed = ((bitmask.unsqueeze(-1) >> shifts) & 1).reshape(bitmask.shape[0], cutoff)[:, :n]
    logits[:, :n].masked_fill_(allowed == 0, float("-inf"))
