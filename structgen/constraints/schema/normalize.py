"""JSON-schema normalisation: the walk that rewrites a schema before an engine compiles it.

:func:`normalize_schema` rewrites a schema into the subset the grammar engine compiles
well, keeping its meaning as a validator (jsonschema) sees it:

* local ``$ref`` s are inlined, cyclic or large shared targets hoisted into one ``$defs``
  table (:mod:`~structgen.constraints.schema.refs`);
* draft differences: draft-04 boolean ``exclusiveMinimum``/``exclusiveMaximum``,
  ``items`` arrays -> ``prefixItems`` (+ ``additionalItems`` -> ``items``),
  ``dependencies`` -> ``dependentRequired``/``dependentSchemas`` semantics, ``$ref``
  siblings ignored before 2019-09, annotations and unknown keywords dropped;
* ``allOf`` merged where exact and order-keeping (:mod:`~structgen.constraints.schema.merge`);
  ``not`` pushed inwards and ``if``/``then``/``else`` rewritten
  (:mod:`~structgen.constraints.schema.negate`); ``oneOf`` becomes ``anyOf`` when its
  branches are provably disjoint or each can be intersected with the others' negation;
  ``dependencies`` become ``anyOf`` pairs; unknown ``format`` s are dropped.

The rule: every rewrite preserves the set of valid instances, or widens it. A rewrite
that widens (a ``not`` that cannot be expressed, an external ``$ref``, a format the
engine cannot enforce) is recorded in :attr:`Normalized.relaxed` and makes
:attr:`Normalized.exact` false; the final validation then guards the output. Nothing
ever narrows the set, so a normalised ``false`` proves the schema unsatisfiable.
Garbage is passed through unchanged where possible; a value that is not a schema at all
raises :class:`~structgen.errors.ConstraintError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from structgen.constraints.schema.instance_types import drop_inapplicable
from structgen.constraints.schema.keywords import (
    ANNOTATIONS,
    CHECKED_FORMATS,
    ENGINE_FORMATS,
    FORMAT_PATTERNS,
    KNOWN,
    NEWER,
    draft_of,
)
from structgen.constraints.schema.merge import comes_first, conj, pairwise_disjoint, replace_key
from structgen.constraints.schema.negate import Negation, Unexpressible
from structgen.constraints.schema.refs import Pointers, RefExpander, share_repeats
from structgen.errors import ConstraintError

__all__ = ["Normalized", "normalize", "normalize_schema"]

#: ``dependencies`` expanded to ``anyOf`` pairs (more: dropped, widening)
MAX_DEPENDENCIES = 6
#: ``oneOf`` branches made exclusive through negation
MAX_ONE_OF = 6


@dataclass(frozen=True)
class Normalized:
    """The result of :func:`normalize_schema`."""

    schema: Any
    #: False when some rewrite widened the schema (see ``relaxed``).
    exact: bool
    #: what was widened, e.g. ``("not", "format:regex")``.
    relaxed: tuple[str, ...] = ()

    @property
    def unsatisfiable(self) -> bool:
        """No instance is valid (normalisation only widens, so neither is one of the original)."""
        s = self.schema
        return s is False or (isinstance(s, dict) and s.get("allOf") == [False])


class _Normalizer:
    """One schema's walk: references, negation and the keyword rewrites."""

    def __init__(self, root: Any, draft: int):
        self.draft = draft
        self.relaxed: list[str] = []
        self.refs = RefExpander(Pointers(root), self.norm, self.relaxed)
        self.negation = Negation(self.refs.hoisted_target)

    # -- the main walk -----------------------------------------------------------------
    def norm(self, s: Any) -> Any:
        if isinstance(s, bool):
            return s
        if not isinstance(s, dict):
            raise ConstraintError(f"a schema must be an object or a boolean, not {type(s).__name__}")
        if self.refs.depth > 400:
            raise ConstraintError("schema nested too deeply")
        s = dict(s)
        if "$ref" in s:
            if self.draft <= 7:
                return self.refs.expand(s["$ref"])
            late = comes_first(s, "$ref")
            r = self.refs.expand(s.pop("$ref"))
            rest = self.norm(s)
            if rest == {}:  # only annotations beside it: the target itself (kept shared)
                return {} if r is True else r
            return conj([r, rest] if late else [rest, r])
        out: dict[str, Any] = {}
        for k in NEWER.get(self.draft, ()):
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
            if k in ANNOTATIONS or k not in KNOWN:
                continue
            out[k] = v
        return self.finish(out)

    def finish(self, s: dict[str, Any]) -> Any:
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
            elif isinstance(v, list) and (k == "prefixItems" or (k in ("allOf", "anyOf", "oneOf") and v)):
                out[k] = [self.norm(x) for x in v]
            elif k in ("not", "if", "then", "else"):
                out[k] = self.norm(v)
            elif k == "format" and isinstance(v, str):
                if v in ENGINE_FORMATS:
                    out[k] = v
                elif v in FORMAT_PATTERNS and "pattern" not in s:
                    out["pattern"] = FORMAT_PATTERNS[v]
                elif v in CHECKED_FORMATS:
                    self.relaxed.append("format:" + v)
            elif k == "required" and not isinstance(v, list):
                continue  # draft-03 style boolean: ignored by later drafts
            else:
                out[k] = v
            if len(self.relaxed) > mark and k in ("not", "if", "oneOf"):
                widened.add(k)
        return self.simplify(out, widened)

    def simplify(self, s: dict[str, Any], widened: set[str] | frozenset[str] = frozenset()) -> Any:
        if drop_inapplicable(s) is False:
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
                    self.negation.if_then_else(cond, then, els, "if" in widened, self.relaxed)]
        if "not" in s:
            sub = s.pop("not")
            try:
                if "not" in widened:
                    raise Unexpressible
                neg = self.negation.negate(sub)
            except Unexpressible:
                self.relaxed.append("not")
                neg = {}
            s = conj([s, neg]) if neg != {} else s
            if not isinstance(s, dict):
                return s
        if "oneOf" in s:
            rewritten = self.one_of(s, "oneOf" in widened)
            if not isinstance(rewritten, dict):
                return rewritten
            s = rewritten
        if "allOf" in s:
            late = comes_first(s, "allOf")
            parts = list(s.pop("allOf"))
            return conj(parts + [s] if late else [s] + parts)
        if "anyOf" in s:
            branches = [b for b in s["anyOf"] if b is not False]
            if not branches:
                return False
            if any(b == {} or b is True for b in branches):
                del s["anyOf"]
            elif len(branches) == 1 and "allOf" not in s:
                late = comes_first(s, "anyOf")
                del s["anyOf"]
                return conj([branches[0], s] if late else [s, branches[0]])
            else:
                s["anyOf"] = branches
        return s

    # -- keyword rewrites ----------------------------------------------------------------
    def dependent(self, s: dict[str, Any]) -> None:
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
                pairs.append((k, conj([{"required": [k]}, v])))
        if not pairs:
            return
        props: dict[str, Any] = s["properties"] if isinstance(s.get("properties"), dict) else {}
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
        if len(keep) > MAX_DEPENDENCIES:
            self.relaxed.append("dependencies")
            return
        if keep:
            s["allOf"] = list(s.get("allOf") or []) + keep

    def min_max_properties(self, s: dict[str, Any]) -> None:
        if "maxProperties" not in s and "minProperties" not in s:
            return
        props: dict[str, Any] = s["properties"] if isinstance(s.get("properties"), dict) else {}
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

    def one_of(self, s: dict[str, Any], widened: bool) -> Any:
        branches = [b for b in s["oneOf"] if b is not False]
        if not branches:
            return False
        if len(branches) == 1:
            late = comes_first(s, "oneOf")
            del s["oneOf"]
            return conj([branches[0], s] if late else [s, branches[0]])
        # the instance also satisfies the siblings' type: check disjointness within it
        typed = branches
        if isinstance(s.get("type"), (str, list)):
            typed = [dict(b, type=s["type"]) if isinstance(b, dict) and "type" not in b else b for b in branches]
        # (the rewrites keep the oneOf's place among the keys: the engine orders
        # properties by where they first appear)
        if pairwise_disjoint(typed):
            if "anyOf" in s:
                return replace_key(s, "oneOf", "allOf", list(s.get("allOf") or []) + [{"anyOf": branches}])
            return replace_key(s, "oneOf", "anyOf", branches)
        if widened:  # branches were widened: exclusivity could narrow, so make it anyOf
            self.relaxed.append("oneOf")
            return replace_key(s, "oneOf", "allOf", list(s.get("allOf") or []) + [{"anyOf": branches}])
        if len(branches) <= MAX_ONE_OF:
            try:
                negs = [self.negation.negate(b) for b in branches]
                exact = []
                for i, b in enumerate(branches):
                    exact.append(conj([b] + [n for j, n in enumerate(negs) if j != i]))
                exact = [b for b in exact if b is not False]
                if not exact:
                    return False
                return replace_key(s, "oneOf", "allOf", list(s.get("allOf") or []) + [{"anyOf": exact}])
            except Unexpressible:
                pass
        return s  # left as oneOf: the engine coerces it (looser) if it must


def normalize_schema(schema: Any) -> Normalized:
    """Normalise ``schema`` (a dict or bool); see the module docstring."""
    if isinstance(schema, bool):
        return Normalized(schema, True)
    if not isinstance(schema, dict):
        raise ConstraintError(f"a JSON schema must be an object or a boolean, not {type(schema).__name__}")
    n = _Normalizer(schema, draft_of(schema))
    try:
        out = n.norm(schema)
    except RecursionError as exc:
        raise ConstraintError("schema nested too deeply to normalise") from exc
    if n.refs.defs:
        if out is False or out is True:
            out = {"allOf": [out]} if out is False else {}
        out = dict(out)
        out["$defs"] = n.refs.defs
    if n.refs.memo:  # a target was inlined: where it stayed unchanged at several places, share it
        out = share_repeats(out)
    relaxed = tuple(dict.fromkeys(n.relaxed))
    return Normalized(out, not relaxed, relaxed)


def normalize(schema: Any) -> Any:
    """The normalised schema (see :func:`normalize_schema`)."""
    return normalize_schema(schema).schema
