"""A tool turn that fits its token budget: bounds on the parts of a call that could run away.

``gen(tools=..., max_tokens=N)`` builds its grammar with :func:`fit_to_budget`: every
free-length part of the arguments gets a bound -- strings a ``maxLength``, arrays a
``maxItems``, open objects a ``maxProperties``, never below the schema's own minimums
(:mod:`structgen.constraints.schema.bounds`) -- chosen as large as possible such that the
longest call the grammar allows (every argument at its longest, with the tool's name, keys,
punctuation and the format's call block) is at most ``N - 1`` characters (one token is
kept for the end of sequence). A token is at least one byte, so the first call of a turn
written in ASCII always *closes* within ``max_tokens``: a model that starts a runaway
argument is stopped by the grammar at the bound and must close the call. A tool whose call
does not fit with strings of :data:`MIN_CAP` characters loses its optional arguments from
the grammar, the last first (its defaults apply); a budget too small even for its required
ones is served best effort (bounds of :data:`MIN_CAP`; the call may then be cut, an error
as before).

A parallel turn (``parallel_tool_calls=True`` or ``k``: up to ``k`` calls) is planned as a
whole by :func:`fit_calls`: the format's block (``<tool_call>[`` ... ``]</tool_call>``,
``[TOOL_CALLS][`` ... ``]``; nothing for formats that wrap each call) plus ``k'`` calls, each
at its longest and counted with its separator (and its own open/close tags where the format
wraps each call), is at most ``N - 1`` characters, so the whole turn closes within
``max_tokens`` however many calls the model writes. ``k'`` is the largest count up to ``k``
for which every allowed tool fits a per-call share ``(N - 1 - block) // k'`` with all its
arguments and bounds of at least :data:`CALL_FLOOR` characters (arguments are kept over
calls: a call left out can be made in the next turn, a dropped argument silently takes its
default); when that allows fewer than two calls, the largest count for which the tools fit
with their optional arguments dropped (the last first, as above). The grammar then allows at
most ``k'`` calls, each tool's bounds as large as its share allows. When not even two calls
fit, ``k' = 1`` and the single call is fitted to the whole budget as above. (The count has
one separator to spare: ``k'`` calls have ``k' - 1`` separators.)

The bounds are a plan, not a proof, where a schema gives nothing to bound: integers are
bounded to :data:`NUMBER_CHARS` characters (:data:`~structgen.constraints.schema.bounds.INTEGER_BOUND`),
other numbers counted at that length (a JSON schema cannot bound a fraction's digits),
a character written as a ``\\uXXXX`` escape or outside ASCII may take more than one
token, a schema without a type (any JSON) is counted as a bounded string, an open object's keys
are counted at the bound but not held to it (llguidance 1.9 does not implement
``propertyNames``), and free text
(a thinking section without ``max_chars``, text before a native call) is not counted.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence

from structgen.constraints.schema.bounds import NUMBER_CHARS, bounded_schema, fit_cap, json_chars
from structgen.tools.definition import Tool
from structgen.tools.formats import ToolFormat

__all__ = ["CALL_FLOOR", "MIN_CAP", "NUMBER_CHARS", "block_chars", "bounded_schema", "call_chars", "fit_calls",
           "fit_to_budget", "longest_call"]

#: the smallest bound given: a budget too small for it is served best effort
MIN_CAP = 8
#: the smallest bound a call of a parallel turn is planned with: a budget too small for
#: ``k`` calls with bounds this large serves fewer calls (a city, a short name or a date fits)
CALL_FLOOR = 16
#: the tool grammar's JSON separators (item, key): :data:`structgen.tools.grammar.JSON_STYLE`
_SEPARATORS = (", ", ": ")


def _call_frame(fmt: ToolFormat, tool: Tool) -> int:
    """The characters of one call of ``tool`` in ``fmt`` around its arguments."""
    head = len(f'{{"name": {json.dumps(tool.name, ensure_ascii=False)}, "{fmt.args_key}": ') + 1
    return head + len(fmt.separator) + (0 if fmt.list_style else len(fmt.open) + len(fmt.close))


def call_chars(fmt: ToolFormat, tool: Tool, cap: int) -> float:
    """The longest text one call of ``tool`` can take in ``fmt`` with bounds ``cap``."""
    return _call_frame(fmt, tool) + json_chars(tool.parameters, tool.parameters, cap, separators=_SEPARATORS)


def block_chars(fmt: ToolFormat) -> int:
    """The characters of ``fmt``'s call block around all the calls (``open[`` and ``]close``
    for a list-style format; nothing where each call carries its own tags)."""
    return len(fmt.open) + len(fmt.close) + 2 if fmt.list_style else 0


def longest_call(fmt: ToolFormat, tools: Sequence[Tool], cap: int, *, lean: bool = False) -> float:
    """The longest call any of ``tools`` can take in ``fmt`` with bounds ``cap`` (``lean``:
    with its optional arguments left out)."""
    return max(call_chars(fmt, _without_optional(t, len(_optional(t))) if lean else t, cap) for t in tools)


def _optional(tool: Tool) -> list[str]:
    required = set(tool.parameters.get("required") or [])
    return [k for k in tool.parameters.get("properties") or {} if k not in required]


def _without_optional(tool: Tool, drop: int) -> Tool:
    """``tool`` with its last ``drop`` optional top-level arguments left out of the schema."""
    params = dict(tool.parameters)
    props = dict(params.get("properties") or {})
    optional = _optional(tool)
    for key in optional[len(optional) - drop:] if drop else []:
        props.pop(key)
    params["properties"] = props
    return dataclasses.replace(tool, parameters=params)


def fit_to_budget(fmt: ToolFormat, tools: Sequence[Tool], *, max_tokens: int,
                  reserved: int = 0, calls: int = 1, floor: int = MIN_CAP) -> list[tuple[Tool, int]]:
    """Each tool with its bound ``cap``: the largest such that ``calls`` calls of it (with
    the call block) take at most ``max_tokens - 1`` characters. A tool whose call does not
    fit with bounds of ``floor`` loses optional arguments (the last first) until it does;
    ``cap`` is never below :data:`MIN_CAP` (a budget below the plan: best effort).
    ``reserved`` counts a thinking section's bound."""
    budget = (max_tokens - 1 - reserved - block_chars(fmt)) // max(calls, 1)
    out = []
    for tool in tools:
        optional = _optional(tool)
        drop = next((d for d in range(len(optional) + 1)
                     if call_chars(fmt, _without_optional(tool, d), floor) <= budget), len(optional))
        fitted = _without_optional(tool, drop) if drop else tool
        cap = fit_cap(fitted.parameters, budget - _call_frame(fmt, fitted), floor=MIN_CAP, separators=_SEPARATORS)
        out.append((fitted, cap))
    return out


def fit_calls(fmt: ToolFormat, tools: Sequence[Tool], *, max_tokens: int, max_calls: int,
              reserved: int = 0) -> tuple[int, list[tuple[Tool, int]]]:
    """``(k', fitted)``: how many calls ``k' <= max_calls`` a turn may make within
    ``max_tokens``, and each tool with its bound for a share of the budget
    (:func:`fit_to_budget` with ``calls=k'``). ``k'`` is the most calls with which every
    tool keeps all its arguments with bounds of at least :data:`CALL_FLOOR`; when that is
    fewer than two, the most with optional arguments left out; when that is fewer than two
    too, ``k' = 1`` (one call, fitted to the whole budget)."""
    room = max_tokens - 1 - reserved - block_chars(fmt)
    if max_calls > 1 and tools and room > 0:
        for lean in (False, True):  # every argument kept, else optional ones left out
            need = longest_call(fmt, tools, CALL_FLOOR, lean=lean)  # the longest of the tools' calls at the floor
            k = min(max_calls, int(room // need)) if 0 < need < math.inf else 1
            if k >= 2:
                return k, fit_to_budget(fmt, tools, max_tokens=max_tokens, reserved=reserved, calls=k,
                                        floor=CALL_FLOOR)
    return 1, fit_to_budget(fmt, tools, max_tokens=max_tokens, reserved=reserved)
