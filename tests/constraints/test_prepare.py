"""prepare_schema's shortcuts keep its answers: the spec's value checked in place of
parsing its text again, ``id`` without ``$ref`` s plain, malformed ``format`` values."""

from __future__ import annotations

import json

import pytest

from structgen.constraints.compiler import CompileCache, compiler_for
from structgen.constraints.schema.metacheck import scan_schema
from structgen.constraints.schema.prepare import prepare_schema
from structgen.constraints.spec import json_schema_spec
from structgen.errors import ConstraintError


def test_a_format_that_is_not_a_string_is_a_meta_schema_error():
    scan = scan_schema({"type": "string", "format": {"oneOf": [{}]}}, 2020)
    assert scan.problem is not None and "not of type 'string'" in scan.problem[0]
    with pytest.raises(ConstraintError, match="malformed JSON schema"):
        json_schema_spec({"type": "string", "format": {"oneOf": [{}]}})


def test_a_value_json_writes_otherwise_is_judged_by_its_text():
    # a tuple is a JSON array, a non-string key a string key: the text decides, as before
    spec = json_schema_spec({"type": "object", "required": ("a",), "properties": {"a": {"type": "string"}}},
                            strict=False)
    assert json.loads(spec.schema)["required"] == ["a"]
    assert prepare_schema(spec.schema).plain
    with pytest.raises(ConstraintError, match="admits no value"):
        json_schema_spec({"$defs": {1: {"$ref": "#/$defs/1"}}, "$ref": "#/$defs/1"})


def test_the_prepared_schema_is_the_texts_not_the_callers():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    spec = json_schema_spec(schema, strict=False)
    schema["properties"]["a"]["type"] = "string"  # the caller changes its dict afterwards
    prepared = prepare_schema(spec.schema)
    assert prepared.schema == {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert prepared.schema is not schema


def test_id_without_refs_compiles_as_given(tokenizer):
    compiler = compiler_for(tokenizer, cache=CompileCache(4))
    schema = {"$schema": "http://json-schema.org/draft-04/schema#", "id": "http://example.com/s",
              "type": "object", "properties": {"id": {"id": "#x", "type": "integer"}}, "required": ["id"]}
    assert prepare_schema(json.dumps(schema)).plain
    compiled = compiler.compile(json_schema_spec(schema, strict=False))
    assert compiled.exact and compiled.rung == "exact"
    m = compiled.matcher()
    assert m.consume_many(tokenizer.encode('{"id":12}', add_special_tokens=False)) and m.is_accepting()
    m = compiled.matcher()
    assert not (m.consume_many(tokenizer.encode('{"id":"x"}', add_special_tokens=False)) and m.is_accepting())
