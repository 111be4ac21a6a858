"""What one forward pass computes: the scheduler's output to a model runner."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from structgen.runtime.seq_state import SeqState

__all__ = ["Batch", "BatchEntry"]


@dataclass(frozen=True)
class BatchEntry:
    """Compute KV for ``seq.token_ids[start:end]`` and sample the token after ``end``."""

    seq: SeqState
    start: int
    end: int

    @property
    def num_tokens(self) -> int:
        """Tokens this entry computes."""
        return self.end - self.start


@dataclass(frozen=True)
class Batch:
    """One forward pass: ``kind`` is ``"prefill"``, ``"decode"`` or ``"idle"`` (nothing to run)."""

    kind: Literal["prefill", "decode", "idle"]
    entries: tuple[BatchEntry, ...] = ()
    #: sequences that failed in this call (``seq.error`` set, status FINISHED)
    failed: tuple[SeqState, ...] = ()
    #: running sequences sent back to waiting in this call
    preempted: tuple[SeqState, ...] = field(default=())

    @property
    def seqs(self) -> list[SeqState]:
        """The sequences in this batch, in entry order."""
        return [e.seq for e in self.entries]

    @property
    def num_tokens(self) -> int:
        """Tokens computed by this batch."""
        return sum(e.num_tokens for e in self.entries)

    def __len__(self) -> int:
        return len(self.entries)
