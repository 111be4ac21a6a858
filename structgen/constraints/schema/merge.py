"""Conjunction of schemas: ``allOf`` merged where that is exact, and disjointness.

:func:`conj` merges the parts of an ``allOf`` into one schema object where the merge
keeps the set of valid instances *and* the order in which the engine generates
properties (llguidance orders them by first appearance, walking keys in order with
``allOf`` / ``anyOf`` / ``oneOf`` / ``$ref`` in place); parts it cannot merge stay an
``allOf``. A reference never gets sibling keywords. :func:`disjoint` proves that no
instance satisfies two schemas (used to turn ``oneOf`` into ``anyOf``).
"""

from __future__ import annotations

from typing import Any

from structgen.constraints.schema.instance_types import drop_inapplicable, is_number, json_eq, types_of, with_type

__all__ = ["comes_first", "conj", "conj2", "disjoint", "merge", "pairwise_disjoint", "replace_key", "sources"]


def conj(parts: list[Any], *, keep_order: bool = True) -> Any:
    """allOf(parts), merged into one schema where that is exact.

    Parts keep their order (the engine orders properties by first appearance): a
    part is merged into the first mergeable one only where that keeps the order
    (``keep_order=False``: wherever the merge is exact, for a consumer that orders
    properties itself).
    """
    flat: list[Any] = []
    todo = list(reversed(parts))
    while todo:
        p = todo.pop()
        if p is True or p == {}:
            continue
        if p is False:
            return False
        if not isinstance(p, dict):
            continue
        if set(p) == {"allOf"} and isinstance(p["allOf"], list):
            todo.extend(reversed(p["allOf"]))  # nested allOf: its parts in place
        else:
            flat.append(p)
    acc: Any = None
    slots: list[Any] = []  # references and unmerged parts in order; None marks acc's place
    for p in flat:
        if "$ref" in p:
            slots.append(p)
        elif acc is None:
            acc = dict(p)
            slots.append(None)
        else:
            # past a reference or an unmerged part, only parts that name no
            # properties may move up into acc
            movable = not keep_order or slots[-1] is None or not sources(p)
            merged = merge(acc, p, keep_order=keep_order) if movable else None
            if merged is None:
                slots.append(p)
            elif merged is False:
                return False
            else:
                acc = merged
    if acc is None:
        if not slots:
            return {}
        return slots[0] if len(slots) == 1 else {"allOf": slots}
    if drop_inapplicable(acc) is False:
        return False
    if slots[0] is None and all(x is None or "$ref" not in x for x in slots):
        rest = slots[1:]
        if not rest:
            return acc
        src = sources(acc)
        if "allOf" in acc and src[-1] != "allOf":
            return {"allOf": [acc] + rest}  # appending to acc's allOf would reorder
        acc = dict(acc)
        acc["allOf"] = list(acc.get("allOf") or []) + rest
        if len(acc) == 1 and len(acc["allOf"]) == 1:
            return acc["allOf"][0]
        return acc
    # references never get sibling keywords
    items = [x for x in (acc if x is None else x for x in slots) if x != {}]
    return items[0] if len(items) == 1 else {"allOf": items}


def pairwise_disjoint(branches: list[Any]) -> bool:
    """No two of ``branches`` can hold at once (sound, incomplete)."""
    for i in range(len(branches)):
        for j in range(i + 1, len(branches)):
            if not disjoint(branches[i], branches[j]):
                return False
    return True


def disjoint(a: Any, b: Any) -> bool:
    """True only if no instance can satisfy both schemas (sound, incomplete)."""
    if a is False or b is False:
        return True
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    ta, tb = types_of(a), types_of(b)
    if ta is not None and tb is not None:
        both = ta & tb
        if not both:
            return True
    else:
        both = None
    for x, y in ((a, b), (b, a)):
        vals = [x["const"]] if "const" in x else x.get("enum")
        if isinstance(vals, list):
            yvals = [y["const"]] if "const" in y else y.get("enum")
            if isinstance(yvals, list) and not any(json_eq(u, w) for u in vals for w in yvals):
                return True
    if both is not None and both <= {"object"}:
        pa, pb = a.get("properties") or {}, b.get("properties") or {}
        ra, rb = set(a.get("required") or []), set(b.get("required") or [])
        if isinstance(pa, dict) and isinstance(pb, dict):
            for k in ra & rb:
                if k in pa and k in pb and disjoint(pa[k], pb[k]):
                    return True
            for x, px, ry in ((a, pa, rb), (b, pb, ra)):
                if x.get("additionalProperties") is False and not x.get("patternProperties") \
                        and any(k not in px for k in ry):
                    return True
            for k in ra:
                if pb.get(k) is False:
                    return True
            for k in rb:
                if pa.get(k) is False:
                    return True
    return False


_MERGE_MINS = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties")
_MERGE_MAXS = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties")


def merge(a: dict[str, Any], b: dict[str, Any], *, keep_order: bool = True) -> Any:
    """Exact merge of two schema objects, False if unsatisfiable, None if not mergeable
    (including, with ``keep_order``, when the merge would change the engine's property order)."""
    if "$ref" in a or "$ref" in b:
        return None  # a (cyclic) reference stays a branch of allOf, never gets siblings
    if keep_order and not keeps_order(a, b):
        return None
    for group in _GROUPS:
        ga = {k: a[k] for k in group if k in a}
        gb = {k: b[k] for k in group if k in b}
        if ga and gb and not json_eq(ga, gb) and not (set(ga) | set(gb) <= {"properties"}):
            return None
    out = dict(a)
    for k, v in b.items():
        if k not in out:
            out[k] = v
            continue
        u = out[k]
        if json_eq(u, v) and k not in ("allOf",):
            continue
        if k == "type":
            ta = types_of({"type": u})
            tb = types_of({"type": v})
            if ta is None or tb is None:
                return None
            both = ta & tb
            if not both:
                return False
            out = with_type(out, both)
        elif k in _MERGE_MINS and is_number(u) and is_number(v):
            out[k] = max(u, v)
        elif k in _MERGE_MAXS and is_number(u) and is_number(v):
            out[k] = min(u, v)
        elif k == "required" and isinstance(u, list) and isinstance(v, list):
            out[k] = list(u) + [x for x in v if x not in u]
        elif k in ("enum", "const"):
            ua = [u] if k == "const" else u
            va = [v] if k == "const" else v
            if not isinstance(ua, list) or not isinstance(va, list):
                return None
            keep = [x for x in ua if any(json_eq(x, y) for y in va)]
            if not keep:
                return False
            out.pop("const", None)
            out["enum"] = keep
        elif k == "uniqueItems":
            out[k] = bool(u) or bool(v)
        elif k == "properties" and isinstance(u, dict) and isinstance(v, dict):
            if is_open(a) is not True or is_open(b) is not True:
                return None
            props = dict(u)
            for pk, pv in v.items():
                props[pk] = pv if pk not in props else conj2(props[pk], pv, keep_order=keep_order)
            out[k] = props
        elif k == "allOf" and isinstance(u, list) and isinstance(v, list):
            out[k] = list(u) + list(v)
        else:
            return None
    if "properties" in a and "properties" not in b and is_open(b) is not True:
        return None
    if "properties" in b and "properties" not in a and is_open(a) is not True:
        return None
    if "enum" in out and "const" in out:
        keep = [x for x in out["enum"] if json_eq(x, out["const"])]
        if not keep:
            return False
        del out["const"]
        out["enum"] = keep
    return out


# keywords that name object properties: llguidance generates properties in the order it
# first meets them, walking a schema's keys in order (and allOf / anyOf / $ref in place)
_ORDER_KEYS = frozenset({"properties", "allOf", "anyOf", "oneOf", "$ref"})


def sources(s: dict[str, Any]) -> list[str]:
    """``s``'s keywords that may name properties, in key order."""
    return [k for k in s if k in _ORDER_KEYS]


def comes_first(s: dict[str, Any], key: str) -> bool:
    """True when the subschema(s) under ``key`` name properties before the rest of ``s``
    does: every other property-naming keyword of ``s`` comes after ``key``."""
    keys = list(s)
    at = keys.index(key)
    others = [i for i, k in enumerate(keys) if k in _ORDER_KEYS and k != key]
    return bool(others) and min(others) > at


def replace_key(s: dict[str, Any], old: str, new: str, value: Any) -> dict[str, Any]:
    """``s`` with ``old`` replaced by ``new: value`` at ``old``'s place (at ``new``'s own
    place if ``s`` has it already)."""
    keep = new in s
    out: dict[str, Any] = {}
    for k, v in s.items():
        if k == old:
            if not keep:
                out[new] = value
        elif k == new:
            out[new] = value
        else:
            out[k] = v
    return out


def keeps_order(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether merging ``b`` into ``a`` keeps the property order of ``allOf: [a, b]``:
    every property ``a`` names, then those ``b`` names. A keyword both carry is merged at
    ``a``'s place, one only ``b`` has goes last."""
    sa, sb = sources(a), sources(b)
    if not sa or not sb:
        return True
    shared = []
    for k in sb:
        if k not in a:
            continue
        if k == "properties" and isinstance(a[k], dict) and isinstance(b[k], dict) \
                and all(n in a[k] or v is False for n, v in b[k].items()):
            continue  # no new property that may appear: nothing moves
        if k in ("anyOf", "oneOf") and json_eq(a[k], b[k]):
            continue
        shared.append(k)
    if not shared:
        return True
    return len(shared) == 1 and sa[-1] == shared[0] and sb[0] == shared[0]


# keywords that read each other: merged only when one side has none of them, or equal
_GROUPS = (("properties", "patternProperties", "additionalProperties"), ("prefixItems", "items"))


def is_open(s: dict[str, Any]) -> bool:
    """Any property beyond ``properties`` is allowed, whatever its value."""
    return s.get("additionalProperties", True) in (True, {}) and not s.get("patternProperties")


def conj2(x: Any, y: Any, *, keep_order: bool = True) -> Any:
    """allOf [x, y], merged where exact (see :func:`merge`)."""
    if x is True or x == {}:
        return y
    if y is True or y == {}:
        return x
    if x is False or y is False:
        return False
    if isinstance(x, dict) and isinstance(y, dict):
        m = merge(x, y, keep_order=keep_order)
        if m is not None:
            return m
    return {"allOf": [x, y]}

