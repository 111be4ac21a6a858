"""``tool_choice="auto"``'s first decision by relevance: does the question point at a tool?

A small model asked "call a tool or answer?" mostly calls (:mod:`structgen.tools.decision`
reads that call probability; on SmolLM2-135M it separates BFCL's call questions from its
irrelevant ones barely better than chance). A sharper signal costs two short scorings: how
much more likely the model finds each allowed tool's description *after the user's
question* than with no context at all -- the pointwise mutual information of question and
tool, per token::

    gain(tool) = mean log p(TOOL | QUERY) - mean log p(TOOL | start of text)

with ``QUERY = "Question: <the last user message>\\n"`` and ``TOOL = "Function: <name>:
<description>"`` (:data:`QUERY`, :data:`TOOL`). It is ``select``'s
``unconditional_likelihood_normalized`` score, so any backend that scores ``select`` by
prompt log-probabilities serves it (one :class:`RelevanceRequest`, a ``select`` with
``need_unconditional``). The small model's gain is still a weak signal, so a tool's
relevance adds how many of the tool's own words the question uses
(:mod:`structgen.tools.lexical`, computed when the request is built)::

    relevance(tool) = MODEL_WEIGHT * gain(tool) + lexical(tool)

The turn's relevance is the best tool's:

* at least ``relevance_threshold`` (:data:`DEFAULT_RELEVANCE_THRESHOLD`, or
  ``tool_choice={"mode": "auto", "relevance_threshold": r}``): the turn calls -- it is
  resolved again with a call forced among the allowed tools (``tool_choice="required"``'s
  grammar). The decision is made once: a second one inside the call block (``[]`` then an
  answer) would be the model's own call-or-answer choice, the weak signal this replaces.
  A turn that may make one call is *routed*: the call is forced to the most relevant allowed
  tool (:func:`routed_tool`; ``tool_choice={"route": False}`` leaves the choice among the
  allowed tools to the model). On BFCL's multiple-function records 100-179 the relevance
  argmax named a right function for 80 of 80 questions, SmolLM2-135M's own choice for 59.
  The calls written are then checked for their grounding (:mod:`structgen.tools.grounding`:
  did the conversation give their arguments?) and withdrawn for a plain answer below
  ``grounding_threshold``;
* below it: the turn is a plain answer (``tool_choice="none"``'s grammar).

It decides a turn that answers a user message; a turn after tool results (the model reads
them, then answers or calls again) keeps the call-probability probe. The score is in the
gen's meta (``tool_relevance``; each allowed tool's two parts in ``tool_scores``);
``relevance_threshold=None`` turns the decision off. Either way the
grammar is the constraint: every call that is made is valid.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from structgen.contract.backend import Message, SelectRequest, SelectResult
from structgen.lang.choices import unconditional_likelihood_normalized
from structgen.tools.decision import as_answer
from structgen.tools.lexical import lexical_scores
from structgen.tools.spec import ToolCallSpec

__all__ = ["DEFAULT_RELEVANCE_THRESHOLD", "MODEL_WEIGHT", "QUERY", "TOOL", "RelevanceRequest", "combined",
           "decide_relevance", "relevance_query", "relevance_request", "relevance_scores", "routed_tool"]

#: the relevance at or above which ``auto`` commits to a call (``MODEL_WEIGHT`` times nats
#: per token, plus words): calibrated for SmolLM2-135M-Instruct with the grounding threshold
#: (:mod:`structgen.tools.grounding`) by ``bench/bfcl_calibrate.py --signal joint`` on BFCL
#: records 100-179 of each category (disjoint from those ``bench/bfcl.py`` scores): of the
#: pairs that abstain on every irrelevant question there -- ``bench/bfcl.py``'s goal is an
#: irrelevance accuracy no lower than the unconstrained model's, which never calls -- the one
#: whose kept calls are right the most (with routing, :func:`routed_tool`: accuracy 0.181,
#: calling on 0.791 of the call categories; relevance alone abstains on all at 3.427:
#: accuracy 0.116, call rate 0.672; before routing the same pair scored 0.163).
#: The model's gain alone (before the lexical count) abstained on all at 1.228 and called on
#: 0.500; other models should calibrate their own
DEFAULT_RELEVANCE_THRESHOLD = 1.936
#: the weight of the model's gain (nats per token) against the lexical count (words the
#: question shares with the tool, :mod:`structgen.tools.lexical`) in a tool's relevance.
#: Chosen with :data:`~structgen.tools.lexical.DESCRIPTION_WEIGHT` from a small grid
#: (0, 0.5, 1, 2 here; 0-6 there) on stored committed calls of both BFCL slices, so unlike
#: the thresholds these two were not chosen on the calibration slice alone
MODEL_WEIGHT = 0.5
#: the context the tools are scored after
QUERY = "Question: {query}\n"
#: one tool's scored text
TOOL = "Function: {name}: {description}"


@dataclass(frozen=True)
class RelevanceRequest(SelectRequest):
    """A tool turn's relevance scoring: a ``select`` over the allowed tools' texts
    (:data:`TOOL`) after the question (:data:`QUERY`), with unconditional scores;
    ``lexical``: each allowed tool's words the question uses (:mod:`structgen.tools.lexical`)."""

    lexical: tuple[float, ...] = ()


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
                            need_unconditional=True, lexical=tuple(lexical_scores(query, spec.allowed_tools)),
                            **fields)  # type: ignore[arg-type]


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


def combined(model: float, lexical: float) -> float:
    """One tool's relevance: :data:`MODEL_WEIGHT` times the model's gain plus the lexical count."""
    return MODEL_WEIGHT * model + lexical


def decide_relevance(spec: ToolCallSpec, scores: Sequence[float],
                     committed: Callable[[str | None], ToolCallSpec] | None = None,
                     lexical: Sequence[float] = ()) -> ToolCallSpec:
    """The turn's spec once its relevance is known: a call (``committed(tool)``, the turn with
    a call forced among the allowed tools -- or, when routed, the most relevant one; without
    it, ``spec``'s call block), or a plain answer. ``scores``: the model's gain per allowed
    tool; ``lexical``: their lexical counts (none: 0)."""
    if lexical and len(lexical) != len(scores):
        raise ValueError(f"{len(scores)} relevance scores and {len(lexical)} lexical counts")
    parts = tuple(zip(scores, lexical or [0.0] * len(scores), strict=True))
    names = tuple(t.name for t in spec.allowed_tools)
    totals = [combined(m, x) for m, x in parts]
    best = max(totals, default=float("-inf"))
    threshold = spec.relevance_threshold
    scored = {"relevance": best, "relevance_parts": parts, "relevance_names": names}
    if threshold is None:
        return dataclasses.replace(spec, call_threshold=None, **scored)  # type: ignore[arg-type]
    if best >= threshold:
        route = routed_tool(spec, names, totals)
        called = spec if committed is None else committed(route)
        return dataclasses.replace(called, call_threshold=None, relevance_threshold=threshold, routed=route,
                                   grounding_threshold=spec.grounding_threshold, **scored)  # type: ignore[arg-type]
    return as_answer(spec, call_threshold=None, grounding_threshold=None, **scored)


def routed_tool(spec: ToolCallSpec, names: Sequence[str], totals: Sequence[float]) -> str | None:
    """The tool a committed one-call turn is routed to: the most relevant allowed one (the
    first on a tie); None when routing is off, the turn may make several calls (each may
    want another tool) or only one tool is allowed."""
    if not spec.route or spec.max_calls != 1 or len(names) < 2 or len(totals) != len(names):
        return None
    return names[max(range(len(totals)), key=totals.__getitem__)]
