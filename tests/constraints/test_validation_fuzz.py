"""Hypothesis fuzzing of the output parser/validator: whatever text a model produces,
validation returns a value or raises OutputValidationError -- never anything else, never
hangs -- and for JSON it accepts exactly what jsonschema accepts."""

from __future__ import annotations

import json

import jsonschema
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from structgen.constraints.spec import ChoiceSpec, json_schema_spec, regex_spec
from structgen.constraints.validation import validate_output
from structgen.errors import OutputValidationError


class Item(BaseModel):
    name: str
    price: float
    tags: list[str] = []


SCHEMA = {"type": "object", "required": ["id", "when"],
          "properties": {"id": {"type": "integer", "minimum": 0},
                         "when": {"type": "string", "format": "date-time"},
                         "kind": {"enum": ["a", "b"]},
                         "items": {"type": "array", "maxItems": 3, "items": {"type": "number"}}},
          "additionalProperties": False}

SPECS = [json_schema_spec(Item), json_schema_spec(SCHEMA), regex_spec(r"\d{3}-[a-z]+"),
         ChoiceSpec(("yes", "no"))]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["id", "when", "kind", "items", "name", "price", "tags", "x"]), inner, max_size=5),
    max_leaves=12)

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(text=st.text(max_size=200), spec=st.sampled_from(SPECS), truncated=st.booleans())
def test_any_text_gives_a_value_or_a_typed_error(text, spec, truncated):
    try:
        validate_output(spec, text, truncated=truncated)
    except OutputValidationError as err:
        assert err.raw == text and err.truncated == truncated and err.errors
        if truncated:
            assert "max_tokens" in str(err)


@FAST
@given(value=json_values)
@example(value={"id": 3, "when": "2026-12-02T11:54:07Z", "kind": "a", "items": [1.5]})  # valid
@example(value={"id": 3, "when": "yesterday"})  # format violation
@example(value={"id": -1, "when": "2026-12-02T11:54:07Z"})  # below minimum
def test_json_validation_agrees_with_jsonschema(value):
    text = json.dumps(value)
    expected = jsonschema.Draft202012Validator(
        SCHEMA, format_checker=jsonschema.FormatChecker()).is_valid(value)
    try:
        got = validate_output(SPECS[1], text)
    except OutputValidationError as err:
        assert not expected, f"valid instance rejected: {err}"
        assert all(e.startswith("$") for e in err.errors)
    else:
        assert expected and got == value


@FAST
@given(value=json_values)
def test_pydantic_results_are_instances_or_typed_errors(value):
    try:
        got = validate_output(SPECS[0], json.dumps(value))
    except OutputValidationError:
        return
    assert isinstance(got, Item)
