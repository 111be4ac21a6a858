"""Local ``$ref`` s: resolving them in the document, and inlining or hoisting them.

:class:`Pointers` resolves in-document references (``#``, ``#/definitions/..``,
``#/$defs/..``, any JSON pointer, ``$anchor`` / ``$id`` fragments). Nothing is ever
fetched: a reference outside the document resolves to ``None``.

:class:`RefExpander` is the normaliser's side of references: a target used once (or a
small one) is inlined, normalised in place; a cyclic or large shared target is hoisted
into one ``$defs`` table (``#/$defs/sgN``) and stays a reference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from structgen.constraints.schema.instance_types import schema_size
from structgen.constraints.schema.keywords import NON_SCHEMA_KEYS
from structgen.errors import ConstraintError

__all__ = ["HOISTED_PREFIX", "Pointers", "RefExpander", "escape_pointer"]

#: a target used more than once is inlined only below this many nodes
SHARED_NODES = 40
#: where hoisted targets live in a normalised schema
HOISTED_PREFIX = "#/$defs/"


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
