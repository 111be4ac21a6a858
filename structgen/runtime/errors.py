"""Errors raised by the runtime core, all under :class:`structgen.errors.BackendError`.

The runtime's error contract:

* Running out of KV memory is *not* an error: :meth:`BlockPool.allocate` returns
  ``None`` and the :class:`~structgen.runtime.scheduler.Scheduler` evicts cached
  prefixes, queues, or preempts. Exhaustion never reaches the user.
* :class:`KVCapacityError` is raised (or attached to a finished sequence) only when a
  single sequence cannot fit in the whole KV pool even when it runs alone.
* :class:`ContextLengthError` is raised on admission when a prompt leaves no room in the
  model's context for a single generated token.
* :class:`KVCacheError` itself signals misuse of the bookkeeping API (double free,
  unlocking an unlocked node, mismatched lengths): a bug in the caller.
"""

from __future__ import annotations

from structgen.errors import BackendError

__all__ = ["ContextLengthError", "KVCacheError", "KVCapacityError"]

_BACKEND = "runtime"


class KVCacheError(BackendError):
    """The KV bookkeeping API was misused (double free, unbalanced unlock, ...)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, backend=_BACKEND, retryable=False)


class KVCapacityError(KVCacheError):
    """A sequence needs more KV blocks than the whole pool holds, even running alone.

    ``needed_tokens`` is what the sequence needs; ``capacity_tokens`` what the pool holds.
    """

    def __init__(self, seq_id: object, *, needed_tokens: int, capacity_tokens: int) -> None:
        self.seq_id = seq_id
        self.needed_tokens = needed_tokens
        self.capacity_tokens = capacity_tokens
        super().__init__(
            f"sequence {seq_id!r} needs KV for {needed_tokens} tokens but the pool holds "
            f"only {capacity_tokens}; shorten the prompt or max_new_tokens, or enlarge the pool"
        )


class ContextLengthError(BackendError):
    """A prompt does not leave room for one generated token in the model's context.

    ``prompt_tokens`` is the prompt's length; ``context_length`` the model's limit.
    """

    def __init__(self, seq_id: object, *, prompt_tokens: int, context_length: int) -> None:
        self.seq_id = seq_id
        self.prompt_tokens = prompt_tokens
        self.context_length = context_length
        super().__init__(
            f"sequence {seq_id!r}: a prompt of {prompt_tokens} tokens leaves no room in the "
            f"model's context of {context_length} tokens; shorten the prompt",
            backend=_BACKEND, retryable=False)
