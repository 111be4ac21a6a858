"""The ``tool_relevance`` request kind: a tool turn's first decision, scored as a ``select``.

``gen(tools=..., tool_choice="auto")`` in the injected format, on a backend that scores
``select`` by log-probabilities, first sends a :class:`~structgen.tools.relevance.RelevanceRequest`
(the allowed tools' texts after the user's question, with unconditional scores); its result
decides the turn (:func:`~structgen.tools.relevance.decide_relevance`) and the generation is
sent as a ``generate`` request. No IR node starts this kind: the ``generate`` kind's start does.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from structgen.contract.backend import Backend, SelectResult
from structgen.errors import StructgenError
from structgen.lang.kinds import RequestKind, register
from structgen.lang.kinds.generate import GENERATE, generate_request
from structgen.lang.kinds.select import SELECT
from structgen.tools.relevance import RelevanceRequest, decide_relevance, relevance_scores

if TYPE_CHECKING:
    from structgen.lang.interpreter import Interpreter, Pending

__all__ = ["RELEVANCE"]


def _start(interp: Interpreter, node: object, name: str) -> RelevanceRequest:
    raise StructgenError("the tool_relevance kind is started by a tool turn, not by a node")


def _finish(interp: Interpreter, pending: Pending, result: SelectResult) -> None:
    node = pending.node
    params = node.sampling(interp.defaults)
    budget = params.max_new_tokens
    spec = decide_relevance(interp.resolve_tools(node.constraint, budget), relevance_scores(result),
                            committed=lambda only: interp.resolve_tools(node.constraint.committed(only), budget),
                            lexical=getattr(pending.request, "lexical", ()))
    request = generate_request(interp, pending.name, params, spec)
    checked = spec.grounding_threshold is not None and spec.mode != "none"  # its calls may be withdrawn: held
    interp.resend(replace(pending, kind=GENERATE, request=request, hold=node.retries > 0 or checked))


RELEVANCE = register(RequestKind(
    name="tool_relevance", node=None, request=RelevanceRequest, start=_start, finish=_finish,
    check=Backend.check_select, send=SELECT.send, asend=SELECT.asend))  # sent as a select
