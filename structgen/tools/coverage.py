"""A parallel turn's coverage: the numbers the user gave that no call has used yet.

A small model asked for "the factorial of 5, 10 and 15" with parallel calls allowed writes
``factorial(5)`` and closes the block: after each call its choice between the block's end
and one more call is its own weak call-or-stop decision (on BFCL's parallel questions the
135M model stops after the first call on nearly all of them). The question itself says
more is owed: it holds numbers no call has used. So a staged parallel turn
(:mod:`structgen.tools.staging`) that still has *uncovered* numbers after a call is not
offered the block's end: its next stage writes one more call. That call stands only when
it repeats no earlier call and uses something of the question the earlier calls did not
(an uncovered number, or a string of the question none of them holds: "Maroon 5" after
"Taylor Swift"); otherwise it is dropped (kept in the gen's meta as ``dropped_calls``) and
the block ends where it was.
The call a coverage stage asks for is *steered* (:func:`steered`): each tool with a numeric
argument that can take one of the uncovered numbers must put one of them in one such argument
(which argument and which number is the model's choice, as is every other value); a tool
without one is offered as it is. Without this the 135M model mostly repeats its first call
(dropped: the turn keeps one call where the question asked for several).
The grammar holds every call to its schema.

The numbers are those written in the last user message (digit groups such as ``1,200``
read as ``1200``; a digit right after a letter, as in ``HbA1c``, is part of a name, not a
number), compared by value, sign aside. A call uses a number when an argument is that
number, or a string argument contains it. Turns with ``parallel_tool_calls`` of 1, turns
after tool results and turns written in one request (a template's native format) are not
affected. ``tool_choice={"coverage": False}`` turns it off.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
from collections.abc import Collection, Sequence
from typing import Any

from structgen.constraints.schema.check import validator_class
from structgen.grounding import DIGIT_GROUP, leaves, normalize
from structgen.tools.calls import ToolCall
from structgen.tools.definition import Tool

__all__ = ["adds_coverage", "call_numbers", "question_numbers", "steered", "uncovered"]

#: a number as a user writes it: a digit run not glued to a preceding letter (``HbA1c``, ``COVID19``)
_NUMBER = re.compile(r"(?<![^\W_])\d+(?:\.\d+)?")


def _values(text: str) -> set[float]:
    return {round(float(m), 9) for m in _NUMBER.findall(DIGIT_GROUP.sub("", normalize(text)))}


def question_numbers(question: str) -> set[float]:
    """The numbers written in ``question``, by value (sign aside)."""
    return _values(question)


def call_numbers(call: ToolCall) -> set[float]:
    """The numbers one call uses: its numeric arguments and the numbers in its strings."""
    out: set[float] = set()
    for leaf in leaves(call.raw_arguments):
        if isinstance(leaf, bool) or leaf is None:
            continue
        if isinstance(leaf, (int, float)) and math.isfinite(leaf):
            out.add(round(abs(float(leaf)), 9))
        elif isinstance(leaf, str):
            out |= _values(leaf)
    return out


def uncovered(question: str, calls: Sequence[ToolCall]) -> set[float]:
    """The question's numbers that none of ``calls`` uses."""
    used: set[float] = set()
    for call in calls:
        used |= call_numbers(call)
    return question_numbers(question) - used


def _strings(call: ToolCall, question: str) -> set[str]:
    """The call's string values that occur in ``question`` (normalised)."""
    src = normalize(question)
    out = set()
    for leaf in leaves(call.raw_arguments):
        if isinstance(leaf, str):
            text = normalize(leaf).strip()
            if text and text in src:
                out.add(text)
    return out


def adds_coverage(question: str, earlier: Sequence[ToolCall], new: ToolCall) -> bool:
    """Whether ``new`` repeats none of ``earlier`` and uses something of the question they
    did not: a number they left uncovered, or a string of the question none of them holds."""
    if any(c.key() == new.key() for c in earlier):
        return False
    if uncovered(question, earlier) & call_numbers(new):
        return True
    used: set[str] = set()
    for c in earlier:
        used |= _strings(c, question)
    return bool(_strings(new, question) - used)


def _fitting(schema: Any, numbers: Collection[float], draft: type[Any]) -> list[int | float]:
    """Those of ``numbers`` that a plain numeric parameter ``schema`` takes (checked by the
    tool's ``draft`` validator: type, limits), each with either sign (coverage reads numbers
    sign aside: "a loss of $1000" may be -1000), as JSON numbers (integral values as ints);
    none for any other schema (an enum, a union, a string...)."""
    if not isinstance(schema, dict) or schema.get("type") not in ("integer", "number") or any(
            k in schema for k in ("enum", "const", "anyOf", "oneOf", "allOf", "not", "$ref", "multipleOf")):
        return []
    takes = draft(schema).is_valid
    signed = sorted({abs(float(x)) for x in numbers})
    values = [int(x) if x.is_integer() else x for x in signed + [-x for x in signed if x]]
    return [v for v in values if takes(v)]


def steered(tool: Tool, numbers: Collection[float]) -> Tool:
    """``tool`` whose call must use one of ``numbers``: one of its top-level numeric
    parameters takes one of them (required, then), the model choosing which parameter
    and which number; ``tool`` itself where no parameter can take one. Every call of the
    steered tool is a call of ``tool``."""
    params = tool.parameters
    props = params.get("properties")
    if not numbers or not isinstance(props, dict):
        return tool
    required = list(params.get("required") or [])
    draft = validator_class(params)
    variants = []
    for name, schema in props.items():
        values = _fitting(schema, numbers, draft)
        if not values:
            continue
        variant = copy.deepcopy(params)
        variant["properties"][name] = {**schema, "enum": values}
        variant["required"] = required if name in required else [*required, name]
        variants.append(variant)
    if not variants:
        return tool
    steer = variants[0] if len(variants) == 1 else {"anyOf": variants}  # no keyword beside the branches
    return dataclasses.replace(tool, parameters=steer)
