"""Schema normalisation, the fallback ladder, the fast meta-check and the bounded cache.

Unit tests need no model (llguidance and the tokenizer only where named). The hypothesis
tests fuzz the normaliser: no crash, no hang, only ConstraintError; and for generated
instances the normalised schema never rejects what the original accepts (jsonschema),
and accepts exactly the same when it claims to be exact.
"""

from __future__ import annotations

import json
import resource

import jsonschema
import jsonschema.validators
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from structgen.constraints.schema.loosen import relax, skeleton
from structgen.constraints.schema.metacheck import meta_errors
from structgen.constraints.schema.normalize import normalize, normalize_schema
from structgen.errors import ConstraintError


def _validator(schema):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def _norm_validator(norm_schema):
    # the normalised schema is 2020-12 vocabulary (prefixItems, $defs) whatever the input draft
    return jsonschema.Draft202012Validator(norm_schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)


def _same(schema, instances):
    n = normalize_schema(schema)
    v0, v1 = _validator(schema), _norm_validator(n.schema)
    for x in instances:
        assert v0.is_valid(x) <= v1.is_valid(x), (x, n.schema)  # never narrower
        if n.exact:
            assert v0.is_valid(x) == v1.is_valid(x), (x, n.schema)
    return n


# --- references ------------------------------------------------------------------------


def test_local_refs_are_inlined_and_definitions_dropped():
    s = {"definitions": {"pos": {"type": "integer", "minimum": 1}},
         "type": "object", "properties": {"a": {"$ref": "#/definitions/pos"}, "b": {"$ref": "#/$defs/s"}},
         "$defs": {"s": {"type": "string"}}}
    n = normalize_schema(s)
    assert n.exact
    assert n.schema == {"type": "object", "properties": {"a": {"type": "integer", "minimum": 1},
                                                        "b": {"type": "string"}}}


def test_cyclic_refs_stay_references():
    s = {"$ref": "#/definitions/node",
         "definitions": {"node": {"type": "object", "properties": {"kids": {"type": "array",
                                                                          "items": {"$ref": "#/definitions/node"}}}}}}
    n = _same(s, [{}, {"kids": [{"kids": []}]}, {"kids": [1]}, 3])
    assert n.exact
    text = json.dumps(n.schema)
    assert '"$ref": "#/$defs/sg0"' in text and "$defs" in n.schema


def test_pointer_escapes_and_root_ref():
    s = {"properties": {"a/b": {"type": "integer"}, "self": {"$ref": "#"}},
         "items": {"$ref": "#/properties/a~1b"}}
    _same(s, [{"a/b": 1}, {"a/b": "x"}, {"self": {"a/b": 2}}, {"self": {"a/b": "no"}}])


def test_a_target_inlined_unchanged_at_several_places_is_shared_again():
    # the engine compiles a shared definition once, each inlined copy of its pattern anew
    ids = {"type": "array", "items": {"type": "string", "pattern": "^[a-f0-9]{8}$"}}
    s = {"$schema": "http://json-schema.org/draft-04/schema#", "definitions": {"ids": ids}, "type": "object",
         "properties": {k: {"$ref": "#/definitions/ids", "description": k} for k in "abc"},
         "additionalProperties": False}
    n = _same(s, [{}, {"a": ["0123abcd"], "c": []}, {"b": ["xyz"]}, {"a": [1]}, {"d": []}])
    assert n.exact
    assert json.dumps(n.schema).count("pattern") == 1
    assert len({json.dumps(v) for v in n.schema["properties"].values()}) == 1
    assert n.schema["properties"]["a"]["$ref"].startswith("#/$defs/")
    # a 2020-12 reference with annotations beside it is the target itself, shared the same way
    s20 = {"$defs": {"ids": ids}, "type": "object",
           "properties": {k: {"$ref": "#/$defs/ids", "title": k} for k in "ab"}}
    n20 = _same(s20, [{"a": ["0123abcd"]}, {"b": ["no"]}])
    assert json.dumps(n20.schema).count("pattern") == 1


def test_missing_local_ref_is_a_constraint_error():
    with pytest.raises(ConstraintError, match="cannot be resolved"):
        normalize({"$ref": "#/definitions/nope"})


def test_ref_siblings_ignored_before_2019_but_applied_after():
    d7 = {"$schema": "http://json-schema.org/draft-07/schema#", "definitions": {"a": {"type": "string"}},
          "$ref": "#/definitions/a", "minLength": 3}
    assert normalize(d7) == {"type": "string"}
    d20 = {"$defs": {"a": {"type": "string"}}, "$ref": "#/$defs/a", "minLength": 3}
    assert normalize(d20) == {"type": "string", "minLength": 3}


# --- drafts ------------------------------------------------------------------------------


def test_draft4_boolean_exclusive_bounds():
    s = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "number", "minimum": 1,
         "exclusiveMinimum": True, "maximum": 5, "exclusiveMaximum": False}
    assert normalize(s) == {"type": "number", "exclusiveMinimum": 1, "maximum": 5}
    _same(s, [0, 1, 1.5, 5, 6])


def test_items_array_becomes_prefix_items():
    s = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "array",
         "items": [{"type": "integer"}, {"type": "string"}], "additionalItems": False}
    assert normalize(s) == {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
                            "items": False}


def test_keywords_of_later_drafts_are_ignored_in_earlier_ones():
    s = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "string", "const": "x"}
    assert normalize(s) == {"type": "string"}


def test_dependencies_become_exact_any_of():
    s = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
         "properties": {"a": {}, "b": {}, "c": {}}, "dependencies": {"a": ["b"], "c": {"required": ["a"]}}}
    n = _same(s, [{}, {"a": 1}, {"a": 1, "b": 2}, {"c": 1}, {"c": 1, "a": 1, "b": 1}, {"b": 1}])
    assert n.exact and "dependencies" not in json.dumps(n.schema)
    # 2019-09 and later do not know `dependencies`: validators ignore it, and so do we
    assert normalize({"dependencies": {"a": ["b"]}}) == {}


# --- allOf / not / oneOf / if ------------------------------------------------------------


def test_all_of_merges():
    s = {"allOf": [{"type": ["string", "integer"], "minimum": 1}, {"type": "integer", "maximum": 9},
                   {"required": ["x"]}]}
    assert normalize(s) == {"type": "integer", "minimum": 1, "maximum": 9}


def test_all_of_with_closed_object_is_not_merged_wrongly():
    s = {"allOf": [{"properties": {"a": {}}, "additionalProperties": False}, {"properties": {"b": {}}}]}
    _same(s, [{}, {"a": 1}, {"b": 1}, {"a": 1, "b": 1}])


@pytest.mark.parametrize("schema,instances", [
    ({"not": {"type": "string"}}, ["x", 1, None, [], {}]),
    ({"type": "object", "not": {"required": ["a", "b"]}}, [{}, {"a": 1}, {"a": 1, "b": 1}]),
    ({"not": {"anyOf": [{"type": "null"}, {"minimum": 3}]}}, [None, 1, 3, 4, "x"]),
    ({"not": {"enum": [True, None]}}, [True, False, None, 0, "a"]),
    ({"type": "string", "not": {"minLength": 3}}, ["", "ab", "abc"]),
    ({"not": {"properties": {"a": {"type": "string"}}}}, [{}, {"a": "x"}, {"a": 1}, 5]),
])
def test_not_is_pushed_inwards_exactly(schema, instances):
    n = _same(schema, instances)
    assert n.exact and "not" not in json.dumps(n.schema)


def test_inexpressible_not_is_dropped_and_marked():
    n = _same({"type": "string", "not": {"pattern": "^a"}}, ["a", "b"])
    assert not n.exact and "not" in n.relaxed


def test_widened_operand_is_never_negated():
    # the inner `not pattern` is dropped (widened); negating that would narrow to nothing
    s = {"type": "string", "not": {"not": {"pattern": "^a"}}}
    n = _same(s, ["a", "b", ""])
    assert not n.exact and n.schema is not False


def test_one_of_disjoint_becomes_any_of():
    s = {"oneOf": [{"type": "string"}, {"type": "object", "properties": {"k": {"const": 1}}, "required": ["k"]},
                   {"type": "object", "properties": {"k": {"const": 2}}, "required": ["k"]}]}
    n = _same(s, ["x", {"k": 1}, {"k": 2}, {"k": 3}, 4])
    assert n.exact and "oneOf" not in json.dumps(n.schema)


def test_one_of_overlapping_is_made_exclusive():
    s = {"type": "object", "oneOf": [{"required": ["a"]}, {"required": ["b"]}]}
    n = _same(s, [{}, {"a": 1}, {"b": 1}, {"a": 1, "b": 1}])
    assert n.exact and "oneOf" not in json.dumps(n.schema)


def test_if_then_else():
    s = {"type": "object", "if": {"properties": {"t": {"const": True}}, "required": ["t"]},
         "then": {"required": ["x"]}, "else": {"required": ["y"]}}
    n = _same(s, [{"t": True, "x": 1}, {"t": True}, {"t": False, "y": 1}, {"t": False}, {"y": 1}, {"x": 1}])
    assert "if" not in n.schema


# --- formats and keywords -----------------------------------------------------------------


def test_unknown_formats_are_dropped_exactly_checked_ones_relaxed():
    n = normalize_schema({"type": "string", "format": "my-own-format"})
    assert n.exact and n.schema == {"type": "string"}
    n = normalize_schema({"type": "string", "format": "regex"})
    assert n.schema == {"type": "string"}
    assert n.exact is ("regex" not in jsonschema.FormatChecker().checkers)
    assert normalize({"type": "string", "format": "json-pointer"})["pattern"].startswith("^")
    assert normalize({"type": "string", "format": "date-time"}) == {"type": "string", "format": "date-time"}


def test_annotations_and_inapplicable_keywords_are_dropped():
    s = {"type": "string", "title": "t", "description": "d", "default": "x", "minimum": 3, "x-foo": 1}
    assert normalize(s) == {"type": "string"}


def test_min_properties_rewritten_when_exact():
    s = {"type": "object", "properties": {"a": {}, "b": {}}, "additionalProperties": False, "minProperties": 1}
    n = _same(s, [{}, {"a": 1}, {"b": 1}])
    assert n.exact and "minProperties" not in json.dumps(n.schema)


def test_garbage_raises_only_constraint_error():
    with pytest.raises(ConstraintError):
        normalize([1, 2])
    assert normalize(True) is True


# --- ladder helpers -------------------------------------------------------------------------


def test_relax_and_skeleton_only_widen():
    s = {"type": "object", "properties": {"a": {"type": "string", "pattern": "^x", "maxLength": 2}},
         "patternProperties": {"^p": {"type": "integer"}}, "additionalProperties": False,
         "oneOf": [{"required": ["a"]}, {"required": ["p1"]}], "maxProperties": 1}
    insts = [{}, {"a": "x"}, {"a": "yy"}, {"p1": 1}, {"p1": "s"}, {"a": "x", "p1": 1}, {"q": 1}]
    v0 = _validator(s)
    for loose in (relax(s), skeleton(s)):
        v1 = _norm_validator(loose)
        for x in insts:
            assert v0.is_valid(x) <= v1.is_valid(x), (x, loose)


def test_ladder_compiles_lookaround_looser_and_validation_guards(tokenizer):
    from structgen.constraints.compiler import CompileCache, compiler_for
    from structgen.constraints.spec import json_schema_spec
    from structgen.constraints.validation import validate_output
    from structgen.errors import OutputValidationError

    compiler = compiler_for(tokenizer, cache=CompileCache(maxsize=8))
    spec = json_schema_spec({"type": "object", "properties": {"id": {"type": "string", "pattern": "^(?!x)[a-z]+$"}},
                             "required": ["id"], "additionalProperties": False})
    compiled = compiler.compile(spec)
    assert compiled.exact is False
    assert any("look-around" in w for w in compiled.warnings)
    m = compiled.matcher()
    assert m.consume_many(tokenizer.encode('{"id":"xyz"}', add_special_tokens=False)) and m.is_accepting()
    with pytest.raises(OutputValidationError) as info:  # what the user sees instead of the value
        validate_output(spec, '{"id":"xyz"}')
    assert info.value.errors and "$.id" in info.value.errors[0]
    assert validate_output(spec, '{"id":"abc"}') == {"id": "abc"}


def test_plain_schema_compiles_exactly_as_given(tokenizer):
    from structgen.constraints.compiler import CompileCache, compiler_for
    from structgen.constraints.spec import json_schema_spec

    compiler = compiler_for(tokenizer, cache=CompileCache(maxsize=8))
    schema = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}
    compiled = compiler.compile(json_schema_spec(schema))
    assert compiled.exact and compiled.warnings == ()
    m = compiled.matcher()  # llguidance emits properties in the order the schema lists them
    assert m.consume_many(tokenizer.encode('{"b":1,"a":"x"}', add_special_tokens=False)) and m.is_accepting()


def test_one_of_needs_no_coercion_after_normalisation(tokenizer):
    from structgen.constraints.compiler import CompileCache, compiler_for
    from structgen.constraints.spec import json_schema_spec

    compiler = compiler_for(tokenizer, cache=CompileCache(maxsize=8))
    schema = {"type": "object", "properties": {"kind": {"enum": ["a", "b"]}, "x": {"type": "integer"}},
              "oneOf": [{"properties": {"kind": {"const": "a"}}, "required": ["kind", "x"]},
                        {"properties": {"kind": {"const": "b"}}, "required": ["kind"]}]}
    compiled = compiler.compile(json_schema_spec(schema))
    assert compiled.exact


_I = {"type": "integer"}
_SHARED = {"properties": {"s1": _I, "s2": _I}}

# llguidance generates an object's properties in the order it first meets them, walking
# the schema's keys in order with allOf / oneOf / anyOf / $ref in place; normalising must
# keep that order (MaskBench Github_medium o55595, o60846, o85188, o90951)
_ORDER_CASES = [
    # allOf (a shared $ref) before the object's own properties
    ({"$schema": "http://json-schema.org/draft-04/schema#", "definitions": {"shared": _SHARED},
      "allOf": [{"$ref": "#/definitions/shared"}], "properties": {"z": _I}, "required": ["z", "s1"]},
     [{"s1": 1, "s2": 2, "z": 3}, {"s1": 1, "z": 3}]),
    # a one-branch oneOf before the properties
    ({"definitions": {"node": {"properties": {"a": _I, "b": _I}, "required": ["a"]}},
      "type": "object", "oneOf": [{"$ref": "#/definitions/node"}], "properties": {"z": _I}, "required": ["z"]},
     [{"a": 1, "b": 2, "z": 3}, {"a": 1, "z": 3}]),
    # a disjoint oneOf before the properties (rewritten to anyOf in place)
    ({"definitions": {"l": {"properties": {"cfg": {"enum": ["l"]}}, "required": ["cfg"]},
                      "r": {"properties": {"cfg": {"enum": ["r"]}}, "required": ["cfg"]}},
      "type": "object", "oneOf": [{"$ref": "#/definitions/l"}, {"$ref": "#/definitions/r"}],
      "required": ["content"], "properties": {"content": _I}},
     [{"cfg": "l", "content": 1}, {"cfg": "r", "content": 2}]),
    # allOf: object, anyOf of objects, object -- the anyOf's properties stay in the middle
    ({"allOf": [{"type": "object", "properties": {"m": _I, "b": _I}, "required": ["m"]},
                {"anyOf": [{"properties": {"devs": _I}}, {"properties": {"dev": _I}}]},
                {"properties": {"p": _I, "e": _I}}]},
     [{"m": 1, "b": 2, "dev": 3, "p": 4, "e": 5}, {"m": 1, "devs": 3, "e": 5}]),
    # a 2019-09+ $ref before its siblings
    ({"$defs": {"A": {"properties": {"a": _I}}}, "$ref": "#/$defs/A", "properties": {"z": _I},
      "required": ["a", "z"]},
     [{"a": 1, "z": 2}]),
]


@pytest.mark.parametrize("schema,instances", _ORDER_CASES)
def test_normalisation_keeps_the_engines_property_order(tokenizer, schema, instances):
    import llguidance

    from structgen.constraints.compiler import CompileCache, compiler_for
    from structgen.constraints.spec import json_schema_spec

    compiler = compiler_for(tokenizer, cache=CompileCache(maxsize=8))
    compiled = compiler.compile(json_schema_spec(schema))
    raw_tok = compiler.ladder.llguidance_tokenizer
    raw = llguidance.LLMatcher(raw_tok, llguidance.LLMatcher.grammar_from_json_schema(
        schema, overrides={"whitespace_flexible": False}), log_level=0)
    assert not raw.is_error()
    v = _validator(schema)
    for x in instances:
        assert v.is_valid(x)
        ids = tokenizer.encode(json.dumps(x, separators=(",", ":")), add_special_tokens=False)
        r = raw.deep_copy()
        assert all(r.consume_token(t) for t in ids) and r.is_accepting(), x  # the engine's own order
        m = compiled.matcher()
        assert m.consume_many(ids) and m.is_accepting(), (x, normalize(schema))
    _same(schema, instances)


def test_unknown_keywords_keep_a_schema_plain():
    from structgen.constraints.schema.metacheck import scan_schema

    # keys no draft and not the engine give a meaning: both ignore them
    assert scan_schema({"type": "object", "properties": {"a": {"type": "string", "x-k8s": {"not": {}},
                                                                "readonly": True, "_format": "x"}}}, 2020).plain
    # draft-04's base URI keyword (unknown later) moves only where $refs resolve: plain without $refs
    assert scan_schema({"type": "string", "id": "x"}, 6).plain
    assert scan_schema({"type": "string", "id": "x"}, 4).plain
    with_ref = {"id": "x", "definitions": {"a": {"type": "string"}}, "$ref": "#/definitions/a"}
    assert scan_schema(with_ref, 6).plain is False
    assert scan_schema({"properties": {"a": {"id": "y", "type": "string"}, "b": {"$ref": "#/properties/a"}}},
                       2020).plain is False
    for meaningful in ({"not": {}}, {"$ref": "other.json#/a"}, {"$ref": "#/definitions/a~1b"},
                       {"x-guidance": {"lenient": True}}, {"oneOf": [{}]},
                       {"uniqueItems": True}, {"dependencies": {"a": ["b"]}}, {"format": "int32"}):
        assert not scan_schema({"type": "object", **meaningful}, 2020).plain, meaningful
    assert not scan_schema({"type": "array", "prefixItems": [{}]}, 7).plain  # ignored by draft-07 only
    # a local JSON-pointer $ref: the engine resolves it as the validator does; before
    # 2019-09 only where its siblings mean nothing (the validator ignores them)
    defs = {"definitions": {"a": {"type": "string"}}}
    assert scan_schema({**defs, "properties": {"x": {"$ref": "#/definitions/a", "description": "d"}}}, 7).plain
    assert not scan_schema({**defs, "properties": {"x": {"$ref": "#/definitions/a", "maxLength": 3}}}, 7).plain
    assert scan_schema({**defs, "properties": {"x": {"$ref": "#/definitions/a", "maxLength": 3}}}, 2020).plain
    assert not scan_schema({**defs, "properties": {"x": {"$ref": "#/definitions/a"},
                                                   "y": {"$id": "http://e/y", "type": "string"}}}, 2020).plain


# --- the fast meta-check agrees with jsonschema on what it rejects -------------------------------


@pytest.mark.parametrize("schema", [
    {"type": "nope"}, {"required": "n"}, {"minimum": "x"}, {"properties": {"a": {"minLength": -1}}},
    {"anyOf": []}, {"multipleOf": 0}, {"items": 3}, {"enum": 3}, {"pattern": "("},
])
def test_meta_check_rejects_what_jsonschema_rejects(schema):
    with pytest.raises(jsonschema.exceptions.SchemaError):
        jsonschema.Draft202012Validator.check_schema(schema)
    assert meta_errors(schema, 2020) is not None


# --- hypothesis: random schemas ----------------------------------------------------------------

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([0.5, 2.0, -1.5]),
                     st.sampled_from(["", "a", "ab", "x1", "abc", "2020-01-01", "a@b.c"]))
_json = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["a", "b", "c", "p1"]), inner, max_size=3)),
    max_leaves=8)
_types = st.sampled_from(["string", "integer", "number", "object", "array", "boolean", "null"])


def _schemas() -> st.SearchStrategy:
    leaf = st.one_of(
        st.booleans(),
        st.fixed_dictionaries({"type": st.one_of(_types, st.lists(_types, min_size=1, max_size=3, unique=True))}),
        st.fixed_dictionaries({"enum": st.lists(_scalars, min_size=1, max_size=3)}),
        st.fixed_dictionaries({"const": _scalars}),
        st.fixed_dictionaries({"minimum": st.integers(-2, 2)}),
        st.fixed_dictionaries({"exclusiveMaximum": st.integers(-2, 2)}),
        st.fixed_dictionaries({"minLength": st.integers(0, 3)}),
        st.fixed_dictionaries({"maxLength": st.integers(0, 3)}),
        st.fixed_dictionaries({"pattern": st.sampled_from(["^a", "b$", "[0-9]"])}),
        st.fixed_dictionaries({"format": st.sampled_from(["date", "email", "regex", "uri", "weird"])}),
        st.fixed_dictionaries({"required": st.lists(st.sampled_from(["a", "b", "c"]), max_size=2, unique=True)}),
        st.fixed_dictionaries({"minProperties": st.integers(0, 2)}),
        st.fixed_dictionaries({"maxItems": st.integers(0, 2)}),
        st.fixed_dictionaries({"uniqueItems": st.booleans()}),
        st.fixed_dictionaries({"multipleOf": st.sampled_from([1, 2, 0.5])}),
        st.fixed_dictionaries({"$ref": st.sampled_from(["#/definitions/d", "#", "#/$defs/e"])}),
        st.fixed_dictionaries({"dependencies": st.dictionaries(
            st.sampled_from(["a", "b"]), st.lists(st.sampled_from(["b", "c"]), max_size=2, unique=True), max_size=2)}),
    )

    def extend(inner: st.SearchStrategy) -> st.SearchStrategy:
        return st.one_of(
            st.fixed_dictionaries({"allOf": st.lists(inner, min_size=1, max_size=3)}),
            st.fixed_dictionaries({"anyOf": st.lists(inner, min_size=1, max_size=3)}),
            st.fixed_dictionaries({"oneOf": st.lists(inner, min_size=1, max_size=3)}),
            st.fixed_dictionaries({"not": inner}),
            st.fixed_dictionaries({"if": inner, "then": inner}, optional={"else": inner}),
            st.fixed_dictionaries({"properties": st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3)},
                                  optional={"additionalProperties": st.one_of(st.booleans(), inner),
                                            "patternProperties": st.dictionaries(st.just("^p"), inner, max_size=1),
                                            "required": st.lists(st.sampled_from(["a", "b"]), max_size=2, unique=True),
                                            "type": st.just("object")}),
            st.fixed_dictionaries({"items": st.one_of(inner, st.lists(inner, min_size=1, max_size=2))},
                                  optional={"additionalItems": inner, "type": st.just("array")}),
            st.fixed_dictionaries({"contains": inner}),
            st.tuples(inner, inner).map(lambda ab: {**ab[0], **ab[1]} if all(isinstance(x, dict) for x in ab)
                                        else ab[0]),
        )

    body = st.recursive(leaf, extend, max_leaves=10)
    drafts = st.sampled_from([None, "http://json-schema.org/draft-04/schema#",
                              "http://json-schema.org/draft-07/schema#",
                              "https://json-schema.org/draft/2020-12/schema"])

    def assemble(parts):
        root, d, e, draft = parts
        if not isinstance(root, dict):
            root = {"allOf": [root]}
        root = dict(root, definitions={"d": d}, **{"$defs": {"e": e}})
        if draft:
            root["$schema"] = draft
        return root

    return st.tuples(body, body, body, drafts).map(assemble)


_FUZZ = settings(max_examples=250, deadline=2000, suppress_health_check=list(HealthCheck))


@_FUZZ
@given(_schemas())
def test_fuzz_normaliser_only_typed_errors(schema):
    try:
        n = normalize_schema(schema)
    except ConstraintError:
        return
    json.dumps(n.schema)  # JSON data, no cycles


@_FUZZ
@given(_schemas(), st.lists(_json, min_size=1, max_size=8))
def test_fuzz_normalisation_never_narrows(schema, instances):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.exceptions.SchemaError:
        assume(False)
    try:
        n = normalize_schema(schema)
    except ConstraintError:
        return
    v0 = cls(schema, format_checker=cls.FORMAT_CHECKER)
    v1 = _norm_validator(n.schema)
    for x in instances:
        try:  # the reference checker itself: jsonschema's draft-07 `items: false` raises TypeError
            ok0 = v0.is_valid(x)
        except TypeError:
            continue
        except RecursionError:
            continue
        except BaseException as exc:
            if type(exc).__name__ != "PanicException":
                raise
            continue
        try:  # a schema that refers to itself without consuming the instance never ends
            ok1 = v1.is_valid(x)
        except RecursionError:
            continue
        except BaseException as exc:  # the same recursion, hit inside referencing's
            if type(exc).__name__ != "PanicException":  # Rust __eq__: a pyo3 panic, not a RecursionError
                raise
            continue
        assert ok0 <= ok1, ("narrowed", schema, n.schema, x)
        if n.exact:
            assert ok0 == ok1, ("claimed exact", schema, n.schema, x)


@_FUZZ
@given(_schemas())
def test_fuzz_meta_check_never_rejects_a_good_schema(schema):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
        good = True
    except jsonschema.exceptions.SchemaError:
        good = False
    draft = {jsonschema.Draft4Validator: 4, jsonschema.Draft7Validator: 7}.get(cls, 2020)
    if good:
        assert meta_errors(schema, draft) is None, schema


# --- memory: a bounded compile cache ----------------------------------------------------------------


def test_thousand_distinct_schemas_keep_the_cache_bounded(tokenizer):
    from structgen.constraints.compiler import CompileCache, compiler_for
    from structgen.constraints.spec import json_schema_spec

    cache = CompileCache(maxsize=64)
    compiler = compiler_for(tokenizer, cache=cache)

    def rss_mb() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    for i in range(200):  # warm up allocators
        compiler.compile(json_schema_spec({"type": "object", "properties": {f"w{i}": {"type": "integer"}}}))
    before = rss_mb()
    for i in range(1000):
        schema = {"type": "object", "properties": {f"k{i}": {"type": "string", "maxLength": i % 50 + 1},
                                                   "n": {"type": "integer", "minimum": i}},
                  "required": [f"k{i}"]}
        compiled = compiler.compile(json_schema_spec(schema))
        assert compiled.exact
    stats = cache.stats()
    assert stats.size == 64 and stats.evictions == 1200 - 64
    assert rss_mb() - before < 150, f"peak RSS grew by {rss_mb() - before:.0f} MiB"
