"""Compiling a JSON schema that the engine may not enforce exactly: a ladder of grammars.

:func:`schema_grammar` normalises the schema (:mod:`structgen.constraints.normalize`) and
asks llguidance for a grammar, strictly first. When the engine cannot compile it, each
next rung is a *looser* schema that still admits every valid value:

1. ``exact``     the normalised schema, strict (exact when normalisation was exact);
2. ``coerce``    ``oneOf`` read as ``anyOf``;
3. ``lenient``   unimplemented keywords and unknown formats ignored by the engine;
4. ``relaxed``   string patterns, formats, ``patternProperties`` (folded into
                 ``additionalProperties``), property/item counts and other hard
                 keywords dropped;
5. ``skeleton``  only types, properties, required keys, items, enums and ``anyOf``;
6. ``type``      any JSON value of the schema's top-level type(s);
7. ``any``       any JSON value.

Between ``coerce`` and ``lenient`` sits a second engine: when llguidance cannot compile the
normalised schema even with ``oneOf`` read as ``anyOf``, XGrammar (optional, imported
lazily: :mod:`structgen.constraints.xgrammar_engine`) is asked for the same schema -- rung
``xgrammar``, tighter than the llguidance rungs that ignore or drop keywords, but never
exact. When XGrammar is missing, fails or times out, a note says so and the llguidance
ladder goes on.

Every rung after the first is marked ``exact=False``: the compiled constraint then only
guarantees well-formed JSON of roughly the right shape, and
:func:`structgen.constraints.validation.validate_output` (jsonschema, formats checked) is what keeps
an invalid value from reaching the user -- it raises
:class:`~structgen.errors.OutputValidationError` with the raw text and each error.

Widening is only sound in positive positions; normalisation leaves no ``not`` /
``if`` behind, and every rung rewrites ``oneOf`` to ``anyOf`` before loosening a branch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import llguidance

from structgen.constraints.normalize import _types, normalize_schema
from structgen.errors import ConstraintError

__all__ = ["RUNGS", "SchemaGrammar", "relax", "schema_grammar", "skeleton"]

# "xgrammar": the same schema compiled by XGrammar (the second engine), see _second_engine
RUNGS = ("exact", "coerce", "xgrammar", "lenient", "relaxed", "skeleton", "type", "any")
#: the llguidance rung after which XGrammar is tried. Not right after "exact": "coerce" is
#: the exact schema with oneOf read as anyOf, and on MaskBench it rejects more invalid
#: instances than XGrammar (which also reads oneOf as anyOf and ignores a oneOf branch's
#: sibling keywords); from "lenient" down llguidance ignores or drops keywords, and
#: XGrammar is tighter.
SECOND_ENGINE_AFTER = "coerce"

# keywords dropped by the "relaxed" rung (each drop widens)
_RELAX_DROP = frozenset({
    "pattern", "format", "minLength", "maxLength", "minProperties", "maxProperties", "propertyNames",
    "contains", "minContains", "maxContains", "uniqueItems", "multipleOf", "unevaluatedProperties",
    "unevaluatedItems", "minItems", "maxItems",
})
_SKELETON_KEEP = frozenset({
    "type", "properties", "required", "items", "prefixItems", "additionalProperties", "enum", "const",
    "anyOf", "$ref", "$defs", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
})


@dataclass(frozen=True)
class SchemaGrammar:
    """An llguidance grammar for a schema, and how faithfully it enforces it."""

    grammar: str
    exact: bool
    rung: str
    #: why earlier rungs failed, what normalisation widened, engine warnings.
    warnings: tuple[str, ...] = ()
    schema: Any = None  # the schema the grammar was built from
    #: a fresh ``llguidance.LLMatcher`` for the grammar (a template to ``deep_copy``); for
    #: the ``xgrammar`` rung an :class:`~structgen.constraints.xgrammar_engine.XGrammarTemplate`
    matcher: Any = None


def _first_line(message: str) -> str:
    head = message.split("\n<state>", 1)[0].strip()
    return head if len(head) <= 300 else head[:297] + "..."


def _walk(s: Any, fn: Callable[[dict], dict]) -> Any:
    """Apply ``fn`` to every schema object, bottom-up (schema positions only)."""
    if not isinstance(s, dict):
        return s
    out: dict[str, Any] = {}
    for k, v in s.items():
        if k in ("properties", "patternProperties", "$defs", "dependentSchemas") and isinstance(v, dict):
            out[k] = {pk: _walk(pv, fn) for pk, pv in v.items()}
        elif k in ("allOf", "anyOf", "oneOf", "prefixItems") and isinstance(v, list):
            out[k] = [_walk(x, fn) for x in v]
        elif k in ("items", "additionalProperties", "contains", "propertyNames", "not", "if", "then",
                   "else", "unevaluatedProperties", "unevaluatedItems"):
            out[k] = _walk(v, fn)
        else:
            out[k] = v
    return fn(out)


def _one_of_to_any_of(s: dict) -> dict:
    if "oneOf" in s:
        s = dict(s)
        branches = s.pop("oneOf")
        if "anyOf" in s:
            s["allOf"] = list(s.get("allOf") or []) + [{"anyOf": branches}]
        else:
            s["anyOf"] = branches
    return s


def _relax_node(s: dict) -> dict:
    s = _one_of_to_any_of(s)
    out = {k: v for k, v in s.items() if k not in _RELAX_DROP}
    pats = out.pop("patternProperties", None)
    if isinstance(pats, dict) and pats:
        extra = out.get("additionalProperties", True)
        if extra is not True and extra != {}:
            # a key matching a pattern is checked against it, any other against
            # additionalProperties: their union admits both
            branches = [v for v in pats.values()] + ([extra] if extra is not False else [])
            out["additionalProperties"] = {"anyOf": branches} if len(branches) > 1 else branches[0]
    for k in ("not", "if", "then", "else", "dependentSchemas", "dependentRequired"):
        out.pop(k, None)  # (normalisation removed these; here only for foreign input)
    return out


def relax(schema: Any) -> Any:
    """The ``relaxed`` rung: hard keywords dropped (admits every value ``schema`` admits)."""
    return _walk(schema, _relax_node)


def _skeleton_node(s: dict) -> dict:
    s = _relax_node(s)
    out = {k: v for k, v in s.items() if k in _SKELETON_KEEP}
    if "allOf" in s:
        # allOf branches may only be dropped (widening); keep the first object's shape
        pass
    if out.get("additionalProperties") not in (None, True, False) and not isinstance(
            out.get("additionalProperties"), dict):
        out.pop("additionalProperties")
    return out


def skeleton(schema: Any) -> Any:
    """The ``skeleton`` rung: shape only (types, properties, items, enums)."""
    return _walk(schema, _skeleton_node)


def _top_types(schema: Any) -> Any:
    ts = _types(schema) if isinstance(schema, dict) else None
    if not ts:
        return {}
    if "number" in ts:
        ts = ts - {"integer"}
    out = sorted(ts)
    return {"type": out[0] if len(out) == 1 else out}


def _try(schema: Any, options: dict, tokenizer: Any) -> tuple[str | None, Any, list[str]]:
    """(grammar, matcher, warnings) or (None, None, errors)."""
    if isinstance(schema, bool):
        schema = {} if schema else {"type": "string", "enum": []}
    try:
        grammar = str(llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=options))  # type: ignore[arg-type]
    except (ValueError, TypeError, RuntimeError) as exc:
        return None, None, [_first_line(str(exc))]
    # building the matcher validates the grammar: one compile, not two
    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    if matcher.is_error():
        return None, None, [_first_line(matcher.get_error()) or "unknown error"]
    return grammar, matcher, [_first_line(m) for m in matcher.get_grammar_warnings()]


def schema_grammar(schema: Any, tokenizer: Any, *, whitespace_flexible: bool = False,
                   plain: bool = False, text: str | None = None,
                   second_engine: bool = True) -> SchemaGrammar:
    """The best grammar llguidance can build for ``schema`` (already meta-checked).

    ``tokenizer`` is an ``llguidance.LLTokenizer``. ``plain``: the schema uses only
    keywords the engine enforces exactly (:func:`structgen.constraints.metacheck.scan_schema`),
    so it is tried as it is before normalising (``text``: its JSON, if at hand). Raises
    :class:`~structgen.errors.ConstraintError` only if even "any JSON value" fails.
    """
    base = {"whitespace_flexible": whitespace_flexible}
    if plain and isinstance(schema, dict):
        grammar, matcher, messages = _try(schema if text is None else text, base, tokenizer)
        if grammar is not None:
            return SchemaGrammar(grammar, True, "exact", tuple(messages), schema, matcher)
    norm = normalize_schema(schema)
    notes: list[str] = [f"normalisation widened: {r}" for r in norm.relaxed]
    attempts: list[tuple[str, Callable[[], Any], dict]] = [
        ("exact", lambda: norm.schema, base),
        ("coerce", lambda: norm.schema, {**base, "coerce_one_of": True}),
        ("lenient", lambda: norm.schema, {**base, "coerce_one_of": True, "lenient": True}),
        ("relaxed", lambda: relax(norm.schema), {**base, "coerce_one_of": True, "lenient": True}),
        ("skeleton", lambda: skeleton(norm.schema), {**base, "coerce_one_of": True, "lenient": True}),
        ("type", lambda: _top_types(norm.schema), {**base, "lenient": True}),
        ("any", dict, base),
    ]
    for rung, make, options in attempts:
        candidate = make()
        grammar, matcher, messages = _try(candidate, options, tokenizer)
        if grammar is not None:
            exact = rung == "exact" and norm.exact
            return SchemaGrammar(grammar, exact, rung, tuple(notes + messages), candidate, matcher)
        notes.extend(f"{rung}: {m}" for m in messages)
        if rung == SECOND_ENGINE_AFTER and second_engine:
            other = _second_engine(norm.schema, tokenizer, whitespace_flexible, notes)
            if other is not None:
                return other
    raise ConstraintError("cannot compile even an unconstrained JSON grammar: " + "; ".join(notes[-3:]))


# --- the second engine: XGrammar, between the "coerce" and "lenient" rungs ---------------


def _second_engine(schema: Any, tokenizer: Any, whitespace_flexible: bool,
                   notes: list[str]) -> SchemaGrammar | None:
    """The ``xgrammar`` rung: the normalised schema compiled by XGrammar, when llguidance
    could not compile it (nor its ``coerce`` form). Always ``exact=False`` (XGrammar
    accepts some invalid instances; final validation guards them); ``matcher`` is then an
    :class:`~structgen.constraints.xgrammar_engine.XGrammarTemplate`. XGrammar missing,
    failing or timing out: a note, and the llguidance ladder goes on (``None``)."""
    from structgen.constraints.xgrammar_engine import XGRAMMAR_RUNG, compile_schema

    template, messages = compile_schema(schema, tokenizer, whitespace_flexible=whitespace_flexible)
    if template is None:
        notes.extend(f"{XGRAMMAR_RUNG}: {m}" for m in messages)
        return None
    used = "engine: xgrammar (llguidance could not compile the schema; final validation guards the output)"
    return SchemaGrammar("", False, XGRAMMAR_RUNG, (*notes, used), schema, template)
