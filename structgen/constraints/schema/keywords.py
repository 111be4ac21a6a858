"""JSON-schema keyword tables shared by the checker, the normaliser and the ladder.

Which keywords exist in which draft, which constrain only one instance type, which are
annotations, which formats the engine enforces: data only, no logic beyond
:func:`draft_of`.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ANNOTATIONS",
    "CHECKED_FORMATS",
    "DRAFTS",
    "ENGINE_FORMATS",
    "FORMAT_PATTERNS",
    "KNOWN",
    "KW_TYPE",
    "NEWER",
    "NON_SCHEMA_KEYS",
    "TYPED",
    "TYPES",
    "draft_of",
]

#: the seven JSON-schema instance types
TYPES = ("array", "boolean", "integer", "null", "number", "object", "string")

#: formats the engine (llguidance) enforces; any other format is dropped by normalisation.
ENGINE_FORMATS = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uri", "uuid"})


def _checked_formats() -> frozenset[str]:
    try:
        import jsonschema
    except ImportError:  # pragma: no cover - jsonschema is a dependency
        return frozenset()
    return frozenset(jsonschema.FormatChecker().checkers)


#: formats a validator's format checker may enforce: dropping them widens.
CHECKED_FORMATS = _checked_formats()

#: formats rewritten to an equivalent pattern.
FORMAT_PATTERNS = {
    "json-pointer": r"^(/([^~/]|~[01])*)*$",
    "relative-json-pointer": r"^(0|[1-9][0-9]*)(#|(/([^~/]|~[01])*)*)$",
}

#: keys that carry no assertion (dropped by normalisation)
ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "example", "$comment", "readOnly",
    "writeOnly", "deprecated", "contentMediaType", "contentEncoding", "contentSchema",
    "$schema", "$id", "id", "$anchor", "$vocabulary", "definitions", "$defs", "$dynamicAnchor",
    "$recursiveAnchor", "markdownDescription", "enumDescriptions", "deprecationMessage",
})

#: keywords that only constrain instances of one type
TYPED = {
    "string": ("minLength", "maxLength", "pattern", "format"),
    "number": ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
    "array": ("items", "prefixItems", "minItems", "maxItems", "uniqueItems", "contains",
              "minContains", "maxContains"),
    "object": ("properties", "required", "additionalProperties", "patternProperties",
               "minProperties", "maxProperties", "propertyNames", "dependentRequired",
               "dependentSchemas"),
}
#: keyword -> the one instance type it constrains
KW_TYPE = {kw: t for t, kws in TYPED.items() for kw in kws}

#: every assertion or applicator keyword the normaliser understands
KNOWN = frozenset(KW_TYPE) | {
    "type", "enum", "const", "allOf", "anyOf", "oneOf", "not", "$ref", "if", "then", "else",
    "dependencies", "additionalItems", "unevaluatedProperties", "unevaluatedItems",
}

_K2019 = ("dependentRequired", "dependentSchemas", "unevaluatedProperties", "unevaluatedItems",
          "minContains", "maxContains")
_K6 = ("const", "contains", "propertyNames")
#: keywords a draft's validator does not know (ignored: dropping them is exact)
NEWER = {
    3: _K6 + ("if", "then", "else", "prefixItems") + _K2019,
    4: _K6 + ("if", "then", "else", "prefixItems") + _K2019,
    6: ("if", "then", "else", "prefixItems") + _K2019,
    7: ("prefixItems",) + _K2019,
    2019: ("dependencies", "prefixItems"),
    2020: ("dependencies", "additionalItems"),
}

#: ``$schema`` URI fragments and the draft number they name
DRAFTS = (("draft-03", 3), ("draft-04", 4), ("draft-06", 6), ("draft-07", 7),
          ("2019-09", 2019), ("2020-12", 2020))

#: keys whose values are instances, not subschemas (never walked for ``$ref`` s)
NON_SCHEMA_KEYS = frozenset({"enum", "const", "default", "examples"})


def draft_of(schema: Any) -> int:
    """The draft number ``schema``'s ``$schema`` names (2020 when absent or unknown,
    jsonschema's ``validator_for`` default)."""
    uri = schema.get("$schema") if isinstance(schema, dict) else None
    if isinstance(uri, str):
        for tag, num in DRAFTS:
            if tag in uri:
                return num
        if "draft/next" in uri:
            return 2020
    return 2020
