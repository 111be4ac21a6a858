"""Local ``$ref`` s: resolving them in the document, and inlining or hoisting them.

:class:`Pointers` resolves in-document references (``#``, ``#/definitions/..``,
``#/$defs/..``, any JSON pointer, ``$anchor`` / ``$id`` fragments). Nothing is ever
fetched: a reference outside the document resolves to ``None``.

:class:`RefExpander` is the normaliser's side of references: a target used once (or a
small one) is inlined, normalised in place, so ``allOf`` merges and negation can see
it; a cyclic or large shared target is hoisted into one ``$defs`` table
(``#/$defs/sgN``) and stays a reference. :func:`share_repeats` then turns the inlined
copies of a target that stayed as they were back into one shared definition: the engine
compiles a shared definition once, each inlined copy (its patterns, its enums) anew.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from structgen.constraints.schema.instance_types import schema_size
from structgen.constraints.schema.keywords import NON_SCHEMA_KEYS
from structgen.errors import ConstraintError

__all__ = ["HOISTED_PREFIX", "Pointers", "RefExpander", "escape_pointer", "share_repeats"]

#: a target used more than once is inlined only below this many nodes
SHARED_NODES = 40
#: where hoisted targets live in a normalised schema
HOISTED_PREFIX = "#/$defs/"
#: a repeated target is shared again (:func:`share_repeats`) from this many nodes up
SHARE_NODES = 3


def escape_pointer(key: str) -> str:
    """One JSON-pointer segment for ``key`` (``~`` -> ``~0``, ``/`` -> ``~1``)."""
    return key.replace("~", "~0").replace("/", "~1")


class Pointers:
    """In-document references of one schema (``root``)."""

    def __init__(self, root: Any):
        self.root = root
        self._anchors: dict[str, str] | None = None  # built on first use (few schemas have anchors)
        self._ref_counts: dict[str, int] | None = None  # built at the first $ref

    @property
    def anchors(self) -> dict[str, str]:
        """``$anchor`` / ``$id`` fragment name -> JSON pointer."""
        if self._anchors is None:
            self._anchors = {}
            self._index_anchors(self.root, "#", 0)
        return self._anchors

    def _index_anchors(self, s: Any, ptr: str, depth: int) -> None:
        if depth > 200:
            return
        anchors = self._anchors
        assert anchors is not None
        if isinstance(s, dict):
            for key in ("$anchor", "$id", "id"):
                a = s.get(key)
                if isinstance(a, str):
                    name = a[1:] if a.startswith("#") else (a if key == "$anchor" else None)
                    if name and "/" not in name:
                        anchors.setdefault(name, ptr)
            for k, v in s.items():
                if isinstance(v, (dict, list)) and k not in NON_SCHEMA_KEYS:
                    self._index_anchors(v, ptr + "/" + escape_pointer(k), depth + 1)
        elif isinstance(s, list):
            for i, v in enumerate(s):
                self._index_anchors(v, f"{ptr}/{i}", depth + 1)

    @property
    def ref_counts(self) -> dict[str, int]:
        """How often each ``$ref`` string occurs (outside enum/const/default/examples)."""
        if self._ref_counts is None:
            counts: dict[str, int] = {}
            stack = [self.root]
            while stack:
                x = stack.pop()
                if isinstance(x, dict):
                    ref = x.get("$ref")
                    if isinstance(ref, str):
                        counts[ref] = counts.get(ref, 0) + 1
                    for k, v in x.items():
                        if isinstance(v, (dict, list)) and k not in NON_SCHEMA_KEYS:
                            stack.append(v)
                elif isinstance(x, list):
                    stack.extend(v for v in x if isinstance(v, (dict, list)))
            self._ref_counts = counts
        return self._ref_counts

    def local_pointer(self, ref: str) -> str | None:
        """``ref`` as a pointer into the root ("#..."), or None if external."""
        if "#" not in ref:
            base = ref
            frag = ""
        else:
            base, frag = ref.split("#", 1)
        if base:
            root_id = (self.root.get("$id") or self.root.get("id")) if isinstance(self.root, dict) else None
            if not (isinstance(root_id, str) and root_id.split("#")[0].rstrip("/") == base.rstrip("/")):
                return None
        frag = unquote(frag)
        if frag and not frag.startswith("/"):
            return self.anchors.get(frag)
        return "#" + frag

    def resolve(self, ptr: str) -> Any:
        """The node at ``ptr`` ("#/a/0/b"); ``KeyError`` when there is none."""
        node = self.root
        for part in ptr[1:].split("/")[1:] if ptr != "#" else []:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise KeyError(ptr)
        return node


class RefExpander:
    """Normalises ``$ref`` s for the normaliser: inlined, or hoisted into :attr:`defs`.

    ``normalise`` normalises a target schema; what widened is appended to ``relaxed``
    (shared with the normaliser, so a reused target repeats its reasons).
    """

    def __init__(self, pointers: Pointers, normalise: Callable[[Any], Any], relaxed: list[str]):
        self.pointers = pointers
        self.normalise = normalise
        self.relaxed = relaxed
        self.defs: dict[str, Any] = {}        # hoisted name -> normalised schema
        self.hoisted: dict[str, str] = {}     # pointer -> hoisted name
        self.stack: list[str] = []            # pointers being expanded
        self.memo: dict[str, Any] = {}        # pointer -> (normalised acyclic target, reasons)
        self.cyclic: set[str] = set()
        self.def_reasons: dict[str, tuple[str, ...]] = {}

    @property
    def depth(self) -> int:
        """How many references are being expanded inside each other."""
        return len(self.stack)

    def _hoist(self, ptr: str) -> dict[str, Any]:
        name = self.hoisted.get(ptr)
        if name is None:
            name = f"sg{len(self.hoisted)}"
            self.hoisted[ptr] = name
            self.defs[name] = True  # placeholder while normalising (cycles)
            mark = len(self.relaxed)
            self.defs[name] = self._expand_target(ptr)
            self.def_reasons[ptr] = tuple(self.relaxed[mark:])
        return {"$ref": HOISTED_PREFIX + name}

    def hoisted_target(self, s: dict[str, Any]) -> Any:
        """The normalised schema behind a hoisted, non-cyclic reference (else None)."""
        ref = s.get("$ref")
        if not isinstance(ref, str) or not ref.startswith(HOISTED_PREFIX):
            return None
        name = ref[len(HOISTED_PREFIX):]
        for ptr, n in self.hoisted.items():
            if n == name:
                if ptr in self.cyclic or self.defs.get(name) is True:
                    return None
                return self.defs[name]
        return None

    def _expand_target(self, ptr: str) -> Any:
        self.stack.append(ptr)
        try:
            return self.normalise(self.pointers.resolve(ptr))
        finally:
            self.stack.pop()

    def expand(self, ref: Any) -> Any:
        """The normalised form of ``{"$ref": ref}``: the target inlined, or a hoisted reference."""
        if not isinstance(ref, str):
            self.relaxed.append("$ref")
            return {}
        ptr = self.pointers.local_pointer(ref)
        if ptr is None:
            self.relaxed.append("$ref:external")
            return {}
        try:
            target = self.pointers.resolve(ptr)
        except KeyError:
            raise ConstraintError(f"$ref {ref!r} cannot be resolved in the schema") from None
        if ptr in self.hoisted:
            self.relaxed.extend(self.def_reasons.get(ptr, ()))
            return {"$ref": HOISTED_PREFIX + self.hoisted[ptr]}
        if ptr in self.stack:
            self.cyclic.add(ptr)
            return self._hoist(ptr)
        if ptr in self.memo:
            got, reasons = self.memo[ptr]
            self.relaxed.extend(reasons)
            return got
        if self.pointers.ref_counts.get(ref, 0) > 1 and schema_size(target, SHARED_NODES + 1) > SHARED_NODES:
            return self._hoist(ptr)  # a large shared target: one definition, many references
        n_cyc = len(self.cyclic)
        mark = len(self.relaxed)
        out = self._expand_target(ptr)
        if ptr in self.hoisted:  # became cyclic while expanding
            return {"$ref": HOISTED_PREFIX + self.hoisted[ptr]}
        if len(self.cyclic) == n_cyc:
            self.memo[ptr] = (out, tuple(self.relaxed[mark:]))
        return out


_VALUE_MAPS = ("properties", "patternProperties")
_VALUE_ONE = ("items", "additionalProperties", "contains", "propertyNames")
_BRANCHES = ("prefixItems", "anyOf", "allOf", "oneOf")


def share_repeats(schema: Any) -> Any:
    """``schema`` (normalised) with every subschema that occurs more than once as the
    *same object* -- a target the normaliser inlined, unchanged, at several places --
    moved into ``$defs`` and referenced there (as a property value, ``items`` or
    ``additionalProperties``; inside ``allOf`` / ``anyOf`` branches copies stay inline).
    The set of valid instances is unchanged; ``schema`` itself is returned when nothing
    repeats."""
    if not isinstance(schema, dict):
        return schema
    seen: dict[int, int] = {}
    nodes: dict[int, dict[str, Any]] = {}

    def site(x: Any) -> None:
        if isinstance(x, dict) and x:
            seen[id(x)] = seen.get(id(x), 0) + 1
            if seen[id(x)] == 1:
                nodes[id(x)] = x
                visit(x)

    def visit(s: dict[str, Any]) -> None:
        for k, v in s.items():
            if k in _VALUE_MAPS and isinstance(v, dict):
                for x in v.values():
                    site(x)
            elif k in _VALUE_ONE:
                site(v)
            elif (k in _BRANCHES and isinstance(v, list)) or (k == "$defs" and isinstance(v, dict)):
                for x in (v if isinstance(v, list) else v.values()):
                    if isinstance(x, dict):
                        visit(x)

    visit(schema)
    repeated = [i for i, n in seen.items() if n > 1 and schema_size(nodes[i], SHARE_NODES) >= SHARE_NODES]
    if not repeated:
        return schema
    defs: dict[str, Any] = dict(schema.get("$defs") or {})
    names: dict[int, str] = {}
    for i in repeated:
        name = f"sg{len(defs) + len(names)}"
        while name in defs:
            name += "_"
        names[i] = name

    def ref(x: Any) -> Any:
        name = names.get(id(x)) if isinstance(x, dict) else None
        return {"$ref": HOISTED_PREFIX + name} if name is not None else rebuild(x)

    def rebuild(s: Any) -> Any:
        if not isinstance(s, dict):
            return s
        out: dict[str, Any] = {}
        for k, v in s.items():
            if k in _VALUE_MAPS and isinstance(v, dict):
                out[k] = {pk: ref(x) for pk, x in v.items()}
            elif k in _VALUE_ONE:
                out[k] = ref(v)
            elif k in _BRANCHES and isinstance(v, list):
                out[k] = [rebuild(x) for x in v]
            elif k == "$defs" and isinstance(v, dict):
                out[k] = {dk: rebuild(dv) for dk, dv in v.items()}
            else:
                out[k] = v
        return out

    out = rebuild(schema)
    shared = dict(out.get("$defs") or {})
    for i, name in names.items():
        shared[name] = rebuild(nodes[i])
    out["$defs"] = shared
    return out
