"""The ``generate`` request kind: ``gen(...)`` -> :class:`GenerateRequest` -> text in the state.

The result is validated against the gen's constraint and converted to its typed value
(a pydantic instance, parsed JSON, ``int``/``float``/``bool`` for ``dtype=``). An output
that fails validation is re-sampled ``retries`` times (warmer, reseeded) before the
:class:`~structgen.errors.OutputValidationError` stands; an exception raised while
checking the output is such an error too (with the raw text), never the program's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from structgen.contract.backend import (
    Backend,
    GenerateRequest,
    GenerateResult,
    Message,
    SamplingParams,
    SelectRequest,
    TextCallback,
)
from structgen.errors import BackendError, OutputValidationError, StructgenError, map_error
from structgen.lang.ir import Gen
from structgen.lang.kinds import RequestKind, register

if TYPE_CHECKING:
    from structgen.lang.interpreter import Interpreter, Pending

__all__ = ["GENERATE", "convert_dtype", "generate_request", "typed_value"]


def _start(interp: Interpreter, node: Gen, name: str) -> GenerateRequest | SelectRequest:
    constraint = node.constraint
    params = node.sampling(interp.defaults)
    if getattr(constraint, "kind", None) == "tool_request":  # gen(tools=...): this backend's format
        constraint = interp.resolve_tools(constraint, params.max_new_tokens)
        if interp.ranks and getattr(constraint, "relevance_threshold", None) is not None:
            from structgen.tools.relevance import relevance_query, relevance_request

            # auto's first decision by relevance: the tools scored after the user's question
            query = relevance_query(interp.request_messages())
            if query is not None and constraint.allowed_tools:
                return relevance_request(constraint, query, program=interp.program, variable=name,
                                         group=interp.group, cancel=interp.cancel)
        if interp.scores and getattr(constraint, "call_threshold", None) is not None:
            from structgen.tools.decision import probe_params

            # auto's first decision, scored by the model: one token's top log-probabilities
            return generate_request(interp, name, probe_params(params), None)
    return generate_request(interp, name, params, constraint)


def generate_request(interp: Interpreter, name: str, params: SamplingParams, constraint: Any) -> GenerateRequest:
    """The request continuing ``interp``'s text for variable ``name``."""
    return GenerateRequest(prompt=interp.text, params=params, constraint=constraint,
                           messages=interp.request_messages(), program=interp.program, variable=name,
                           group=interp.group, cancel=interp.cancel)


def _finish(interp: Interpreter, pending: Pending, result: GenerateResult) -> None:
    node: Gen = pending.node
    text = result.text
    if not isinstance(text, str):
        raise BackendError(f"the backend returned {type(text).__name__} content where text was "
                           f"expected: {str(text)[:200]!r}")
    constraint = pending.request.constraint
    if constraint is None and getattr(node.constraint, "kind", None) == "tool_request":  # the decision made
        from structgen.tools.decision import decide

        params = node.sampling(interp.defaults)
        spec = decide(interp.resolve_tools(node.constraint, params.max_new_tokens), result.meta)
        request = replace(pending.request, params=params, constraint=spec)
        interp.resend(replace(pending, request=request, hold=node.retries > 0))
        return
    meta = dict(result.meta)
    finish = result.finish_reason
    if getattr(constraint, "staged_budget", None) is not None:  # a tool turn written call by call
        from structgen.tools.staging import Carry, next_stage, written_calls

        carry = (pending.carry or Carry(first=pending.request)).add(text, meta)
        written = written_calls(constraint, carry.text) if finish == "stop" else None  # parsed once per stage
        question = _coverage_question(constraint, carry)
        dropped = carry.before is not None and not _covers(carry, written, question)
        if dropped:  # the call coverage asked for added none: the block ends before it
            carry, finish = carry.drop().closed(constraint), "stop"
        elif written and len(written) > carry.calls:  # this stage wrote a call: the block's end or one more
            from structgen.tools.coverage import uncovered

            done, left = len(written), constraint.staged_budget - carry.tokens
            owed = uncovered(question, written) if question is not None else set()
            force = bool(owed)
            stage = next_stage(constraint, remaining=left, calls_done=done, force=force, steer=owed)
            if stage is not None:
                req: GenerateRequest = pending.request
                request = replace(req, prompt=req.prompt + text, params=replace(req.params, max_new_tokens=left),
                                  constraint=stage, messages=_continued(req.messages, text))
                after = replace(carry, calls=done, before=None)
                # a stage coverage asks for may be dropped: from there the turn is held, not streamed
                interp.resend(replace(pending, request=request, hold=pending.hold or force,
                                      carry=replace(after, before=after) if force else after))
                return
            carry = carry.closed(constraint)  # no further call fits: the block ends here
        text, meta = carry.text, carry.meta(meta)
    meta.setdefault("finish_reason", finish)
    if constraint is None:  # free text (the common case: nothing to check)
        value: Any = text
    else:
        truncated = finish == "length"
        try:
            value = typed_value(node, text, truncated=truncated, constraint=constraint)
        except Exception as exc:
            err = map_error(exc, "output", raw=text, truncated=truncated)
            if isinstance(err, OutputValidationError) and pending.attempt < node.retries:
                _retry(interp, pending)
                return
            if err is exc:
                raise
            raise err from exc
        if _withdrawn(interp, pending, constraint, text, value, meta):
            return
        _tool_meta(meta, constraint, text, value)
    if pending.attempt:
        meta["attempts"] = pending.attempt + 1
    interp.record(pending.name, text, value, meta, streamed=pending.streamed)


def _coverage_question(constraint: Any, carry: Any) -> str | None:
    """The user message a staged parallel turn's calls should cover (:mod:`structgen.tools.coverage`),
    or None where coverage does not apply (off, one call, after tool results)."""
    if not getattr(constraint, "coverage", False) or constraint.max_calls < 2:
        return None
    from structgen.tools.relevance import relevance_query

    return relevance_query(carry.first.messages)


def _covers(carry: Any, written: list[Any] | None, question: str | None) -> bool:
    """Whether the call a coverage stage wrote stands: whole, new, and adding coverage."""
    if not written or len(written) <= carry.before.calls or question is None:
        return False
    from structgen.tools.coverage import adds_coverage

    return adds_coverage(question, written[:-1], written[-1])


def _continued(messages: tuple[Message, ...], text: str) -> tuple[Message, ...]:
    """``messages`` with ``text`` added to the open assistant turn (the last message)."""
    if messages and messages[-1].role == "assistant":
        return (*messages[:-1], replace(messages[-1], content=messages[-1].content + text))
    return messages


def _withdrawn(interp: Interpreter, pending: Pending, constraint: Any, text: str, value: Any,
               meta: dict[str, Any]) -> bool:
    """Whether ``auto``'s committed calls were withdrawn for their grounding (the conversation
    did not give their arguments: :mod:`structgen.tools.grounding`); the turn is then sent
    again from its first request as a plain answer."""
    threshold = getattr(constraint, "grounding_threshold", None)
    calls = getattr(value, "calls", None)
    if threshold is None or getattr(constraint, "relevance", None) is None or not calls:
        return False  # not a turn relevance committed to (no scoring: the probe or the grammar decided)
    from structgen.tools.decision import as_answer
    from structgen.tools.grounding import call_grounding, grounding_source

    first = pending.carry.first if pending.carry is not None else pending.request
    grounding = call_grounding(calls, constraint.allowed_tools, grounding_source(first.messages))
    meta["tool_grounding"] = grounding
    if grounding is None or grounding >= threshold:
        return False
    answer = as_answer(constraint, grounding_threshold=None, grounding=grounding, declined_calls=text,
                       staged_budget=None)
    interp.resend(replace(pending, request=replace(first, constraint=answer), carry=None))
    return True


def _tool_meta(meta: dict[str, Any], constraint: Any, text: str, value: Any) -> None:
    """A thinking section and a tool-calling turn's calls, in the gen's meta information."""
    think = getattr(constraint, "think", None)
    if think is not None:
        from structgen.tools.calls import split_thinking

        meta["thinking"] = split_thinking(text, think)[0]
    if getattr(constraint, "call_probability", None) is not None:
        meta["call_probability"] = constraint.call_probability
    if getattr(constraint, "relevance", None) is not None:
        meta["tool_relevance"] = constraint.relevance
        parts = getattr(constraint, "relevance_parts", None) or ()
        names = getattr(constraint, "relevance_names", None) or [t.name for t in constraint.allowed_tools]
        meta["tool_scores"] = [{"name": n, "model": m, "lexical": x} for n, (m, x) in zip(names, parts, strict=False)]
        if getattr(constraint, "routed", None) is not None:
            meta["tool_routed"] = constraint.routed
    if getattr(constraint, "declined_calls", None) is not None:  # withdrawn for their grounding
        meta["tool_grounding"], meta["declined_calls"] = constraint.grounding, constraint.declined_calls
    calls = getattr(value, "calls", None)
    if calls is not None and hasattr(value, "is_answer"):  # a tool-calling turn
        meta["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": c.raw_arguments} for c in calls]


def _on_error(interp: Interpreter, pending: Pending, error: BaseException) -> bool:
    """An output problem the backend found (e.g. its own check of a server's text) is
    re-sampled under ``retries=`` like one found here."""
    if isinstance(error, OutputValidationError) and pending.attempt < pending.node.retries:
        _retry(interp, pending)
        return True
    return False


def _retry(interp: Interpreter, pending: Pending) -> None:
    """Re-sample after a failed validation (greedy would repeat itself)."""
    req: GenerateRequest = pending.request if pending.carry is None else pending.carry.first  # a staged turn
    attempt = pending.attempt + 1
    params = replace(req.params, temperature=max(req.params.temperature, 0.7),
                     seed=(req.params.seed or 0) + attempt)
    interp.resend(replace(pending, request=replace(req, params=params), attempt=attempt, streamed=0, carry=None))


def typed_value(node: Gen, text: str, *, truncated: bool, constraint: Any = None) -> Any:
    """Validate constrained output and convert it to its typed value (``constraint``: the
    one the request carried, when the gen's was resolved for the backend: tool calls)."""
    constraint = constraint if constraint is not None else node.constraint
    if constraint is None:
        return text
    from structgen.constraints.validation import validate_output

    value = validate_output(constraint, text, truncated=truncated)
    if node.dtype is not None:
        return convert_dtype(node.dtype, text)
    return value


def convert_dtype(dtype: Any, text: str) -> Any:
    """The typed value of ``dtype=`` output (``int``, ``float``, ``bool``, ``str``; else JSON)."""
    raw = text.strip()
    if dtype in (int, "int"):
        return int(raw)
    if dtype in (float, "float"):
        return float(raw)
    if dtype in (bool, "bool"):
        return raw == "True"
    if dtype in (str, "str"):
        return raw[1:-1] if len(raw) >= 2 and raw[0] == raw[-1] == '"' else raw
    return json.loads(raw)


def _send(backend: Backend, requests: Sequence[GenerateRequest],
          on_text: TextCallback | None) -> list[GenerateResult | StructgenError]:
    return backend.generate(requests, on_text=on_text)


async def _asend(backend: Backend, requests: Sequence[GenerateRequest],
                 on_text: TextCallback | None) -> list[GenerateResult | StructgenError]:
    return await backend.agenerate(requests, on_text=on_text)


GENERATE = register(RequestKind(
    name="generate", node=Gen, request=GenerateRequest, start=_start, finish=_finish,
    check=Backend.check_generate, send=_send, asend=_asend, streams=True, on_error=_on_error))
