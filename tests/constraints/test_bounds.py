"""structgen.constraints.schema.bounds: bounded schemas accept a subset of the original,
keep its minimums, compile wherever the original does, and their longest text is what
``json_chars`` counts; the engine enforces the bound."""

from __future__ import annotations

import json

import pytest

from structgen.constraints.bitmask import allocate_token_bitmask
from structgen.constraints.compiler import CompileCache, compiler_for
from structgen.constraints.schema import schema_validator
from structgen.constraints.schema.bounds import (
    INTEGER_BOUND,
    NUMBER_CHARS,
    bounded_schema,
    fit_cap,
    items_cap,
    json_chars,
)
from structgen.constraints.spec import json_schema_spec
from structgen.errors import ConstraintError
from tests.constraints.test_maskbench_sample import DATA, _accepted, _names

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
    "kind": {"enum": ["a", "bbbb"]}, "ok": {"type": "boolean"}, "note": {"type": ["string", "null"]}},
    "required": ["name"], "additionalProperties": False}


def _longest(cap: int, sep: tuple[str, str]) -> str:
    n = items_cap(cap)
    value = {"name": "x" * cap, "tags": ["y" * cap] * n, "kind": "bbbb", "ok": False,
             "note": "z" * cap if cap >= 2 else None}  # the longer of its two types
    return json.dumps(value, separators=sep)


@pytest.mark.parametrize("cap", [1, 8, 30, 100])
@pytest.mark.parametrize("sep", [(",", ":"), (", ", ": ")])
def test_json_chars_is_the_longest_text_the_bounded_schema_allows(cap, sep):
    longest = _longest(cap, sep)
    schema_validator(bounded_schema(SCHEMA, cap)).validate(json.loads(longest))
    # one more character anywhere is refused by the bound
    assert not schema_validator(bounded_schema(SCHEMA, cap)).is_valid({**json.loads(longest), "name": "x" * (cap + 1)})
    assert json_chars(SCHEMA, SCHEMA, cap, separators=sep) == len(longest)


@pytest.mark.parametrize("budget", [40, 120, 500, 2000])
def test_fit_cap_is_the_largest_cap_that_fits(budget):
    cap = fit_cap(SCHEMA, budget)
    if len(_longest(1, (",", ":"))) > budget:
        assert cap == 1  # the floor: served best effort
        return
    assert len(_longest(cap, (",", ":"))) <= budget < len(_longest(cap + 1, (",", ":")))


def test_the_schemas_own_bounds_and_minimums_win():
    schema = {"type": "object", "properties": {
        "short": {"type": "string", "maxLength": 3}, "long": {"type": "string", "minLength": 50},
        "many": {"type": "array", "items": {"type": "integer"}, "minItems": 12},
        "pat": {"type": "string", "pattern": "^[a-z]+$"}, "open": {"type": "object", "minProperties": 9}}}
    p = bounded_schema(schema, 10)["properties"]
    assert p["short"]["maxLength"] == 3 and p["long"]["maxLength"] == 50
    assert p["many"]["maxItems"] == 12 and "maxLength" not in p["pat"] and p["open"]["maxProperties"] == 9
    assert "maxLength" not in schema["properties"]["long"]  # a copy


def test_integers_are_bounded_to_their_counted_length_unless_the_schema_says_otherwise():
    schema = {"type": "object", "properties": {
        "n": {"type": "integer"}, "small": {"type": "integer", "minimum": 0, "maximum": 10},
        "opt": {"type": ["integer", "null"]}, "x": {"type": "number"},
        "huge": {"type": "integer", "minimum": 10 ** 12}, "neg": {"type": "integer", "exclusiveMaximum": -10 ** 13}}}
    p = bounded_schema(schema, 10)["properties"]
    assert (p["n"]["minimum"], p["n"]["maximum"]) == (-INTEGER_BOUND, INTEGER_BOUND)
    assert (p["small"]["minimum"], p["small"]["maximum"]) == (0, 10)  # the schema's own, tighter
    assert p["opt"]["maximum"] == INTEGER_BOUND
    assert "maximum" not in p["x"] and "minimum" not in p["x"]  # a fraction's digits cannot be bounded
    assert "maximum" not in p["huge"] and "minimum" not in p["neg"]  # never below what the schema requires
    assert len(json.dumps(-INTEGER_BOUND)) == NUMBER_CHARS == json_chars(schema["properties"]["n"], schema, 10)
    check = schema_validator(bounded_schema(schema, 10))
    assert check.is_valid({"n": INTEGER_BOUND, "opt": -INTEGER_BOUND, "huge": 10 ** 15})
    assert not check.is_valid({"n": INTEGER_BOUND + 1}) and not check.is_valid({"opt": -INTEGER_BOUND - 1})


def test_an_open_objects_values_are_bounded_strings_as_counted():
    schema = {"type": "object", "properties": {"model": {"type": "object"}}, "additionalProperties": False}
    model = bounded_schema(schema, 10)["properties"]["model"]
    assert model["additionalProperties"] == {"type": "string", "maxLength": 10}
    check = schema_validator(bounded_schema(schema, 10))
    assert check.is_valid({"model": {"kind": "x" * 10}})
    assert not check.is_valid({"model": {"kind": "x" * 11}}) and not check.is_valid({"model": {"kind": [1]}})
    longest = {"model": {chr(97 + i) * 10: "v" * 10 for i in range(items_cap(10))}}  # keys counted at cap
    assert json_chars(schema, schema, 10) == len(json.dumps(longest, separators=(",", ":")))
    typed = {"type": "object", "additionalProperties": {"type": "integer"}}
    assert bounded_schema(typed, 10)["additionalProperties"]["maximum"] == INTEGER_BOUND  # its own type, bounded


def test_the_engine_holds_the_bound(tokenizer):
    compiler = compiler_for(tokenizer, cache=CompileCache(maxsize=4))
    mask = allocate_token_bitmask(1, compiler.vocab_size, kind="numpy")
    compiled = compiler.compile(json_schema_spec(bounded_schema(SCHEMA, 12)))
    enc = lambda v: tokenizer.encode(json.dumps(v, separators=(",", ":")), add_special_tokens=False)  # noqa: E731
    assert _accepted(compiled, enc({"name": "x" * 12}), mask, compiler.eos_token_id)
    assert not _accepted(compiled, enc({"name": "x" * 13}), mask, compiler.eos_token_id)
    assert not _accepted(compiled, enc({"name": "a", "tags": ["t"] * (items_cap(12) + 1)}), mask, compiler.eos_token_id)
    digits = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    compiled = compiler.compile(json_schema_spec(bounded_schema(digits, 12)))
    assert _accepted(compiled, enc({"n": INTEGER_BOUND}), mask, compiler.eos_token_id)
    assert _accepted(compiled, enc({"n": -INTEGER_BOUND}), mask, compiler.eos_token_id)
    assert not _accepted(compiled, enc({"n": 10 ** 11}), mask, compiler.eos_token_id)  # a runaway integer stops


def test_on_maskbench_a_bounded_schema_compiles_and_accepts_a_subset(tokenizer):
    if not DATA.is_dir():
        pytest.skip(f"MaskBench data not found at {DATA}")
    compiler = compiler_for(tokenizer, cache=CompileCache(maxsize=8))
    checked = subset = 0
    for name in _names()[::3]:
        data = json.loads((DATA / name).read_text())
        schema = data["schema"]
        try:
            compiler.compile(json_schema_spec(schema, strict=False))
            original = schema_validator(schema)
        except ConstraintError:
            continue
        for cap in (8, 64):
            bounded = bounded_schema(schema, cap)
            compiler.compile(json_schema_spec(bounded, strict=False))  # the bound never breaks compilation
            check = schema_validator(bounded)
            for test in data["tests"]:
                if check.is_valid(test["data"]):
                    subset += 1
                    assert original.is_valid(test["data"]), (name, cap, test["data"])
            checked += 1
    assert checked >= 100 and subset >= 50, (checked, subset)
