"""Final output validation: typed values, precise errors, no network, no eval."""

from __future__ import annotations

import json
import re
import socket
import urllib.request
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field, field_validator

from structgen.constraints.spec import ChoiceSpec, GrammarSpec, JsonSchemaSpec, dtype_spec, json_schema_spec, regex_spec
from structgen.constraints.validation import validate_output
from structgen.errors import ConstraintError, OutputValidationError, StructgenError


class Item(BaseModel):
    name: str
    price: float = Field(ge=0)


class Order(BaseModel):
    id: int
    items: list[Item]
    note: str | None = None


class Shouty(BaseModel):
    word: str

    @field_validator("word")
    @classmethod
    def upper(cls, v: str) -> str:
        if v != v.upper():
            raise ValueError("must be upper case")
        return v


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(urllib.request, "urlopen", refuse)


# --- JSON -------------------------------------------------------------------------------


def test_pydantic_spec_returns_a_typed_instance():
    order = validate_output(json_schema_spec(Order), '{"id":1,"items":[{"name":"tea","price":2.5}]}')
    assert isinstance(order, Order) and isinstance(order.items[0], Item)
    assert order == Order(id=1, items=[Item(name="tea", price=2.5)])


def test_plain_schema_returns_parsed_json():
    spec = json_schema_spec({"type": "array", "items": {"type": "integer"}})
    assert validate_output(spec, "[1,2,3]") == [1, 2, 3]
    assert validate_output(json_schema_spec({"type": "object"}), '{"a": {"b": null}}') == {"a": {"b": None}}


def test_errors_carry_raw_text_and_json_paths():
    raw = '{"id":"x","items":[{"name":"tea","price":1},{"name":5,"price":-1}]}'
    with pytest.raises(OutputValidationError) as info:
        validate_output(json_schema_spec(Order), raw)
    err = info.value
    assert err.raw == raw and err.truncated is False
    assert "$.id: 'x' is not of type 'integer'" in err.errors
    assert "$.items[1].name: 5 is not of type 'string'" in err.errors
    assert "$.items[1].price: -1 is less than the minimum of 0" in err.errors
    assert len(err.errors) == 3
    assert raw in str(err) and "$.items[1].price" in str(err)
    assert isinstance(err, StructgenError)


def test_odd_keys_are_quoted_in_paths():
    spec = json_schema_spec({"type": "object", "properties": {"a b": {"type": "integer"}}})
    with pytest.raises(OutputValidationError) as info:
        validate_output(spec, '{"a b":"x"}')
    assert info.value.errors == ['$["a b"]: \'x\' is not of type \'integer\'']


def test_malformed_json_is_reported_with_position():
    with pytest.raises(OutputValidationError) as info:
        validate_output(json_schema_spec(Order), '{"id":1,"items":[')
    err = info.value
    assert err.errors and err.errors[0].startswith("$: ") and "line 1 column" in err.errors[0]
    assert "not valid JSON" in str(err)


def test_truncated_output_says_max_tokens():
    raw = '{"id":1,"items":[{"name":"te'
    with pytest.raises(OutputValidationError) as info:
        validate_output(json_schema_spec(Order), raw, truncated=True)
    assert info.value.truncated is True
    assert "cut short by max_tokens" in str(info.value)
    with pytest.raises(OutputValidationError, match="cut short by max_tokens"):
        validate_output(regex_spec(r"\d{4}"), "12", truncated=True)


@pytest.mark.parametrize("text", ["NaN", "[Infinity]", '{"a":-Infinity}'])
def test_non_standard_json_constants_are_rejected(text):
    with pytest.raises(OutputValidationError, match="not valid JSON"):
        validate_output(json_schema_spec({}), text)


def test_pydantic_validators_run_after_the_schema():
    assert validate_output(json_schema_spec(Shouty), '{"word":"HI"}') == Shouty(word="HI")
    with pytest.raises(OutputValidationError) as info:
        validate_output(json_schema_spec(Shouty), '{"word":"hi"}')
    assert info.value.errors and info.value.errors[0].startswith("$.word: ")
    assert "upper case" in info.value.errors[0]


def test_format_checking_is_on():
    spec = json_schema_spec({"type": "object", "properties": {"ip": {"type": "string", "format": "ipv4"}}})
    assert validate_output(spec, '{"ip":"10.0.0.1"}') == {"ip": "10.0.0.1"}
    with pytest.raises(OutputValidationError, match=r"\$\.ip: '10\.0\.0' is not a 'ipv4'"):
        validate_output(spec, '{"ip":"10.0.0"}')


def test_local_refs_resolve():
    schema = {"$defs": {"pos": {"type": "integer", "minimum": 0}},
              "type": "array", "items": {"$ref": "#/$defs/pos"}}
    assert validate_output(json_schema_spec(schema), "[0,1]") == [0, 1]
    with pytest.raises(OutputValidationError, match=r"\$\[1\]"):
        validate_output(json_schema_spec(schema), "[0,-1]")


def test_remote_ref_is_never_fetched(no_network):
    with pytest.raises(ConstraintError, match="never fetched"):  # refused where the gen is built
        json_schema_spec({"$ref": "http://example.com/x.json"})
    spec = JsonSchemaSpec('{"$ref":"http://example.com/x.json"}')  # a spec made without the builder
    with pytest.raises(ConstraintError, match="never fetched"):
        validate_output(spec, "1")
    nested = JsonSchemaSpec('{"type":"object","properties":{"a":{"$ref":"https://example.com/a#/b"}}}')
    with pytest.raises(ConstraintError):
        validate_output(nested, '{"a":1}')


@pytest.mark.parametrize("draft,schema,good,bad", [
    ("http://json-schema.org/draft-04/schema#", {"type": "number", "maximum": 5, "exclusiveMaximum": True}, "4", "5"),
    ("http://json-schema.org/draft-07/schema#", {"type": "number", "exclusiveMaximum": 5}, "4", "5"),
    ("https://json-schema.org/draft/2020-12/schema", {"type": "array", "prefixItems": [{"type": "string"}]},
     '["a",1]', "[1]"),
])
def test_schema_drafts_are_honoured(draft, schema, good, bad):
    spec = json_schema_spec({"$schema": draft, **schema})
    validate_output(spec, good)
    with pytest.raises(OutputValidationError):
        validate_output(spec, bad)


def test_malformed_schema_is_a_constraint_error():
    with pytest.raises(ConstraintError, match="malformed JSON schema"):
        validate_output(JsonSchemaSpec('{"type":"nope"}'), "1")


def test_model_output_is_never_evaluated(monkeypatch):
    import builtins

    def forbidden(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("eval/exec called")

    monkeypatch.setattr(builtins, "eval", forbidden)
    monkeypatch.setattr(builtins, "exec", forbidden)
    for spec in (json_schema_spec({}), dtype_spec(int), ChoiceSpec(("a",))):
        with pytest.raises(OutputValidationError):
            validate_output(spec, "__import__('os').system('echo pwned')")


# --- regex, choices, grammar ----------------------------------------------------------


def test_regex_must_match_fully():
    spec = regex_spec(r"\d{4}-\d{2}-\d{2}")
    assert validate_output(spec, "2024-01-31") == "2024-01-31"
    with pytest.raises(OutputValidationError) as info:
        validate_output(spec, "2024-01-31 and more")
    assert info.value.raw == "2024-01-31 and more"
    assert "fully match" in info.value.errors[0]


def test_dtype_regexes():
    assert validate_output(dtype_spec(int), "-12 ") == "-12 "
    assert validate_output(dtype_spec(bool), "True") == "True"
    with pytest.raises(OutputValidationError):
        validate_output(dtype_spec(bool), "true")


def test_choices():
    spec = ChoiceSpec(("red", "green"))
    assert validate_output(spec, "green") == "green"
    with pytest.raises(OutputValidationError) as info:
        validate_output(spec, "gre")
    assert "['red', 'green']" in info.value.errors[0]


def test_grammar_text_passes_through_unless_truncated():
    spec = GrammarSpec('start: "a"+')
    assert validate_output(spec, "aaa") == "aaa"
    with pytest.raises(OutputValidationError, match="cut short"):
        validate_output(spec, "aa", truncated=True)


def test_text_must_be_str():
    with pytest.raises(TypeError):
        validate_output(dtype_spec(int), b"1")  # type: ignore[arg-type]


# --- properties ------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.from_regex(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", fullmatch=True))
def test_property_regex_accepts_every_match(text):
    assert validate_output(regex_spec(r"[0-9]{4}-[0-9]{2}-[0-9]{2}"), text) == text


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=15,
)


@settings(max_examples=80, deadline=None)
@given(json_values)
def test_property_any_json_round_trips_under_the_empty_schema(value):
    text = json.dumps(value)
    assert validate_output(json_schema_spec({}), text) == json.loads(text)


@settings(max_examples=80, deadline=None)
@given(st.builds(Order, id=st.integers(), items=st.lists(st.builds(
    Item, name=st.text(max_size=8), price=st.floats(min_value=0, max_value=1e6))), note=st.none() | st.text()))
def test_property_pydantic_round_trip(order):
    assert validate_output(json_schema_spec(Order), order.model_dump_json()) == order


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=20))
def test_property_errors_always_carry_the_raw_text(text):
    spec = json_schema_spec({"type": "object", "required": ["k"]})
    try:
        validate_output(spec, text)
    except OutputValidationError as err:
        assert err.raw == text and err.errors
        assert all(re.match(r"^\$", e) for e in err.errors)
