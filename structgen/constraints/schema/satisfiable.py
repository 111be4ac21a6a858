"""Proving a schema unsatisfiable through its ``$ref`` s: cycles no finite instance ends.

``{"$ref": "#"}``, two definitions that only refer to each other, or an object whose
required property refers back to the object: each admits no (finite) JSON value, yet a
grammar engine compiles it (a rule that never terminates) and generation would run until
``max_tokens``. :func:`unsatisfiable_refs` finds such schemas before any token.

The analysis is the *productivity* of a grammar: a subschema is productive when some
finite instance may satisfy it. Each check below is a necessary condition (a sound
over-estimate of satisfiability: ``allOf`` all productive, ``anyOf`` / ``oneOf`` one,
the ``$ref`` target, an object type's required properties, an array type's first
``minItems`` items and ``contains``); references are solved as a least fixed point, so
a result of *unproductive* proves that no instance is valid. Everything else (numeric
bounds, enums against types, ``not``) is left to the normaliser and the engine.
"""

from __future__ import annotations

from typing import Any

from structgen.constraints.schema.refs import Pointers

__all__ = ["unsatisfiable_refs"]


class _Productivity:
    """``ok(schema)``: may a finite instance satisfy it? References whose targets are
    not (yet) known productive count as unproductive (the least fixed point)."""

    def __init__(self, pointers: Pointers, draft: int):
        self.pointers = pointers
        self.draft = draft
        self.known: set[str] = set()          # targets proven productive
        self.targets: dict[str, Any] = {}     # every target met: pointer -> schema
        self.depth: dict[str, int] = {}       # targets being evaluated (DFS mode) -> stack index
        self.low = 1 << 30                    # lowest stack index an evaluation met
        self.failed: set[str] = set()         # targets proven unproductive (DFS mode)
        self.dfs = True

    # -- references
    def ref_ok(self, ref: Any) -> bool:
        if not isinstance(ref, str):
            return True
        ptr = self.pointers.local_pointer(ref)
        if ptr is None:
            return True  # outside the document: rejected or widened elsewhere
        target = self.targets.get(ptr)
        if target is None:
            try:
                target = self.pointers.resolve(ptr)
            except KeyError:
                return True  # unresolvable: an error elsewhere
            self.targets[ptr] = target
        if ptr in self.known:
            return True
        if not self.dfs or ptr in self.failed:
            return False
        index = self.depth.get(ptr)
        if index is not None:  # a cycle: assumed unproductive until shown otherwise
            self.low = min(self.low, index)
            return False
        index = self.depth[ptr] = len(self.depth)
        outer, self.low = self.low, 1 << 30
        try:
            ok = self.ok(target)
        finally:
            del self.depth[ptr]
        if ok:
            self.known.add(ptr)
        elif self.low >= index:
            self.failed.add(ptr)  # met no target below it on the stack: final
        self.low = min(outer, self.low)
        return ok

    # -- schemas
    def ok(self, s: Any) -> bool:
        if s is False:
            return False
        if not isinstance(s, dict):
            return True
        if "$ref" in s:
            if not self.ref_ok(s["$ref"]):
                return False
            if self.draft <= 7:
                return True  # siblings of $ref are ignored before 2019-09
        for key in ("anyOf", "oneOf"):
            branches = s.get(key)
            if isinstance(branches, list) and branches and not any(self.ok(b) for b in branches):
                return False
        parts = s.get("allOf")
        if isinstance(parts, list) and not all(self.ok(p) for p in parts):
            return False
        enum = s.get("enum")
        if isinstance(enum, list) and not enum:
            return False
        t = s.get("type")
        types = [t] if isinstance(t, str) else t
        if not isinstance(types, list) or not types:
            return True  # any type: a scalar may satisfy the type-specific keywords
        if any(x not in ("object", "array") for x in types):
            return True
        return ("object" in types and self.object_ok(s)) or ("array" in types and self.array_ok(s))

    def object_ok(self, s: dict[str, Any]) -> bool:
        required = s.get("required")
        if not isinstance(required, list):
            return True
        props = s.get("properties")
        props = props if isinstance(props, dict) else {}
        extra = s.get("additionalProperties", True)
        patterns = s.get("patternProperties")
        for name in required:
            if not isinstance(name, str):
                continue
            if name in props:
                if not self.ok(props[name]):
                    return False
            elif not patterns and not self.ok(extra):
                return False
        return True

    def array_ok(self, s: dict[str, Any]) -> bool:
        lo = s.get("minItems", 0)
        lo = int(lo) if isinstance(lo, (int, float)) and not isinstance(lo, bool) else 0
        items = s.get("items", True)
        if self.draft >= 2020:
            prefix, rest = s.get("prefixItems"), items
        elif isinstance(items, list):
            prefix, rest = items, s.get("additionalItems", True)
        else:
            prefix, rest = None, items
        prefix = prefix if isinstance(prefix, list) else []
        for i in range(min(lo, len(prefix))):
            if not self.ok(prefix[i]):
                return False
        if lo > len(prefix) and not self.ok(rest):
            return False
        if self.draft >= 6 and "contains" in s and s.get("minContains", 1) != 0:
            return self.ok(s["contains"])
        return True

    def least_fixed_point(self, root: Any) -> bool:
        """The root's productivity by plain iteration (no DFS assumptions)."""
        self.dfs = False  # (targets already known productive stay known)
        while True:
            if self.ok(root):
                return True
            seen = len(self.targets)
            grew = False
            for ptr, target in list(self.targets.items()):
                if ptr not in self.known and self.ok(target):
                    self.known.add(ptr)
                    grew = True
            if not grew and len(self.targets) == seen:
                return False


def unsatisfiable_refs(schema: Any, draft: int, pointers: Pointers | None = None) -> bool:
    """True when no finite instance can be valid against ``schema`` because of its
    references (see the module docstring); False when it may be satisfiable."""
    if not isinstance(schema, dict):
        return schema is False
    analysis = _Productivity(pointers or Pointers(schema), draft)
    try:
        if analysis.ok(schema):
            return False  # True under fewer assumptions is True in the least fixed point
        return not analysis.least_fixed_point(schema)
    except RecursionError:
        return False  # too deep to tell: the engine and the final validation decide
