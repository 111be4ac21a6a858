"""The decode-engine protocol: what the embedded backend needs from the engine that runs
the model.

:class:`~structgen.backends.embedded.adapter.EmbeddedBackend` turns requests into
:class:`~structgen.backends.embedded.generation.GenSequence` objects (sampling, constraint,
stops) and token ids, and hands them to one :class:`DecodeEngine`; it never looks inside
it. The implementation is the batched :class:`~structgen.backends.embedded.engine.Engine`
(radix prefix cache, continuous scheduling, owned forward pass).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from structgen.backends.embedded.generation import GenSequence
from structgen.errors import StructgenError

__all__ = ["DecodeEngine", "Outcome"]

class Outcome(NamedTuple):
    """How one sequence ended: ``error`` (None when it finished normally; its text and
    finish reason are then on the sequence) and its KV counters (``cached_tokens``,
    ``computed_tokens``, ``forced_tokens``)."""

    error: StructgenError | None
    counters: Mapping[str, int]


class DecodeEngine(Protocol):
    """Runs sequences on a model. Thread-safe: any thread may call any method."""

    #: positions one sequence may use (prompt and output)
    context_length: int

    def generate(self, seqs: Sequence[GenSequence]) -> list[Outcome]:
        """Run ``seqs`` to completion (each until it finishes, fails or is cancelled
        through its request's ``Cancellation``, checked every step); one :class:`Outcome` per sequence, in order.
        One sequence's failure never fails another."""
        ...

    def score(self, prefix: Sequence[int], conts: Sequence[Sequence[int]]) -> list[list[float]]:
        """Log-probabilities of each continuation's tokens after ``prefix``."""
        ...

    def warm(self, token_ids: Sequence[int]) -> None:
        """Compute and cache ``token_ids`` (a prefix many requests share) ahead of them."""
        ...

    def cancel(self, seqs: Sequence[GenSequence]) -> None:
        """Stop ``seqs`` at the next step; their :meth:`generate` outcomes are RequestCancelled."""
        ...

    def stats(self) -> dict[str, Any]:
        """Counters since start: prompt / cached / computed tokens, forward passes..."""
        ...

    def clear_cache(self) -> None:
        """Drop every cached prefix (nothing running is affected)."""
        ...

    def close(self) -> None:
        """Stop the engine; sequences still running fail with a BackendError."""
        ...
