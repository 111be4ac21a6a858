"""A tool turn that fits its token budget: bounds on the parts of a call that could run away.

``gen(tools=..., max_tokens=N)`` builds its grammar with :func:`fit_to_budget`: every
free-length part of the arguments gets a bound -- strings a ``maxLength``, arrays a
``maxItems``, open objects a ``maxProperties`` -- chosen as large as possible such that the
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

import copy
import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from structgen.tools.definition import Tool
from structgen.tools.formats import ToolFormat

__all__ = ["MIN_CAP", "NUMBER_CHARS", "bounded_schema", "call_chars", "fit_to_budget"]

#: characters counted for a JSON number (its digits cannot be bounded by a schema)
NUMBER_CHARS = 12
#: the smallest bound given: a budget too small for it is served best effort
MIN_CAP = 8
_DEPTH = 12  # deeper (recursive) schemas are counted as one bounded string


def _items_cap(cap: int) -> int:
    return max(2, cap // 6)


def _resolve(node: Any, root: dict[str, Any]) -> Any:
    ref = node.get("$ref") if isinstance(node, dict) else None
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part, {}) if isinstance(target, dict) else {}
        return target
    return node


def _chars(node: Any, root: dict[str, Any], cap: int, depth: int = 0) -> float:
    """The longest JSON text ``node`` allows once bounded with ``cap`` (``inf``: no bound)."""
    if depth > _DEPTH:  # a recursive schema: counted as a bounded string (a plan, see above)
        return cap + 2.0
    node = _resolve(node, root)
    if not isinstance(node, dict) or not node:
        return cap + 2.0  # any JSON: bounded as a string by bounded_schema
    if "const" in node:
        return float(len(json.dumps(node["const"], ensure_ascii=False)))
    if "enum" in node:
        return float(max((len(json.dumps(v, ensure_ascii=False)) for v in node["enum"]), default=0))
    alts = node.get("anyOf") or node.get("oneOf")
    if isinstance(alts, list) and alts:
        return max(_chars(a, root, cap, depth + 1) for a in alts)
    kind = node.get("type")
    if isinstance(kind, list):
        return max((_chars({**node, "type": k}, root, cap, depth + 1) for k in kind), default=0.0)
    if kind == "string":
        return 2.0 + min(cap, int(node.get("maxLength", cap)))
    if kind in ("number", "integer"):
        return float(NUMBER_CHARS)
    if kind == "boolean":
        return 5.0
    if kind == "null":
        return 4.0
    if kind == "array":
        n = min(_items_cap(cap), int(node.get("maxItems", _items_cap(cap))))
        prefix = node.get("prefixItems") or []
        item = node.get("items", {})
        parts = [_chars(p, root, cap, depth + 1) for p in prefix[:n]]
        if item is not False:
            parts += [_chars(item, root, cap, depth + 1)] * (n - len(parts))
        return 2.0 + sum(p + 2 for p in parts)
    if kind == "object" or "properties" in node:
        props = node.get("properties") or {}
        total = 2.0 + sum(len(json.dumps(k, ensure_ascii=False)) + 4 + _chars(v, root, cap, depth + 1)
                          for k, v in props.items())
        extra = node.get("additionalProperties", True)
        if extra is not False:
            n = min(_items_cap(cap), int(node.get("maxProperties", _items_cap(cap))))
            value = extra if isinstance(extra, dict) else {}
            total += n * (cap + 6 + _chars(value, root, cap, depth + 1))
        return total
    return cap + 2.0


def _bound(node: Any, cap: int) -> Any:
    """``node`` with every free length bounded by ``cap`` (a copy; $defs bounded too)."""
    if isinstance(node, list):
        return [_bound(v, cap) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {k: (v if k in ("enum", "const", "default", "examples", "required")
                          else {n: _bound(s, cap) for n, s in v.items()} if k in ("properties", "$defs", "definitions")
                          and isinstance(v, dict) else _bound(v, cap)) for k, v in node.items()}
    if "enum" in out or "const" in out or "$ref" in out:
        return out
    kind = out.get("type")
    kinds: list[Any] = kind if isinstance(kind, list) else [kind]
    if not out or (kind is None and not ({"anyOf", "oneOf", "allOf", "properties", "items"} & set(out))):
        out.setdefault("type", "string")  # any JSON: a bounded string
        kinds = [out["type"]] if isinstance(out["type"], str) else out["type"]
    if "string" in kinds:
        out["maxLength"] = min(cap, int(out.get("maxLength", cap)))
        out["minLength"] = min(int(out.get("minLength", 0)), out["maxLength"])
    if "array" in kinds:
        out["maxItems"] = min(_items_cap(cap), int(out.get("maxItems", _items_cap(cap))))
        out["minItems"] = min(int(out.get("minItems", 0)), out["maxItems"])
    if ("object" in kinds or "properties" in out) and out.get("additionalProperties", True) is not False:
        out["maxProperties"] = len(out.get("properties") or {}) + min(
            _items_cap(cap), int(out.get("maxProperties", _items_cap(cap))))
    return out


def bounded_schema(schema: dict[str, Any], cap: int) -> dict[str, Any]:
    """``schema`` with strings at most ``cap`` characters, arrays ``cap // 4`` items (at least one)."""
    return dict(_bound(copy.deepcopy(schema), cap))


def call_chars(fmt: ToolFormat, tool: Tool, cap: int) -> float:
    """The longest text one call of ``tool`` can take in ``fmt`` with bounds ``cap``."""
    head = len(f'{{"name": {json.dumps(tool.name, ensure_ascii=False)}, "{fmt.args_key}": ') + 1
    wrap = len(fmt.separator) + (0 if fmt.list_style else len(fmt.open) + len(fmt.close))
    return head + wrap + _chars(tool.parameters, tool.parameters, cap)


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
