"""Closed JSON schemas by default, and schemas checked when the ``gen`` is built (issue 12).

A pydantic model or a schema whose objects declare ``properties`` and say nothing about
other keys is generated -- and validated -- as closed (``additionalProperties: false``),
unless the object is merged with another schema or the caller passes ``strict=False``.
"""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel, ConfigDict

import structgen as sg
from structgen.constraints.spec import close_schema, json_schema_spec
from structgen.constraints.validation import validate_output
from structgen.errors import ConstraintError, OutputValidationError


class City(BaseModel):
    name: str


class Trip(BaseModel):
    origin: City
    stops: list[City]
    note: str | None = None


class Loose(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str


def test_pydantic_model_is_closed_at_every_level():
    schema = json_schema_spec(Trip).schema_dict
    assert schema["additionalProperties"] is False
    assert schema["$defs"]["City"]["additionalProperties"] is False
    with pytest.raises(OutputValidationError) as info:
        validate_output(json_schema_spec(City), '{"name":"Paris","country":"France"}')
    assert "country" in str(info.value)
    with pytest.raises(OutputValidationError):
        validate_output(json_schema_spec(Trip), '{"origin":{"name":"A","x":1},"stops":[]}')
    trip = validate_output(json_schema_spec(Trip), '{"origin":{"name":"A"},"stops":[{"name":"B"}]}')
    assert trip == Trip(origin=City(name="A"), stops=[City(name="B")])


def test_strict_false_keeps_the_open_default():
    spec = json_schema_spec(City, strict=False)
    assert "additionalProperties" not in spec.schema_dict
    assert validate_output(spec, '{"name":"Paris","country":"France"}') == City(name="Paris")
    plain = json_schema_spec({"type": "object", "properties": {"a": {"type": "integer"}}}, strict=False)
    assert validate_output(plain, '{"a":1,"b":2}') == {"a": 1, "b": 2}


def test_gen_closes_by_default_and_takes_strict():
    closed = sg.gen("c", json_schema=City)
    opened = sg.gen("c", json_schema=City, strict=False)
    assert json.loads(closed.constraint.schema)["additionalProperties"] is False
    assert "additionalProperties" not in json.loads(opened.constraint.schema)


def test_what_the_schema_says_about_other_keys_is_kept():
    assert "additionalProperties" not in json_schema_spec(Loose).schema_dict or \
        json_schema_spec(Loose).schema_dict["additionalProperties"] is True
    for extra in ({"additionalProperties": {"type": "integer"}}, {"patternProperties": {"^x": {}}},
                  {"unevaluatedProperties": False}):
        schema = {"type": "object", "properties": {"a": {}}, **extra}
        assert json_schema_spec(schema).schema_dict == schema


@pytest.mark.parametrize("schema,instance", [
    # allOf parts each declare some of the keys: closing a part would reject the others'
    ({"allOf": [{"properties": {"a": {"type": "integer"}}}, {"properties": {"b": {"type": "integer"}}}]},
     {"a": 1, "b": 2}),
    # a $ref used beside properties (2019-09+ merges them)
    ({"$defs": {"A": {"properties": {"a": {}}}}, "$ref": "#/$defs/A", "properties": {"z": {}}}, {"a": 1, "z": 2}),
    # oneOf branches under an object with its own properties
    ({"$defs": {"l": {"properties": {"cfg": {"const": "l"}}, "required": ["cfg"]}},
      "type": "object", "oneOf": [{"$ref": "#/$defs/l"}], "properties": {"content": {}}},
     {"cfg": "l", "content": 1}),
    # if / then / else read the same object
    ({"properties": {"kind": {}}, "if": {"properties": {"kind": {"const": "a"}}},
      "then": {"properties": {"x": {}}}}, {"kind": "a", "x": 1}),
])
def test_merged_objects_stay_open(schema, instance):
    spec = json_schema_spec(schema)
    assert validate_output(spec, json.dumps(instance)) == instance


def test_anyof_branches_alone_are_closed():
    schema = {"anyOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]},
                        {"properties": {"b": {"type": "string"}}, "required": ["b"]}]}
    closed = close_schema(schema)
    assert all(b["additionalProperties"] is False for b in closed["anyOf"])
    assert schema["anyOf"][0].get("additionalProperties") is None  # the input is not changed
    with pytest.raises(OutputValidationError):
        validate_output(json_schema_spec(schema), '{"a":1,"c":2}')


def test_not_subschema_is_never_closed():
    schema = {"type": "object", "properties": {"a": {}}, "not": {"properties": {"a": {"const": 1}}}}
    closed = close_schema(schema)
    assert "additionalProperties" not in closed["not"]  # closing inside `not` would widen it


def test_invalid_schema_fails_when_the_gen_is_built_not_after_loading():
    with pytest.raises(ConstraintError, match="malformed JSON schema"):
        sg.gen("x", json_schema={"type": "object", "properties": {"a": {"type": "strng"}}})
    with pytest.raises(ConstraintError, match="malformed JSON schema"):
        sg.gen("x", json_schema='{"type": "array", "minItems": -1}')
    with pytest.raises(ConstraintError, match="never fetched"):
        sg.gen("x", json_schema={"$ref": "https://example.com/schema.json"})


def test_closed_schema_masks_out_a_second_key(tokenizer):
    """The real engine: after ``{"name":"Paris"`` the only way on is ``}`` (no ``,``)."""
    from structgen.constraints.compiler import CompileCache, compiler_for

    compiler = compiler_for(tokenizer, cache=CompileCache(maxsize=8))

    def allows_comma(spec) -> bool:
        m = compiler.compile(spec).matcher()
        assert m.consume_many(tokenizer.encode('{"name":"Paris"', add_special_tokens=False))
        return m.validate_tokens(tokenizer.encode(',"country":"France"}', add_special_tokens=False)) > 0

    assert not allows_comma(json_schema_spec(City))
    assert allows_comma(json_schema_spec(City, strict=False))


@pytest.mark.model
def test_pydantic_model_generates_only_declared_keys(embedded_backend):
    @sg.program
    def city(s):
        s += sg.user("Describe Paris as a JSON object with its name, country, population and landmarks.")
        s += sg.assistant(sg.gen("city", json_schema=City, max_tokens=48))

    state = city.run(backend=embedded_backend)
    assert isinstance(state.value("city"), City)
    assert set(json.loads(state["city"])) == {"name"}
