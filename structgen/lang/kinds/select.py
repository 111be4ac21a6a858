"""The ``select`` request kind: ``select(...)`` -> :class:`SelectRequest` -> the chosen option.

Backends with ``select="logprobs"`` return per-choice token log-probabilities and the
scoring method (:mod:`structgen.lang.choices`) picks here; backends with
``select="choice"`` return the index a constrained generation chose.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

from structgen.contract.backend import Backend, SelectRequest, SelectResult, TextCallback
from structgen.errors import ProgramError, StructgenError
from structgen.lang.choices import method_by_name
from structgen.lang.ir import Select
from structgen.lang.kinds import RequestKind, register

if TYPE_CHECKING:
    from structgen.lang.interpreter import Interpreter, Pending

__all__ = ["SELECT"]


def _start(interp: Interpreter, node: Select, name: str) -> SelectRequest:
    if not node.choices:
        raise ProgramError("select needs at least one choice", variable=node.name)
    method = method_by_name(node.method)
    return SelectRequest(prompt=interp.text, choices=node.choices, temperature=node.temperature,
                         method=None if node.method is None else method.name,
                         need_unconditional=method.requires_unconditional_logprobs,
                         messages=interp.request_messages(), program=interp.program,
                         variable=name, group=interp.group, cancel=interp.cancel)


def _finish(interp: Interpreter, pending: Pending, result: SelectResult) -> None:
    node: Select = pending.node
    if result.index is not None:
        index, meta = result.index, dict(result.meta)
    else:
        if result.input_token_logprobs is None:
            raise ProgramError("backend returned neither logprobs nor a choice for select")
        method = method_by_name(node.method)
        decision = method(choices=node.choices, token_logprobs=result.input_token_logprobs,
                          unconditional_token_logprobs=result.unconditional_token_logprobs)
        index, meta = decision.index, {**result.meta, **decision.meta_info}
        if node.temperature > 0:
            index = _sample_index(meta["normalized_prompt_logprobs"], node.temperature, index)
    if not 0 <= index < len(node.choices):
        raise ProgramError(f"backend chose option {index} of {len(node.choices)}")
    choice = node.choices[index]
    interp.record(pending.name, choice, choice, meta)


def _sample_index(scores: list[float], temperature: float, default: int) -> int:
    finite = [s for s in scores if s != float("-inf")]
    if not finite:
        return default
    top = max(finite)
    weights = [math.exp((s - top) / temperature) if s != float("-inf") else 0.0 for s in scores]
    return random.choices(range(len(scores)), weights=weights)[0]


def _send(backend: Backend, requests: Sequence[SelectRequest],
          on_text: TextCallback | None) -> list[SelectResult | StructgenError]:
    return backend.select(requests)


async def _asend(backend: Backend, requests: Sequence[SelectRequest],
                 on_text: TextCallback | None) -> list[SelectResult | StructgenError]:
    return await backend.aselect(requests)


SELECT = register(RequestKind(
    name="select", node=Select, request=SelectRequest, start=_start, finish=_finish,
    check=Backend.check_select, send=_send, asend=_asend))
