"""Per-field confidence: the log-probabilities of the tokens that wrote each JSON leaf.

The constrained decode reports, per generated token, its log-probability
(``return_logprob=True``). Where the backend also reports it in the *constrained*
distribution (``output_token_constrained_logprobs``: the model's distribution renormalised
over the tokens the constraint allowed at that step -- the embedded backend does), that is
the one used (:func:`confidence_entries`): a value the constraint forces is then certain,
and a value is uncertain only when the model hesitated between values the schema allows.
Elsewhere the model's own log-probabilities are used. :func:`leaf_confidence` lays the tokens over the output text
and gives every leaf value (by JSON path) the mean and the minimum log-probability of the
tokens that overlap it -- a string's quotes included, since its first token often carries
the opening quote. Tokens the constraint forced without sampling carry no log-probability
and are left out; a leaf written only by forced tokens gets ``mean = min = 0.0`` (it had
no alternative). Given the ``source`` text the values were read from, each string or
number leaf also gets ``grounded`` (:mod:`structgen.grounding`: whether the value
occurs in the source), the signal the log-probability does not carry; and each string or
number leaf inside an array gets ``repeated`` (:mod:`structgen.extract.repetition`: it
copies what an earlier list item wrote for the same field, the mark of a small model's
list loop, whose copies are fluent and grounded). :func:`rank` orders leaves for review
with all three.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from structgen.errors import ProgramError
from structgen.extract.jsonspans import leaf_spans
from structgen.extract.repetition import Repeats
from structgen.grounding import Source

__all__ = ["TokenSpan", "confidence_entries", "leaf_confidence", "rank", "token_spans"]

#: (start, end, logprob or None) of one output token in the text
TokenSpan = tuple[int, int, float | None]


def confidence_entries(meta: Mapping[str, Any]) -> list[Any]:
    """A result's ``(logprob, token_id, token_text)`` entries for confidence: the constrained
    log-probabilities where the backend reports them, else ``output_token_logprobs``."""
    entries = list(meta.get("output_token_logprobs") or [])
    masked = meta.get("output_token_constrained_logprobs")
    if masked and len(masked) == len(entries):
        return [(lp, *tuple(e)[1:]) if isinstance(e, (list, tuple)) else lp
                for e, lp in zip(entries, masked, strict=True)]
    return entries


def token_spans(text: str, entries: Sequence[Any], decode: Callable[[list[int]], str] | None = None,
                offset: int = 0) -> list[TokenSpan]:
    """Character spans of the output tokens in ``text``.

    ``entries`` are a result's ``output_token_logprobs``: ``(logprob, token_id, token_text)``
    tuples. Token texts are used when present and they add up to ``text``; otherwise
    ``decode`` (the tokenizer's) turns growing prefixes of the ids into text. ``offset`` is
    added to every span (tokens continuing a kept prefix).
    """
    if not entries:
        return []
    logprobs = [_lp(e) for e in entries]
    texts = [e[2] if isinstance(e, (list, tuple)) and len(e) > 2 else None for e in entries]
    ends: list[int] = []
    if all(isinstance(t, str) for t in texts) and "".join(texts) == text[:sum(map(len, texts))]:  # type: ignore[arg-type]
        pos = 0
        for t in texts:
            pos += len(t)  # type: ignore[arg-type]
            ends.append(pos)
    elif decode is not None:
        ids = [int(e[1]) for e in entries]
        ends = [len(decode(ids[:k + 1])) for k in range(len(ids))]
    else:
        raise ProgramError("per-field confidence needs token texts (return_text_in_logprobs) or a tokenizer")
    out: list[TokenSpan] = []
    start = 0
    for end, lp in zip(ends, logprobs, strict=False):
        end = min(end, len(text))
        out.append((start + offset, max(end, start) + offset, lp))
        start = max(end, start)
    return out


def _lp(entry: Any) -> float | None:
    value = entry[0] if isinstance(entry, (list, tuple)) else entry
    return None if value is None else float(value)


def leaf_confidence(text: str, spans: Sequence[TokenSpan],
                    source: str | Source | None = None) -> dict[str, dict[str, Any]]:
    """``{json path: {"mean": ..., "min": ...}}`` for every leaf value of ``text``; with a
    ``source``, string and number leaves also get ``"grounded": bool``; string and number
    leaves inside arrays get ``"repeated": bool``."""
    src = Source(source) if isinstance(source, str) else source
    repeats = Repeats()
    out: dict[str, dict[str, Any]] = {}
    toks = sorted(spans)
    j = 0
    for leaf in leaf_spans(text):
        while j < len(toks) and toks[j][1] <= leaf.start:
            j += 1
        lps: list[float] = []
        k = j
        while k < len(toks) and toks[k][0] < leaf.end:
            lp = toks[k][2]
            if lp is not None and toks[k][1] > leaf.start:
                lps.append(lp)
            k += 1
        entry: dict[str, Any] = ({"mean": round(sum(lps) / len(lps), 4), "min": round(min(lps), 4)} if lps
                                 else {"mean": 0.0, "min": 0.0})
        if leaf.complete:
            try:
                value = json.loads(text[leaf.start:leaf.end])
            except ValueError:
                value = None
            repeated = repeats.repeated(leaf.path, value)
            if repeated is not None:
                entry["repeated"] = repeated
            found = src.grounded(value) if src is not None else None
            if found is not None:
                entry["grounded"] = found
        out[leaf.path] = entry
    return out


def rank(entry: Mapping[str, Any]) -> tuple[bool, bool, float]:
    """A leaf's confidence entry as a sort key, higher = more trustworthy: not a repeated
    list value first, then not known to be ungrounded, then the mean log-probability."""
    return (entry.get("repeated") is not True, entry.get("grounded") is not False, float(entry.get("mean", 0.0)))
