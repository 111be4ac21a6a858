"""Negation: ``not`` pushed inwards, and ``if`` / ``then`` / ``else`` rewritten with it.

:meth:`Negation.negate` builds a schema valid exactly when a (normalised) schema is not
-- De Morgan over ``anyOf`` / ``allOf``, type complements, bounds flipped, ``required``
as ``properties: {k: false}``, finite enums complemented -- or raises
:class:`Unexpressible` when that cannot be written exactly (the caller then widens).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from structgen.constraints.schema.instance_types import json_eq, type_of, with_type
from structgen.constraints.schema.keywords import KW_TYPE, TYPES
from structgen.constraints.schema.merge import conj, pairwise_disjoint

__all__ = ["Negation", "Unexpressible", "negate_enum"]


class Unexpressible(Exception):
    """A negation or merge that cannot be written exactly."""


class Negation:
    """Negates normalised schemas; ``target_of`` gives the schema behind a hoisted
    ``$ref`` (``None`` when it is cyclic or unknown: such a reference is not negated)."""

    def __init__(self, target_of: Callable[[dict[str, Any]], Any]):
        self.target_of = target_of

    def negate(self, s: Any) -> Any:
        """A schema valid exactly when ``s`` is not (``s`` already normalised)."""
        if s is True or s == {}:
            return False
        if s is False:
            return {}
        if not isinstance(s, dict):
            raise Unexpressible
        if "$ref" in s:
            target = self.target_of(s)
            if target is None or len(s) != 1:
                raise Unexpressible
            return self.negate(target)
        alts: list[Any] = []
        ts = None
        if "type" in s:
            t = s["type"]
            tl = [t] if isinstance(t, str) else t
            if not isinstance(tl, list):
                raise Unexpressible
            ts = set(tl)
            if "number" in ts:
                ts.add("integer")
            if "integer" in ts and "number" not in ts:
                raise Unexpressible  # non-integral numbers are not expressible
            comp = set(TYPES) - ts - ({"number"} if "integer" in ts else set())
            if comp:
                alts.append(with_type({}, comp))
        for k, v in s.items():
            if k == "type":
                continue
            alts.extend(self._negate_kw(k, v, s))
        alts = [a for a in alts if a is not False]
        if not alts:
            return False
        return alts[0] if len(alts) == 1 else {"anyOf": alts}

    def _negate_kw(self, k: str, v: Any, s: dict[str, Any]) -> list[Any]:
        t = KW_TYPE.get(k)
        if k in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum") and isinstance(v, (int, float)) \
                and not isinstance(v, bool):
            flip = {"minimum": "exclusiveMaximum", "exclusiveMinimum": "maximum",
                    "maximum": "exclusiveMinimum", "exclusiveMaximum": "minimum"}[k]
            return [{"type": "number", flip: v}]
        if k in ("minLength", "minItems", "minProperties") and isinstance(v, int) and not isinstance(v, bool):
            if v <= 0:
                return []
            return [{"type": t, k.replace("min", "max"): v - 1}]
        if k in ("maxLength", "maxItems", "maxProperties") and isinstance(v, int) and not isinstance(v, bool):
            return [{"type": t, k.replace("max", "min"): v + 1}]
        if k == "required" and isinstance(v, list):
            return [{"type": "object", "properties": {r: False}} for r in v if isinstance(r, str)]
        if k == "properties" and isinstance(v, dict):
            out = []
            for pk, pv in v.items():
                n = self.negate(pv)
                if n is not False:
                    out.append({"type": "object", "required": [pk], "properties": {pk: n}})
            return out
        if k in ("enum", "const"):
            vals = [v] if k == "const" else v
            if not isinstance(vals, list):
                raise Unexpressible
            return negate_enum(vals)
        if k == "anyOf" and isinstance(v, list):
            negs = [self.negate(b) for b in v]
            c = conj(negs)
            return [] if c is False else [c]
        if k == "allOf" and isinstance(v, list):
            return [self.negate(b) for b in v]
        if k == "oneOf" and isinstance(v, list):
            if pairwise_disjoint(v):
                c = conj([self.negate(b) for b in v])
                return [] if c is False else [c]
            raise Unexpressible
        if k == "not":
            return [v]
        if k == "items" and isinstance(v, (dict, bool)) and "prefixItems" not in s:
            if v is True or v == {}:
                return []
            if v is False:
                return [{"type": "array", "minItems": 1}]
            raise Unexpressible
        if k == "uniqueItems" and v is False:
            return []
        raise Unexpressible

    def if_then_else(self, cond: Any, then: Any, els: Any, widened: bool, relaxed: list[str]) -> Any:
        """``if``/``then``/``else`` as ``anyOf [cond and then, not cond and else]``; when
        ``cond`` cannot be negated (or was ``widened``), the union of the branches (marked in
        ``relaxed``)."""
        then = {} if then is None else then
        els = {} if els is None else els
        try:
            if widened:
                raise Unexpressible
            ncond = self.negate(cond)
        except Unexpressible:
            relaxed.append("if")
            return {"anyOf": [then, els]} if then != {} and els != {} else {}
        return {"anyOf": [conj([cond, then]), conj([ncond, els])]}


def negate_enum(vals: list[Any]) -> list[Any]:
    """not enum: expressible when the enum covers only booleans / null (finite domains)."""
    present = {type_of(v) for v in vals}
    rest = set(TYPES) - present
    out: list[Any] = []
    for t in present:
        if t == "null":
            continue
        if t == "boolean":
            left = [b for b in (True, False) if not any(json_eq(b, v) for v in vals)]
            if left:
                out.append({"const": left[0]} if len(left) == 1 else {"type": "boolean"})
            continue
        raise Unexpressible
    if "integer" in rest and "number" not in rest:
        rest.discard("integer")
    if rest:
        out.append(with_type({}, rest))
    return out
