"""A tool turn that fits its token budget: bounds on the parts of a call that could run away.

``gen(tools=..., max_tokens=N)`` builds its grammar with :func:`fit_to_budget`: every
free-length part of the arguments gets a bound -- strings a ``maxLength``, arrays a
``maxItems``, open objects a ``maxProperties``, never below the schema's own minimums
(:mod:`structgen.constraints.schema.bounds`) -- chosen as large as possible such that the
longest call the grammar allows (every argument at its longest, with the tool's name, keys,
punctuation and the format's call block) is at most ``N - 1`` characters (one token is
kept for the end of sequence). A token is at least one byte, so the first call of a turn
written in ASCII always *closes* within ``max_tokens``: a model that starts a runaway
argument is stopped by the grammar at the bound and must close the call. Further parallel
calls are not counted: one cut by ``max_tokens`` is dropped and the turn keeps its whole
calls (``ToolTurn.truncated``). A tool whose call does not fit with strings of
:data:`MIN_CAP` characters loses its optional arguments from the grammar, the last first
(its defaults apply); a budget too small even for its required ones is served best effort
(bounds of :data:`MIN_CAP`; the call may then be cut, an error as before).

The bounds are a plan, not a proof, where a schema gives nothing to bound: numbers are
counted at :data:`NUMBER_CHARS` characters (a JSON schema cannot bound a number's digits),
a character written as a ``\\uXXXX`` escape or outside ASCII may take more than one
token, a schema without a type (any JSON) is counted as a bounded string, and free text
(a thinking section without ``max_chars``, text before a native call) is not counted.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

from structgen.constraints.schema.bounds import NUMBER_CHARS, bounded_schema, json_chars
from structgen.tools.definition import Tool
from structgen.tools.formats import ToolFormat

__all__ = ["MIN_CAP", "NUMBER_CHARS", "bounded_schema", "call_chars", "fit_to_budget"]

#: the smallest bound given: a budget too small for it is served best effort
MIN_CAP = 8
#: the tool grammar's JSON separators (item, key): :data:`structgen.tools.grammar.JSON_STYLE`
_SEPARATORS = (", ", ": ")


def call_chars(fmt: ToolFormat, tool: Tool, cap: int) -> float:
    """The longest text one call of ``tool`` can take in ``fmt`` with bounds ``cap``."""
    head = len(f'{{"name": {json.dumps(tool.name, ensure_ascii=False)}, "{fmt.args_key}": ') + 1
    wrap = len(fmt.separator) + (0 if fmt.list_style else len(fmt.open) + len(fmt.close))
    return head + wrap + json_chars(tool.parameters, tool.parameters, cap, separators=_SEPARATORS)


def _without_optional(tool: Tool, drop: int) -> Tool:
    """``tool`` with its last ``drop`` optional top-level arguments left out of the schema."""
    params = dict(tool.parameters)
    props = dict(params.get("properties") or {})
    required = set(params.get("required") or [])
    optional = [k for k in props if k not in required]
    for key in optional[len(optional) - drop:] if drop else []:
        props.pop(key)
    params["properties"] = props
    return dataclasses.replace(tool, parameters=params)


def fit_to_budget(fmt: ToolFormat, tools: Sequence[Tool], *, max_tokens: int,
                  reserved: int = 0) -> list[tuple[Tool, int]]:
    """Each tool with its bound ``cap``: the largest such that one call of it (with the
    call block) takes at most ``max_tokens - 1`` characters. A tool whose call does not fit
    with :data:`MIN_CAP` loses optional arguments (the last first) until it does; ``cap``
    is never below :data:`MIN_CAP` (a budget below the plan: best effort). ``reserved``
    counts a thinking section's bound."""
    block = len(fmt.open) + len(fmt.close) + 2 if fmt.list_style else 0
    budget = max_tokens - 1 - reserved - block
    out = []
    for tool in tools:
        optional = [k for k in tool.parameters.get("properties") or {}
                    if k not in set(tool.parameters.get("required") or [])]
        drop = next((d for d in range(len(optional) + 1)
                     if call_chars(fmt, _without_optional(tool, d), MIN_CAP) <= budget), len(optional))
        fitted = _without_optional(tool, drop) if drop else tool
        lo, hi = 0, max(budget, 0)
        while lo < hi:  # the largest cap with which the call fits
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if call_chars(fmt, fitted, mid) <= budget else (lo, mid - 1)
        out.append((fitted, max(lo, MIN_CAP)))
    return out
