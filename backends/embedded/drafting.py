"""Jump-forward over a constraint's forced text: forced runs, drafts and their verification.

When a sequence's constraint allows exactly one continuation (JSON keys, punctuation),
its forced tokens are appended at once and computed in the next single forward pass
instead of one pass each (:func:`forced_run`: whole tokens every tokenization shares,
so greedy output is unchanged). The forced text's tail -- the last token, held back
because it could merge with the free text that follows -- is *drafted*
(:meth:`Drafts.draft`): its tokens (as the model split the same text before, else
canonical) are computed in the same pass, with logits at each, and :func:`verify` keeps
each only if the sampler, looking at those logits under the constraint's mask, picks
it; the next token then comes from the same pass too. A rejected draft is dropped with
its KV. Sampling stays what token-by-token decoding would do (the sampler draws every
token; a draft only saves the pass when the draw agrees).
"""

from __future__ import annotations

import torch

from structgen.backends.embedded.generation import GenSequence

__all__ = ["MAX_DRAFT", "Drafts", "forced_run", "may_jump", "verify"]

MAX_DRAFT = 16  # drafted tokens per sequence and pass
_MAX_TOKENIZATIONS = 4096  # remembered tokenizations of forced text


def may_jump(gen: GenSequence) -> bool:
    """Whether ``gen`` takes forced and drafted tokens (they have no sampled logprob)."""
    return gen.matcher is not None and not gen.params.return_logprob and not gen.finished


def forced_run(gen: GenSequence) -> tuple[list[int], bool]:
    """Accept the tokens the constraint forces after the last sampled one (llguidance's
    fast-forward tokens). ``(tokens, finished)``."""
    forced: list[int] = []
    assert gen.matcher is not None
    for tok in gen.matcher.forced_tokens():
        forced.append(tok)
        if gen.accept(tok):
            return forced, True
    return forced, False


def verify(gen: GenSequence, rows: torch.Tensor, draft: list[int]) -> tuple[int, bool, int]:
    """Sample from ``rows`` (``len(draft) + 1`` of them: the logits before each drafted
    token, then after the last) token by token, each under its mask, while the sampler
    picks the drafted token. ``(the next token, finished, drafted tokens accepted)``: the
    token is the first one not drafted -- new, its KV not computed yet; the caller drops
    the rejected rest of the draft with its KV."""
    for i, row in enumerate(rows):
        if i:
            gen.compute_mask()  # the mask after the accepted draft tokens
        token = gen.pick(row)
        finished = gen.accept(token)
        if i < len(draft) and token == draft[i] and not finished:
            continue
        return token, finished, i
    raise AssertionError("unreachable: the last row is never drafted")


class Drafts:
    """Drafting state shared by all sequences: how the model tokenized forced text before
    (it often splits JSON punctuation differently from the canonical tokenization)."""

    def __init__(self) -> None:
        self._tokenizations: dict[bytes, tuple[int, ...]] = {}

    def learn(self, gen: GenSequence, spans: list[tuple[bytes, int]]) -> list[tuple[bytes, int]]:
        """Record how ``gen``'s output covered earlier forced texts (``(text, index in the
        output where it starts)``); the spans its output has not covered yet."""
        assert gen.matcher is not None
        m = gen.matcher
        pending = []
        for text, start in spans:
            seen = b""
            for j, tok in enumerate(gen.out_ids[start:]):
                seen += m.token_bytes([tok])
                if len(seen) >= len(text):
                    if seen == text:
                        if len(self._tokenizations) >= _MAX_TOKENIZATIONS:
                            self._tokenizations.clear()
                        self._tokenizations[text] = tuple(gen.out_ids[start:start + j + 1])
                    break
            else:
                pending.append((text, start))
        return pending

    def draft(self, gen: GenSequence) -> tuple[list[int], tuple[bytes, int] | None]:
        """The tokens to draft after ``gen``'s output (no more than the room left before
        its last, sampled token) and the forced text's span, or ``([], None)``."""
        assert gen.matcher is not None
        text = gen.matcher.forced_text()
        if not text:
            return [], None
        room = min(MAX_DRAFT, gen.max_new - len(gen.out_ids) - 1)
        tokens = gen.matcher.draft_tokens(self._tokenizations.get(text))[:max(room, 0)]
        return list(tokens), (text, len(gen.out_ids))
