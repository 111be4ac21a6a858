"""JSON-schema normalisation before compiling.

``normalize_schema(schema)`` rewrites a schema into the subset the grammar engine
compiles well, keeping its meaning as a validator (jsonschema) sees it:

* local ``$ref`` s (``#``, ``#/definitions/..``, ``#/$defs/..``, any JSON pointer,
  ``$anchor`` / ``$id`` fragments) are inlined; cyclic or large shared targets are
  hoisted into one ``$defs`` table and stay references;
* draft differences: draft-04 boolean ``exclusiveMinimum``/``exclusiveMaximum``,
  ``items`` arrays -> ``prefixItems`` (+ ``additionalItems`` -> ``items``),
  ``dependencies`` -> ``dependentRequired``/``dependentSchemas`` semantics, ``$ref``
  siblings ignored before 2019-09, annotations and unknown keywords dropped;
* ``allOf`` branches are merged where that is exact and keeps the order in which the
  engine generates properties (first appearance, walking keys in order -- so a valid
  object in the original schema's order stays acceptable); ``not`` is pushed inwards
  (De Morgan, type complements, ``required`` -> ``properties: {k: false}``, bounds
  flipped); ``oneOf`` becomes ``anyOf`` when its branches are provably disjoint or
  each branch can be intersected with the others' negation; ``dependencies`` become
  ``anyOf`` pairs; unknown ``format`` s are dropped (validators ignore them).

The rule: every rewrite preserves the set of valid instances, or widens it. A rewrite
that widens (a ``not`` that cannot be expressed, an external ``$ref``, a format the
engine cannot enforce) is recorded in :attr:`Normalized.relaxed` and makes
:attr:`Normalized.exact` false; the final validation then guards the output.
Nothing ever narrows the set. Garbage is passed through unchanged where possible;
a value that is not a schema at all raises :class:`~structgen.errors.ConstraintError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from structgen.errors import ConstraintError

__all__ = ["ENGINE_FORMATS", "Normalized", "normalize", "normalize_schema"]

#: formats the engine (llguidance) enforces; any other format is dropped.
ENGINE_FORMATS = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uri", "uuid"})

#: formats a validator's format checker may enforce: dropping them widens.
def _checked_formats() -> frozenset[str]:
    try:
        import jsonschema
    except ImportError:  # pragma: no cover - jsonschema is a dependency
        return frozenset()
    return frozenset(jsonschema.FormatChecker().checkers)


_CHECKED_FORMATS = _checked_formats()

#: formats rewritten to an equivalent pattern.
_FORMAT_PATTERNS = {
    "json-pointer": r"^(/([^~/]|~[01])*)*$",
    "relative-json-pointer": r"^(0|[1-9][0-9]*)(#|(/([^~/]|~[01])*)*)$",
}

_TYPES = ("array", "boolean", "integer", "null", "number", "object", "string")

_ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "example", "$comment", "readOnly",
    "writeOnly", "deprecated", "contentMediaType", "contentEncoding", "contentSchema",
    "$schema", "$id", "id", "$anchor", "$vocabulary", "definitions", "$defs", "$dynamicAnchor",
    "$recursiveAnchor", "markdownDescription", "enumDescriptions", "deprecationMessage",
})

# keywords that only constrain instances of one type
_TYPED = {
    "string": ("minLength", "maxLength", "pattern", "format"),
    "number": ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
    "array": ("items", "prefixItems", "minItems", "maxItems", "uniqueItems", "contains",
              "minContains", "maxContains"),
    "object": ("properties", "required", "additionalProperties", "patternProperties",
               "minProperties", "maxProperties", "propertyNames", "dependentRequired",
               "dependentSchemas"),
}
_KW_TYPE = {kw: t for t, kws in _TYPED.items() for kw in kws}

_KNOWN = frozenset(_KW_TYPE) | {
    "type", "enum", "const", "allOf", "anyOf", "oneOf", "not", "$ref", "if", "then", "else",
    "dependencies", "additionalItems", "unevaluatedProperties", "unevaluatedItems",
}

_K2019 = ("dependentRequired", "dependentSchemas", "unevaluatedProperties", "unevaluatedItems",
          "minContains", "maxContains")
_K6 = ("const", "contains", "propertyNames")
_NEWER = {  # keywords a draft's validator does not know (ignored: dropping them is exact)
    3: _K6 + ("if", "then", "else", "prefixItems") + _K2019,
    4: _K6 + ("if", "then", "else", "prefixItems") + _K2019,
    6: ("if", "then", "else", "prefixItems") + _K2019,
    7: ("prefixItems",) + _K2019,
    2019: ("dependencies", "prefixItems"),
    2020: ("dependencies", "additionalItems"),
}

_DRAFTS = (("draft-03", 3), ("draft-04", 4), ("draft-06", 6), ("draft-07", 7),
           ("2019-09", 2019), ("2020-12", 2020))

_SHARED_NODES = 40          # a $ref target used more than once is inlined only below this size
_MAX_DEPS = 6               # dependencies expanded to anyOf pairs
_MAX_ONEOF = 6              # oneOf branches rewritten exactly


@dataclass(frozen=True)
class Normalized:
    """The result of :func:`normalize_schema`."""

    schema: Any
    #: False when some rewrite widened the schema (see ``relaxed``).
    exact: bool
    #: what was widened, e.g. ``("not", "format:regex")``.
    relaxed: tuple[str, ...] = ()


class _Unexpressible(Exception):
    """A negation or merge that cannot be written exactly."""


def _draft_of(schema: Any) -> int:
    uri = schema.get("$schema") if isinstance(schema, dict) else None
    if isinstance(uri, str):
        for tag, num in _DRAFTS:
            if tag in uri:
                return num
        if "draft/next" in uri:
            return 2020
    return 2020  # jsonschema's validator_for default


def _json_eq(a: Any, b: Any) -> bool:
    """Equality as JSON schema defines it (1 == 1.0, True != 1)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_eq(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_eq(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _type_of(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "integer" if v.is_integer() else "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def _types(s: Any) -> set[str] | None:
    """The instance types ``s`` can accept, or None for any (coarse, sound over-estimate)."""
    if s is False:
        return set()
    if not isinstance(s, dict):
        return None
    out: set[str] | None = None
    t = s.get("type")
    if isinstance(t, str):
        t = [t]
    if isinstance(t, list) and all(isinstance(x, str) for x in t):
        out = set(t)
        if "number" in out:
            out.add("integer")
    vals = None
    if "const" in s:
        vals = [s["const"]]
    elif isinstance(s.get("enum"), list):
        vals = s["enum"]
    if vals is not None:
        vt = set()
        for v in vals:
            vt.add(_type_of(v))
            if _type_of(v) == "integer":
                vt.add("number")
        out = vt if out is None else out & vt
    for key in ("anyOf", "oneOf"):
        if isinstance(s.get(key), list):
            u: set[str] = set()
            for b in s[key]:
                bt = _types(b)
                if bt is None:
                    u = set(_TYPES)
                    break
                u |= bt
            out = u if out is None else out & u
    return out


def _with_type(s: dict, types: set[str]) -> dict:
    s = dict(s)
    if "integer" in types and "number" in types:
        types = types - {"integer"}
    ts = sorted(types)
    s["type"] = ts[0] if len(ts) == 1 else ts
    return s


def _size(s: Any, limit: int = 1 << 30) -> int:
    n, stack = 0, [s]
    while stack and n < limit:
        x = stack.pop()
        n += 1
        if isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return n


class _Normalizer:
    def __init__(self, root: Any, draft: int):
        self.root = root
        self.draft = draft
        self.relaxed: list[str] = []
        self.defs: dict[str, Any] = {}        # hoisted name -> normalised schema
        self.hoisted: dict[str, str] = {}     # pointer -> hoisted name
        self.stack: list[str] = []            # pointers being expanded
        self.memo: dict[str, Any] = {}        # pointer -> normalised (acyclic) target
        self.cyclic: set[str] = set()
        self.def_reasons: dict[str, tuple[str, ...]] = {}
        self._anchors: dict[str, str] | None = None  # built on first use (few schemas have anchors)
        self._ref_counts: dict[str, int] | None = None  # built at the first $ref

    @property
    def anchors(self) -> dict[str, str]:
        if self._anchors is None:
            self._anchors = {}
            self._index_anchors(self.root, "#")
        return self._anchors

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
                        if isinstance(v, (dict, list)) and k not in ("enum", "const", "default", "examples"):
                            stack.append(v)
                elif isinstance(x, list):
                    stack.extend(v for v in x if isinstance(v, (dict, list)))
            self._ref_counts = counts
        return self._ref_counts

    # -- references ----------------------------------------------------------------
    def _index_anchors(self, s: Any, ptr: str, depth: int = 0) -> None:
        if depth > 200:
            return
        if isinstance(s, dict):
            for key in ("$anchor", "$id", "id"):
                a = s.get(key)
                if isinstance(a, str):
                    name = a[1:] if a.startswith("#") else (a if key == "$anchor" else None)
                    if name and "/" not in name:
                        self.anchors.setdefault(name, ptr)
            for k, v in s.items():
                if isinstance(v, (dict, list)) and k not in ("enum", "const", "default", "examples"):
                    self._index_anchors(v, ptr + "/" + k.replace("~", "~0").replace("/", "~1"), depth + 1)
        elif isinstance(s, list):
            for i, v in enumerate(s):
                self._index_anchors(v, f"{ptr}/{i}", depth + 1)

    def _local_pointer(self, ref: str) -> str | None:
        """``ref`` as a pointer into the root ("#..."), or None if external."""
        if "#" not in ref:
            base = ref
            frag = ""
        else:
            base, frag = ref.split("#", 1)
        if base:
            root_id = self.root.get("$id") or self.root.get("id") if isinstance(self.root, dict) else None
            if not (isinstance(root_id, str) and root_id.split("#")[0].rstrip("/") == base.rstrip("/")):
                return None
        frag = unquote(frag)
        if frag and not frag.startswith("/"):
            target = self.anchors.get(frag)
            return target
        return "#" + frag

    def _resolve(self, ptr: str) -> Any:
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

    def _hoist(self, ptr: str) -> dict:
        name = self.hoisted.get(ptr)
        if name is None:
            name = f"sg{len(self.hoisted)}"
            self.hoisted[ptr] = name
            self.defs[name] = True  # placeholder while normalising (cycles)
            mark = len(self.relaxed)
            self.defs[name] = self._norm_target(ptr, hoisting=True)
            self.def_reasons[ptr] = tuple(self.relaxed[mark:])
        return {"$ref": f"#/$defs/{name}"}

    def hoisted_target(self, s: dict) -> Any:
        """The normalised schema behind a hoisted, non-cyclic reference (else None)."""
        ref = s.get("$ref")
        if not isinstance(ref, str) or not ref.startswith("#/$defs/"):
            return None
        name = ref[len("#/$defs/"):]
        for ptr, n in self.hoisted.items():
            if n == name:
                if ptr in self.cyclic or self.defs.get(name) is True:
                    return None
                return self.defs[name]
        return None

    def _norm_target(self, ptr: str, hoisting: bool = False) -> Any:
        self.stack.append(ptr)
        try:
            return self.norm(self._resolve(ptr))
        finally:
            self.stack.pop()

    def ref(self, ref: Any) -> Any:
        if not isinstance(ref, str):
            self.relaxed.append("$ref")
            return {}
        ptr = self._local_pointer(ref)
        if ptr is None:
            self.relaxed.append("$ref:external")
            return {}
        try:
            self._resolve(ptr)
        except KeyError:
            raise ConstraintError(f"$ref {ref!r} cannot be resolved in the schema") from None
        if ptr in self.hoisted:
            self.relaxed.extend(self.def_reasons.get(ptr, ()))
            return {"$ref": f"#/$defs/{self.hoisted[ptr]}"}
        if ptr in self.stack:
            self.cyclic.add(ptr)
            return self._hoist(ptr)
        if ptr in self.memo:
            got, reasons = self.memo[ptr]
            self.relaxed.extend(reasons)
            return got
        if self.ref_counts.get(ref, 0) > 1 and _size(self._resolve(ptr), _SHARED_NODES + 1) > _SHARED_NODES:
            return self._hoist(ptr)  # a large shared target: one definition, many references
        n_cyc = len(self.cyclic)
        mark = len(self.relaxed)
        out = self._norm_target(ptr)
        if ptr in self.hoisted:  # became cyclic while expanding
            return {"$ref": f"#/$defs/{self.hoisted[ptr]}"}
        if len(self.cyclic) == n_cyc:
            self.memo[ptr] = (out, tuple(self.relaxed[mark:]))
        return out

    # -- the main walk -----------------------------------------------------------------
    def norm(self, s: Any) -> Any:
        if isinstance(s, bool):
            return s
        if not isinstance(s, dict):
            raise ConstraintError(f"a schema must be an object or a boolean, not {type(s).__name__}")
        if len(self.stack) > 400:
            raise ConstraintError("schema nested too deeply")
        s = dict(s)
        if "$ref" in s:
            if self.draft <= 7:
                return self.ref(s["$ref"])
            late = _comes_first(s, "$ref")
            r = self.ref(s.pop("$ref"))
            rest = self.norm(s)
            return self.conj([r, rest] if late else [rest, r])
        out: dict[str, Any] = {}
        for k in _NEWER.get(self.draft, ()):
            s.pop(k, None)  # not a keyword in this draft: validators ignore it
        if self.draft <= 4:
            for lo, ex in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
                if isinstance(s.get(ex), bool) and s.pop(ex) and lo in s:
                    s[ex] = s.pop(lo)
        if isinstance(s.get("items"), list):
            s["prefixItems"] = s.pop("items")
            if "additionalItems" in s:
                s["items"] = s.pop("additionalItems")
        else:
            s.pop("additionalItems", None)
        if "dependencies" in s:
            deps = s.pop("dependencies")
            if isinstance(deps, dict):
                req = {k: v for k, v in deps.items() if isinstance(v, list)}
                sch = {k: v for k, v in deps.items() if not isinstance(v, list)}
                if req:
                    s["dependentRequired"] = {**req, **(s.get("dependentRequired") or {})}
                if sch:
                    s["dependentSchemas"] = {**sch, **(s.get("dependentSchemas") or {})}
        for k, v in s.items():
            if k in _ANNOTATIONS or k not in _KNOWN:
                continue
            out[k] = v
        return self.finish(out)

    def finish(self, s: dict) -> Any:
        """Normalise the keywords of one (ref-free) schema object."""
        out: dict[str, Any] = {}
        widened: set[str] = set()  # negated operands that were widened: never negate them
        for k, v in s.items():
            mark = len(self.relaxed)
            if k in ("properties", "patternProperties", "dependentSchemas") and isinstance(v, dict):
                out[k] = {pk: self.norm(pv) for pk, pv in v.items()}
            elif k in ("additionalProperties", "items", "contains", "propertyNames",
                       "unevaluatedProperties", "unevaluatedItems") and isinstance(v, (dict, bool)):
                out[k] = self.norm(v)
            elif (k == "prefixItems" and isinstance(v, list)) or (k in ("allOf", "anyOf", "oneOf") and isinstance(v, list) and v):
                out[k] = [self.norm(x) for x in v]
            elif k in ("not", "if", "then", "else"):
                out[k] = self.norm(v)
            elif k == "format" and isinstance(v, str):
                if v in ENGINE_FORMATS:
                    out[k] = v
                elif v in _FORMAT_PATTERNS and "pattern" not in s:
                    out["pattern"] = _FORMAT_PATTERNS[v]
                elif v in _CHECKED_FORMATS:
                    self.relaxed.append("format:" + v)
            elif k == "required" and not isinstance(v, list):
                continue  # draft-03 style boolean: ignored by later drafts
            else:
                out[k] = v
            if len(self.relaxed) > mark and k in ("not", "if", "oneOf"):
                widened.add(k)
        return self.simplify(out, widened)

    def simplify(self, s: dict, widened: set[str] = frozenset()) -> Any:  # type: ignore[assignment]
        if _drop_inapplicable(s) is False:
            return False
        if s.get("minProperties") == 0:
            del s["minProperties"]
        if s.get("minItems") == 0:
            del s["minItems"]
        if s.get("minLength") == 0:
            del s["minLength"]
        if s.get("uniqueItems") is False:
            del s["uniqueItems"]
        self.dependent(s)
        self.min_max_properties(s)
        if "if" in s or "then" in s or "else" in s:
            cond, then, els = s.pop("if", None), s.pop("then", None), s.pop("else", None)
            if cond is not None and (then is not None or els is not None):
                s["allOf"] = list(s.get("allOf") or []) + [
                    self.if_then_else(cond, then, els, "if" in widened)]
        if "not" in s:
            sub = s.pop("not")
            try:
                if "not" in widened:
                    raise _Unexpressible
                neg = self.negate(sub)
            except _Unexpressible:
                self.relaxed.append("not")
                neg = {}
            s = self.conj([s, neg]) if neg != {} else s
            if not isinstance(s, dict):
                return s
        if "oneOf" in s:
            s = self.one_of(s, "oneOf" in widened)
            if not isinstance(s, dict):
                return s
        if "allOf" in s:
            late = _comes_first(s, "allOf")
            parts = list(s.pop("allOf"))
            return self.conj(parts + [s] if late else [s] + parts)
        if "anyOf" in s:
            branches = [b for b in s["anyOf"] if b is not False]
            if not branches:
                return False
            if any(b == {} or b is True for b in branches):
                del s["anyOf"]
            elif len(branches) == 1 and "allOf" not in s:
                late = _comes_first(s, "anyOf")
                del s["anyOf"]
                return self.conj([branches[0], s] if late else [s, branches[0]])
            else:
                s["anyOf"] = branches
        return s

    # -- keyword rewrites ----------------------------------------------------------------
    def dependent(self, s: dict) -> None:
        if "dependentRequired" not in s and "dependentSchemas" not in s:
            return
        req = s.pop("dependentRequired", None)
        sch = s.pop("dependentSchemas", None)
        pairs: list[tuple[str, Any]] = []
        if isinstance(req, dict):
            for k, v in req.items():
                if isinstance(v, list) and v:
                    pairs.append((k, {"required": [k] + [x for x in v if x != k]}))
        if isinstance(sch, dict):
            for k, v in sch.items():
                if v is True or v == {}:
                    continue
                pairs.append((k, self.conj([{"required": [k]}, v])))
        if not pairs:
            return
        props: dict = s["properties"] if isinstance(s.get("properties"), dict) else {}
        closed = s.get("additionalProperties") is False and not s.get("patternProperties")
        keep = []
        for k, branch in pairs:
            if closed and k not in props:
                continue  # k can never be present
            if k in (s.get("required") or []) and isinstance(branch, dict) and set(branch) == {"required"}:
                req_now = list(s.get("required") or [])
                s["required"] = req_now + [x for x in branch["required"] if x not in req_now]
                continue
            keep.append({"anyOf": [{"properties": {k: False}}, branch]})
        if len(keep) > _MAX_DEPS:
            self.relaxed.append("dependencies")
            return
        if keep:
            s["allOf"] = list(s.get("allOf") or []) + keep

    def min_max_properties(self, s: dict) -> None:
        if "maxProperties" not in s and "minProperties" not in s:
            return
        props: dict = s["properties"] if isinstance(s.get("properties"), dict) else {}
        required = [r for r in (s.get("required") or []) if isinstance(r, str)]
        closed = s.get("additionalProperties") is False and not s.get("patternProperties")
        mx = s.get("maxProperties")
        if isinstance(mx, int) and closed and mx >= len(props):
            del s["maxProperties"]
        mn = s.get("minProperties")
        if isinstance(mn, int) and mn <= len(set(required)):
            del s["minProperties"]
        elif mn == 1 and closed and props and len(props) <= 20:
            del s["minProperties"]
            s["allOf"] = list(s.get("allOf") or []) + [{"anyOf": [{"required": [k]} for k in props]}]

    def if_then_else(self, cond: Any, then: Any, els: Any, widened: bool) -> Any:
        then = {} if then is None else then
        els = {} if els is None else els
        try:
            if widened:
                raise _Unexpressible
            ncond = self.negate(cond)
        except _Unexpressible:
            self.relaxed.append("if")
            return {"anyOf": [then, els]} if then != {} and els != {} else {}
        return {"anyOf": [self.conj([cond, then]), self.conj([ncond, els])]}

    def one_of(self, s: dict, widened: bool) -> Any:
        branches = [b for b in s["oneOf"] if b is not False]
        if not branches:
            return False
        if len(branches) == 1:
            late = _comes_first(s, "oneOf")
            del s["oneOf"]
            return self.conj([branches[0], s] if late else [s, branches[0]])
        # the instance also satisfies the siblings' type: check disjointness within it
        typed = branches
        if isinstance(s.get("type"), (str, list)):
            typed = [dict(b, type=s["type"]) if isinstance(b, dict) and "type" not in b else b for b in branches]
        # (the rewrites keep the oneOf's place among the keys: the engine orders
        # properties by where they first appear)
        if self.pairwise_disjoint(typed):
            if "anyOf" in s:
                return _replace_key(s, "oneOf", "allOf", list(s.get("allOf") or []) + [{"anyOf": branches}])
            return _replace_key(s, "oneOf", "anyOf", branches)
        if widened:  # branches were widened: exclusivity could narrow, so make it anyOf
            self.relaxed.append("oneOf")
            return _replace_key(s, "oneOf", "allOf", list(s.get("allOf") or []) + [{"anyOf": branches}])
        if len(branches) <= _MAX_ONEOF:
            try:
                negs = [self.negate(b) for b in branches]
                exact = []
                for i, b in enumerate(branches):
                    exact.append(self.conj([b] + [n for j, n in enumerate(negs) if j != i]))
                exact = [b for b in exact if b is not False]
                if not exact:
                    return False
                return _replace_key(s, "oneOf", "allOf", list(s.get("allOf") or []) + [{"anyOf": exact}])
            except _Unexpressible:
                pass
        return s  # left as oneOf: the engine coerces it (looser) if it must

    def pairwise_disjoint(self, branches: list) -> bool:
        for i in range(len(branches)):
            for j in range(i + 1, len(branches)):
                if not _disjoint(branches[i], branches[j]):
                    return False
        return True

    # -- conjunction ------------------------------------------------------------------
    def conj(self, parts: list) -> Any:
        """allOf(parts), merged into one schema where that is exact.

        Parts keep their order (the engine orders properties by first appearance): a
        part is merged into the first mergeable one only where that keeps the order.
        """
        flat: list = []
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
        slots: list = []  # references and unmerged parts in order; None marks acc's place
        for p in flat:
            if "$ref" in p:
                slots.append(p)
            elif acc is None:
                acc = dict(p)
                slots.append(None)
            else:
                # past a reference or an unmerged part, only parts that name no
                # properties may move up into acc
                merged = _merge(acc, p) if slots[-1] is None or not _sources(p) else None
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
        if _drop_inapplicable(acc) is False:
            return False
        if slots[0] is None and all(x is None or "$ref" not in x for x in slots):
            rest = slots[1:]
            if not rest:
                return acc
            src = _sources(acc)
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

    # -- negation -------------------------------------------------------------------
    def negate(self, s: Any) -> Any:
        """A schema valid exactly when ``s`` is not (``s`` already normalised)."""
        if s is True or s == {}:
            return False
        if s is False:
            return {}
        if not isinstance(s, dict):
            raise _Unexpressible
        if "$ref" in s:
            target = self.hoisted_target(s)
            if target is None or len(s) != 1:
                raise _Unexpressible
            return self.negate(target)
        alts: list = []
        ts = None
        if "type" in s:
            t = s["type"]
            tl = [t] if isinstance(t, str) else t
            if not isinstance(tl, list):
                raise _Unexpressible
            ts = set(tl)
            if "number" in ts:
                ts.add("integer")
            if "integer" in ts and "number" not in ts:
                raise _Unexpressible  # non-integral numbers are not expressible
            comp = set(_TYPES) - ts - ({"number"} if "integer" in ts else set())
            if comp:
                alts.append(_with_type({}, comp))
        for k, v in s.items():
            if k == "type":
                continue
            alts.extend(self._negate_kw(k, v, s))
        alts = [a for a in alts if a is not False]
        if not alts:
            return False
        return alts[0] if len(alts) == 1 else {"anyOf": alts}

    def _negate_kw(self, k: str, v: Any, s: dict) -> list:
        t = _KW_TYPE.get(k)
        if t == "number":
            t = "number"
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
                raise _Unexpressible
            return _negate_enum(vals)
        if k == "anyOf" and isinstance(v, list):
            negs = [self.negate(b) for b in v]
            c = self.conj(negs)
            return [] if c is False else [c]
        if k == "allOf" and isinstance(v, list):
            return [self.negate(b) for b in v]
        if k == "oneOf" and isinstance(v, list):
            if self.pairwise_disjoint(v):
                c = self.conj([self.negate(b) for b in v])
                return [] if c is False else [c]
            raise _Unexpressible
        if k == "not":
            return [v]
        if k == "items" and isinstance(v, (dict, bool)) and "prefixItems" not in s:
            if v is True or v == {}:
                return []
            if v is False:
                return [{"type": "array", "minItems": 1}]
            raise _Unexpressible
        if k == "uniqueItems" and v is False:
            return []
        raise _Unexpressible


def _negate_enum(vals: list) -> list:
    """not enum: expressible when the enum covers only booleans / null (finite domains)."""
    present = {_type_of(v) for v in vals}
    rest = set(_TYPES) - present
    out: list = []
    for t in present:
        if t == "null":
            continue
        if t == "boolean":
            left = [b for b in (True, False) if not any(_json_eq(b, v) for v in vals)]
            if left:
                out.append({"const": left[0]} if len(left) == 1 else {"type": "boolean"})
            continue
        raise _Unexpressible
    if "integer" in rest and "number" not in rest:
        rest.discard("integer")
    if rest:
        out.append(_with_type({}, rest))
    return out


_ONE_TYPE = {t: frozenset({t, "integer"} if t == "number" else {t}) for t in _TYPES}


def _drop_inapplicable(s: dict) -> Any:
    """Drop keywords for types ``s`` cannot have (in place); False if no type is possible."""
    if "enum" in s or "const" in s:
        ts = _types({k: s[k] for k in ("type", "enum", "const") if k in s})
    else:
        t = s.get("type")
        if t is None:
            return s
        ts = _ONE_TYPE.get(t) if isinstance(t, str) else None
        if ts is None:
            ts = _types({"type": t})
    if ts is not None:
        if not ts:
            return False
        for kw in list(s):
            t = _KW_TYPE.get(kw)
            if t and not (t in ts or (t == "number" and "integer" in ts)):
                del s[kw]
    return s


def _disjoint(a: Any, b: Any) -> bool:
    """True only if no instance can satisfy both schemas (sound, incomplete)."""
    if a is False or b is False:
        return True
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    ta, tb = _types(a), _types(b)
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
            if isinstance(yvals, list) and not any(_json_eq(u, w) for u in vals for w in yvals):
                return True
    if both is not None and both <= {"object"}:
        pa, pb = a.get("properties") or {}, b.get("properties") or {}
        ra, rb = set(a.get("required") or []), set(b.get("required") or [])
        if isinstance(pa, dict) and isinstance(pb, dict):
            for k in ra & rb:
                if k in pa and k in pb and _disjoint(pa[k], pb[k]):
                    return True
            for x, px, y, ry in ((a, pa, b, rb), (b, pb, a, ra)):
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


def _merge(a: dict, b: dict) -> Any:
    """Exact merge of two schema objects, False if unsatisfiable, None if not mergeable
    (including when the merge would change the engine's property order)."""
    if "$ref" in a or "$ref" in b:
        return None  # a (cyclic) reference stays a branch of allOf, never gets siblings
    if not _keeps_order(a, b):
        return None
    for group in _GROUPS:
        ga = {k: a[k] for k in group if k in a}
        gb = {k: b[k] for k in group if k in b}
        if ga and gb and not _json_eq(ga, gb) and not (set(ga) | set(gb) <= {"properties"}):
            return None
    out = dict(a)
    for k, v in b.items():
        if k not in out:
            out[k] = v
            continue
        u = out[k]
        if _json_eq(u, v) and k not in ("allOf",):
            continue
        if k == "type":
            ta = _types({"type": u})
            tb = _types({"type": v})
            if ta is None or tb is None:
                return None
            both = ta & tb
            if not both:
                return False
            out = _with_type(out, both)
        elif k in _MERGE_MINS and _num(u) and _num(v):
            out[k] = max(u, v)
        elif k in _MERGE_MAXS and _num(u) and _num(v):
            out[k] = min(u, v)
        elif k == "required" and isinstance(u, list) and isinstance(v, list):
            out[k] = list(u) + [x for x in v if x not in u]
        elif k in ("enum", "const"):
            ua = [u] if k == "const" else u
            va = [v] if k == "const" else v
            if not isinstance(ua, list) or not isinstance(va, list):
                return None
            keep = [x for x in ua if any(_json_eq(x, y) for y in va)]
            if not keep:
                return False
            out.pop("const", None)
            out["enum"] = keep
        elif k == "uniqueItems":
            out[k] = bool(u) or bool(v)
        elif k == "properties" and isinstance(u, dict) and isinstance(v, dict):
            if _open(a) is not True or _open(b) is not True:
                return None
            props = dict(u)
            for pk, pv in v.items():
                props[pk] = pv if pk not in props else _conj2(props[pk], pv)
            out[k] = props
        elif k == "allOf" and isinstance(u, list) and isinstance(v, list):
            out[k] = list(u) + list(v)
        else:
            return None
    if "properties" in a and "properties" not in b and _open(b) is not True:
        return None
    if "properties" in b and "properties" not in a and _open(a) is not True:
        return None
    if "enum" in out and "const" in out:
        keep = [x for x in out["enum"] if _json_eq(x, out["const"])]
        if not keep:
            return False
        del out["const"]
        out["enum"] = keep
    return out


# keywords that name object properties: llguidance generates properties in the order it
# first meets them, walking a schema's keys in order (and allOf / anyOf / $ref in place)
_ORDER_KEYS = frozenset({"properties", "allOf", "anyOf", "oneOf", "$ref"})


def _sources(s: dict) -> list[str]:
    """``s``'s keywords that may name properties, in key order."""
    return [k for k in s if k in _ORDER_KEYS]


def _comes_first(s: dict, key: str) -> bool:
    """True when the subschema(s) under ``key`` name properties before the rest of ``s``
    does: every other property-naming keyword of ``s`` comes after ``key``."""
    keys = list(s)
    at = keys.index(key)
    others = [i for i, k in enumerate(keys) if k in _ORDER_KEYS and k != key]
    return bool(others) and min(others) > at


def _replace_key(s: dict, old: str, new: str, value: Any) -> dict:
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


def _keeps_order(a: dict, b: dict) -> bool:
    """Whether merging ``b`` into ``a`` keeps the property order of ``allOf: [a, b]``:
    every property ``a`` names, then those ``b`` names. A keyword both carry is merged at
    ``a``'s place, one only ``b`` has goes last."""
    sa, sb = _sources(a), _sources(b)
    if not sa or not sb:
        return True
    shared = []
    for k in sb:
        if k not in a:
            continue
        if k == "properties" and isinstance(a[k], dict) and isinstance(b[k], dict) \
                and all(n in a[k] or v is False for n, v in b[k].items()):
            continue  # no new property that may appear: nothing moves
        if k in ("anyOf", "oneOf") and _json_eq(a[k], b[k]):
            continue
        shared.append(k)
    if not shared:
        return True
    return len(shared) == 1 and sa[-1] == shared[0] and sb[0] == shared[0]


# keywords that read each other: merged only when one side has none of them, or equal
_GROUPS = (("properties", "patternProperties", "additionalProperties"), ("prefixItems", "items"))


def _open(s: dict) -> bool:
    return s.get("additionalProperties", True) in (True, {}) and not s.get("patternProperties")


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _conj2(x: Any, y: Any) -> Any:
    if x is True or x == {}:
        return y
    if y is True or y == {}:
        return x
    if x is False or y is False:
        return False
    if isinstance(x, dict) and isinstance(y, dict):
        m = _merge(x, y)
        if m is not None:
            return m
    return {"allOf": [x, y]}


def normalize_schema(schema: Any) -> Normalized:
    """Normalise ``schema`` (a dict or bool); see the module docstring."""
    if isinstance(schema, bool):
        return Normalized(schema, True)
    if not isinstance(schema, dict):
        raise ConstraintError(f"a JSON schema must be an object or a boolean, not {type(schema).__name__}")
    n = _Normalizer(schema, _draft_of(schema))
    try:
        out = n.norm(schema)
    except RecursionError as exc:
        raise ConstraintError("schema nested too deeply to normalise") from exc
    if n.defs:
        if out is False or out is True:
            out = {"allOf": [out]} if out is False else {}
        out = dict(out)
        out["$defs"] = n.defs
    relaxed = tuple(dict.fromkeys(n.relaxed))
    return Normalized(out, not relaxed, relaxed)


def normalize(schema: Any) -> Any:
    """The normalised schema (see :func:`normalize_schema`)."""
    return normalize_schema(schema).schema

