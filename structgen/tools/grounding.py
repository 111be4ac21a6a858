"""``tool_choice="auto"``'s check of a call it committed to: did the conversation give its arguments?

Relevance (:mod:`structgen.tools.relevance`) says whether the question points at a tool;
it cannot say whether the question gives what the call needs. A small model asked for a
call on a question that does not fit the tool still writes one, with guessed values
(``{"weight": 10, "height": 5}`` for a triangle's base and height, ``"unit": "m"``, a
principal of 100). So a turn that relevance committed to a call checks the call once it is
written: the share of its argument values that occur in the conversation's user and tool
messages (strings as normalised substrings, numbers by value --
:class:`structgen.grounding.Source`, the check extraction's confidence uses). Values a
source cannot show do not count: booleans, null, empty strings, and the values a closed set
of the tool's schema forces (an ``enum`` member, a ``const``: the user rarely spells those
out). A ``default`` does count: the model was free to leave the argument out, so writing a
value nobody gave is a guess. The turn's *grounding* is that share over all its calls
(None when no value counts):

* at least ``grounding_threshold`` (:data:`DEFAULT_GROUNDING_THRESHOLD`, or
  ``tool_choice={"mode": "auto", "grounding_threshold": g}``), or None: the calls stand;
* below it: the calls are withdrawn (kept in the gen's meta as ``declined_calls``) and the
  turn is written again as a plain answer (``tool_choice="none"``'s grammar).

The grounding is in the gen's meta (``tool_grounding``); ``grounding_threshold=None``
turns the check off. A turn checked this way is not streamed until the check passes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from structgen.contract.backend import Message
from structgen.grounding import Source, leaves, normalize
from structgen.tools.calls import ToolCall
from structgen.tools.definition import Tool

__all__ = ["DEFAULT_GROUNDING_THRESHOLD", "call_grounding", "grounding_source", "schema_values"]

#: the grounding below which ``auto`` withdraws the calls it committed to: calibrated with the
#: relevance threshold for SmolLM2-135M-Instruct by ``bench/bfcl_calibrate.py --signal joint``
#: on BFCL records 100-179 of each category (disjoint from those ``bench/bfcl.py`` scores):
#: the pair (relevance 1.936, grounding 0.4) abstains on every irrelevant question there and
#: its kept calls are right on 0.181 of the others with routing (relevance alone, abstaining on all:
#: 0.116); other models should calibrate their own. (That calibration predates reading
#: ``1e-9`` and number words as numbers, :mod:`structgen.grounding`; on records 20-39 the
#: change kept two right calls and no irrelevant one.)
DEFAULT_GROUNDING_THRESHOLD = 0.4

#: the schema keys whose values a call may hold without the conversation giving them
_SCHEMA_VALUE_KEYS = ("enum", "const")


def grounding_source(messages: Sequence[Message]) -> str:
    """The text a call's arguments may come from: the user and tool messages."""
    return "\n".join(m.content for m in messages if m.role in ("user", "tool") and isinstance(m.content, str))


def _key(value: Any) -> Any:
    """How a leaf value is compared with the schema's own values."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return round(float(value), 9) if math.isfinite(value) else None
    if isinstance(value, str):
        return normalize(value).strip()
    return None


def schema_values(schema: Any) -> set[Any]:
    """The leaf values a JSON schema's closed sets offer (``enum`` members and ``const``, at
    any depth), as comparison keys."""
    found: set[Any] = set()

    def walk(node: Any) -> None:
        if isinstance(node, Mapping):
            for k, v in node.items():
                if k in _SCHEMA_VALUE_KEYS:
                    for leaf in leaves(v if k == "enum" else [v]):
                        key = _key(leaf)
                        if key is not None and not isinstance(key, bool):
                            found.add(key)
                elif k != "properties":
                    walk(v)
                else:
                    for sub in v.values() if isinstance(v, Mapping) else ():
                        walk(sub)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(schema)
    return found


def call_grounding(calls: Sequence[ToolCall], tools: Sequence[Tool], source: str) -> float | None:
    """The share of the calls' argument values that occur in ``source``; values the source
    cannot show or the tool's schema forces do not count. None when no value counts."""
    src = Source(source)
    offered = {t.name: schema_values(t.parameters) for t in tools}
    grounded = counted = 0
    for call in calls:
        own = offered.get(call.name, set())
        for leaf in leaves(call.raw_arguments):
            if _key(leaf) in own:
                continue
            hit = src.grounded(leaf)
            if hit is None:
                continue
            counted += 1
            grounded += hit
    return grounded / counted if counted else None
