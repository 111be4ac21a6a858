"""One generation in flight: sampling, constraint state, detokenization and stop checks.

A :class:`GenSequence` knows nothing about the model. The decode engine feeds it logits
(:meth:`pick`) and the chosen token (:meth:`accept`), and asks it for the constraint
mask of the next step (:meth:`compute_mask`, safe to run in a worker thread while the
model computes the next logits, since it touches only the matcher and the bitmask).

Finishing rules (SGLang semantics): EOS (unless ``ignore_eos``), a stop token id, a
stop string or stop regex (the text ends before the match), the constraint completing
(its matcher stopped), or ``max_new_tokens`` -- or the model's context, whichever
comes first (``finish_reason="length"``). Before ``min_new_tokens`` tokens, only those
limits or the constraint completing end a sequence. Under a constraint, EOS is allowed
only where the matcher accepts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from structgen.backends.embedded.sampler import Sampler, TokenMask, masked_logprob, token_mask
from structgen.backends.embedded.text import IncrementalDetokenizer, StopMatcher
from structgen.constraints.bitmask import allocate_token_bitmask
from structgen.contract.backend import Cancellation, GenerateRequest, GenerateResult
from structgen.errors import BackendError, ConstraintError

__all__ = ["GenSequence"]


class GenSequence:
    """``cancel``: the request's :class:`~structgen.contract.backend.Cancellation`; once
    set, the engine drops this sequence at its next step with ``cancel.error()``."""

    def __init__(self, request: GenerateRequest, prompt_ids: Sequence[int], *,
                 decode: Callable[[Sequence[int]], str], eos_ids: frozenset[int], vocab: int,
                 compiled: Any = None, emit: Callable[[str], None] | None = None,
                 token_text: Callable[[int], str] | None = None,
                 cancel: Cancellation | None = None):
        p = request.params
        self.request = request
        self.params = p
        self.prompt_ids = list(prompt_ids)
        self.out_ids: list[int] = []
        #: the most tokens this sequence may generate: max_new_tokens, or less when
        #: the engine caps it to the model's context (:meth:`cap_total`)
        self.max_new = p.max_new_tokens
        self.eos_ids = eos_ids
        self.stop_ids = frozenset(p.stop_token_ids)
        self.vocab = vocab
        self.cancel = cancel
        #: an error raised off the engine's loop (the mask worker) for this sequence
        self.fault: BaseException | None = None
        self.sampler = Sampler(p, vocab)
        try:
            self.stops = StopMatcher(p.stop, p.stop_regex)
        except ValueError as exc:
            raise ConstraintError(f"stop_regex cannot be matched: {exc}",
                                  constraint=", ".join(map(repr, p.stop_regex))) from None
        self.detok = IncrementalDetokenizer(decode, self.prompt_ids)
        self._emit = emit
        self._token_text = token_text
        self._emitted = 0
        self.text: str | None = None  # final text, set when finished
        self.finish_reason: str | None = None
        self.matched: Any = None
        self.logprobs: list[tuple[float, int, str | None]] = []
        self.top_logprobs: list[list[tuple[float, int, str | None]]] = []
        #: under a constraint, each token's log-probability in the constrained distribution
        #: (the model's, renormalised over the tokens the mask allowed at that step)
        self.constrained_logprobs: list[float] = []
        self.matcher = compiled.matcher() if compiled is not None else None
        self.bitmask = allocate_token_bitmask(1, vocab) if compiled is not None else None
        self._mask: TokenMask | None = None  # the next step's mask, unpacked by compute_mask
        if p.max_new_tokens <= 0:
            self._finish("length")
        elif self.matcher is not None and self.matcher.is_stopped():
            self._finish("stop", "constraint")

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.cancelled

    def cap_total(self, context_length: int) -> None:
        """Generate no further than ``context_length`` positions (prompt included)."""
        self.max_new = min(self.max_new, context_length - len(self.prompt_ids))
        if self.max_new <= 0 and not self.finished:
            self._finish("length")

    @property
    def constrained(self) -> bool:
        return self.matcher is not None

    @property
    def kv_ids(self) -> list[int]:
        """The tokens whose KV the model has computed: the prompt and all but the last output."""
        return self.prompt_ids + self.out_ids[:-1]

    # -- one step -------------------------------------------------------------------
    def compute_mask(self) -> None:
        """Fill the bitmask for the next token (worker-thread safe: matcher and bitmask only)."""
        if self.matcher is not None and self.bitmask is not None:
            self.matcher.fill_bitmask(self.bitmask, 0)
            self._mask = token_mask(self.bitmask[0], self.vocab)

    def compute_mask_safely(self) -> None:
        """:meth:`compute_mask`, keeping an error in :attr:`fault` (raised by :meth:`pick`)."""
        try:
            self.compute_mask()
        except Exception as exc:
            self.fault = exc

    def _banned(self) -> list[int]:
        before_min = len(self.out_ids) < (self.params.min_new_tokens or 0)
        banned: set[int] = set()
        if before_min or self.params.ignore_eos:
            banned |= self.eos_ids
        if before_min:
            banned |= self.stop_ids
        return sorted(banned)  # under a constraint, its mask allows EOS only where it accepts

    def pick(self, logits: torch.Tensor) -> int:
        """Choose the next token from ``logits`` (``[vocab]``, float32, CPU; modified)."""
        if self.fault is not None:
            fault, self.fault = self.fault, None
            raise fault
        p = self.params
        raw = torch.log_softmax(logits, dim=-1) if p.return_logprob else None
        token = self.sampler.choose(logits, self._mask, self._banned())
        if raw is not None:
            self.logprobs.append((float(raw[token]), token, self._text_of(token)))
            if self._mask is not None:
                self.constrained_logprobs.append(masked_logprob(raw, self._mask, token))
            if p.top_logprobs_num:
                top = torch.topk(raw, min(p.top_logprobs_num, raw.numel()))
                self.top_logprobs.append([(float(v), int(t), self._text_of(int(t)))
                                          for v, t in zip(top.values, top.indices, strict=True)])
        return token

    def _text_of(self, token: int) -> str | None:
        if self.params.return_text_in_logprobs and self._token_text is not None:
            return self._token_text(token)
        return None

    def accept(self, token: int) -> bool:
        """Append the chosen token; ``True`` when the sequence has finished."""
        self.out_ids.append(token)
        self.sampler.observe(token)
        n = len(self.out_ids)
        may_stop = n >= (self.params.min_new_tokens or 0)
        is_eos = token in self.eos_ids and not self.params.ignore_eos
        m = self.matcher
        if m is not None and not (is_eos and m.is_accepting()) and not m.consume(token):
            raise BackendError(f"constraint rejected token {token}: {m.error()}", backend="embedded")
        if may_stop and is_eos:
            return self._finish("stop", token)
        if may_stop and token in self.stop_ids:
            return self._finish("stop", token)
        self.detok.push(token)
        if self.stops:  # searched at every token (incrementally), honoured after min_new_tokens
            hit = self.stops.update(self.detok.text)
            if may_stop and hit is not None:
                return self._finish("stop", hit[1], cut=hit[0])
        if self.matcher is not None and self.matcher.is_stopped():
            return self._finish("stop", "constraint")
        if n >= self.max_new:
            return self._finish("length")
        text = self.detok.text
        self._stream(text, self.stops.safe_len(text) if self.stops else len(text))
        return False

    # -- finishing --------------------------------------------------------------------
    def _finish(self, reason: str, matched: Any = None, cut: int | None = None) -> bool:
        if cut is None:
            self.detok.flush()
            text = self.detok.text
            if self.stops and len(self.out_ids) >= (self.params.min_new_tokens or 0):
                hit = self.stops.update(text, ended=True)
                if hit is not None:
                    cut, matched, reason = hit[0], hit[1], "stop"
        text = self.detok.text if cut is None else self.detok.text[:cut]
        self.text = text
        self.finish_reason = reason
        self.matched = matched
        self._stream(text, len(text))
        return True

    def _stream(self, text: str, upto: int) -> None:
        if self._emit is not None and upto > self._emitted:
            self._emit(text[self._emitted:upto])
            self._emitted = upto

    def result(self, meta: dict[str, Any]) -> GenerateResult:
        if self.text is None or self.finish_reason is None:
            raise BackendError("sequence has not finished", backend="embedded")
        if self.matcher is not None and self.finish_reason == "stop" and self.matcher.error():
            raise ConstraintError(f"constraint failed during generation: {self.matcher.error()}")
        info: dict[str, Any] = {"type": self.finish_reason}
        if self.finish_reason == "length":
            info["length"] = len(self.out_ids)
        elif self.matched is not None:
            info["matched"] = self.matched
        meta = {**meta, "completion_tokens": len(self.out_ids), "finish_reason": info}
        if self.params.return_logprob:
            meta["output_token_logprobs"] = list(self.logprobs)
            if self.matcher is not None and len(self.constrained_logprobs) == len(self.logprobs):
                meta["output_token_constrained_logprobs"] = list(self.constrained_logprobs)
            if self.params.top_logprobs_num:
                meta["output_top_logprobs"] = list(self.top_logprobs)
        return GenerateResult(text=self.text, finish_reason=self.finish_reason,  # type: ignore[arg-type]
                              meta=meta)
