"""``tool_choice="auto"``'s first decision by relevance: does the question point at a tool?

A small model asked "call a tool or answer?" mostly calls (:mod:`structgen.tools.decision`
reads that call probability; on SmolLM2-135M it separates BFCL's call questions from its
irrelevant ones barely better than chance). A sharper signal costs two short scorings: how
much more likely the model finds each allowed tool's description *after the user's
question* than with no context at all -- the pointwise mutual information of question and
tool, per token::

    relevance(tool) = mean log p(TOOL | QUERY) - mean log p(TOOL | start of text)

with ``QUERY = "Question: <the last user message>\\n"`` and ``TOOL = "Function: <name>:
<description>"`` (:data:`QUERY`, :data:`TOOL`). It is ``select``'s
``unconditional_likelihood_normalized`` score, so any backend that scores ``select`` by
prompt log-probabilities serves it (one :class:`RelevanceRequest`, a ``select`` with
``need_unconditional``). The turn's relevance is the best tool's:

* at least ``relevance_threshold`` (:data:`DEFAULT_RELEVANCE_THRESHOLD`, or
  ``tool_choice={"mode": "auto", "relevance_threshold": r}``): the turn calls -- it is
  resolved again with a call forced among the allowed tools (``tool_choice="required"``'s
  grammar). The decision is made once: a second one inside the call block (``[]`` then an
  answer) would be the model's own call-or-answer choice, the weak signal this replaces.
  The calls written are then checked for their grounding (:mod:`structgen.tools.grounding`:
  did the conversation give their arguments?) and withdrawn for a plain answer below
  ``grounding_threshold``;
* below it: the turn is a plain answer (``tool_choice="none"``'s grammar).

It decides a turn that answers a user message; a turn after tool results (the model reads
them, then answers or calls again) keeps the call-probability probe. The score is in the
gen's meta (``tool_relevance``); ``relevance_threshold=None`` turns it off. Either way the
grammar is the constraint: every call that is made is valid.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from structgen.contract.backend import Message, SelectRequest, SelectResult
from structgen.lang.choices import unconditional_likelihood_normalized
from structgen.tools.decision import as_answer
from structgen.tools.spec import ToolCallSpec

__all__ = ["DEFAULT_RELEVANCE_THRESHOLD", "QUERY", "TOOL", "RelevanceRequest", "decide_relevance",
           "relevance_query", "relevance_request", "relevance_scores"]

#: the relevance at or above which ``auto`` commits to a call, in nats per token: calibrated
#: for SmolLM2-135M-Instruct with the grounding threshold (:mod:`structgen.tools.grounding`)
#: by ``bench/bfcl_calibrate.py --signal joint`` on BFCL records 100-139 of each category
#: (disjoint from those ``bench/bfcl.py`` scores): the pair that abstains on every irrelevant
#: question there -- ``bench/bfcl.py``'s goal is an irrelevance accuracy no lower than the
#: unconstrained model's, which never calls -- and calls the most (0.569 of the call
#: categories; relevance alone abstains on all at 1.228 and calls on 0.500). Relevance
#: alone, calibrated for balanced accuracy, was 0.992 (call 0.731, abstain 0.875; the call
#: probability's best balance was 0.650); other models should calibrate their own
DEFAULT_RELEVANCE_THRESHOLD = 0.967
#: the context the tools are scored after
QUERY = "Question: {query}\n"
#: one tool's scored text
TOOL = "Function: {name}: {description}"


@dataclass(frozen=True)
class RelevanceRequest(SelectRequest):
    """A tool turn's relevance scoring: a ``select`` over the allowed tools' texts
    (:data:`TOOL`) after the question (:data:`QUERY`), with unconditional scores."""


def relevance_query(messages: Sequence[Message]) -> str | None:
    """The user message the turn answers, or None when tool results came after it (or
    there is none, or it is blank)."""
    for m in reversed(messages):
        if m.role == "tool":
            return None
        if m.role == "user":
            text = m.content if isinstance(m.content, str) else ""
            return text.strip() or None
    return None


def relevance_request(spec: ToolCallSpec, query: str, **fields: object) -> RelevanceRequest:
    """The scoring request for ``spec``'s allowed tools (``fields``: program, variable...)."""
    texts = tuple(TOOL.format(name=t.name, description=" ".join((t.description or "").split()))
                  for t in spec.allowed_tools)
    return RelevanceRequest(prompt=QUERY.format(query=" ".join(query.split())), choices=texts,
                            need_unconditional=True, **fields)  # type: ignore[arg-type]


def relevance_scores(result: SelectResult) -> list[float]:
    """Per tool: the mean token log-probability after the question minus the mean with no
    context (nats per token) -- ``select``'s ``unconditional_likelihood_normalized`` score."""
    cond = result.input_token_logprobs or []
    uncond = result.unconditional_token_logprobs or []
    if len(cond) != len(uncond):
        raise ValueError(f"relevance scoring returned {len(cond)} conditional and {len(uncond)} "
                         "unconditional score lists")
    decision = unconditional_likelihood_normalized(choices=[""] * len(cond), token_logprobs=cond,
                                                   unconditional_token_logprobs=uncond)
    return list(decision.meta_info["normalized_unconditional_prompt_logprobs"])


def decide_relevance(spec: ToolCallSpec, scores: Sequence[float],
                     committed: Callable[[], ToolCallSpec] | None = None) -> ToolCallSpec:
    """The turn's spec once its relevance is known: a call (``committed()``, the turn with a
    call forced among the allowed tools; without it, ``spec``'s call block), or a plain answer."""
    best = max(scores, default=float("-inf"))
    threshold = spec.relevance_threshold
    if threshold is None:
        return dataclasses.replace(spec, call_threshold=None, relevance=best)
    if best >= threshold:
        called = spec if committed is None else committed()
        return dataclasses.replace(called, call_threshold=None, relevance_threshold=threshold, relevance=best,
                                   grounding_threshold=spec.grounding_threshold)
    return as_answer(spec, call_threshold=None, relevance=best, grounding_threshold=None)
