"""Final validation and constraint building under adversarial input (issue 13 items 1, 5, 6, 11).

Model output is untrusted: validation must take linear time (no backtracking regex), parse
JSON strictly, and fail with typed errors. Bad constraints fail where the ``gen`` is built,
as :class:`ConstraintError` naming the input. The checks that used to hang run in a
subprocess under a deadline, so a regression fails instead of freezing the test run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import structgen as sg
from structgen.backends.fake import FakeBackend
from structgen.constraints.spec import JsonSchemaSpec, RegexSpec, json_schema_spec, regex_spec
from structgen.constraints.validation import validate_output
from structgen.errors import ConstraintError, OutputValidationError

ROOT = Path(__file__).resolve().parents[2]
#: a hang guard, not a timing assertion: the checks below finish in well under a second
DEADLINE_S = 120


def run_under_deadline(code: str) -> str:
    """Run ``code`` in a fresh interpreter; fail (not hang) if it outlives the deadline."""
    try:
        proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, check=False,
                              text=True, timeout=DEADLINE_S, env={**os.environ, "PYTHONPATH": str(ROOT)})
    except subprocess.TimeoutExpired:
        pytest.fail(f"did not finish within {DEADLINE_S} s (catastrophic backtracking?)")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


# --- item 1: linear-time regex validation --------------------------------------------------


def test_regex_validation_of_a_catastrophic_pattern_returns():
    out = run_under_deadline("""
        from structgen.constraints.spec import regex_spec
        from structgen.constraints.validation import validate_output
        from structgen.errors import OutputValidationError
        spec = regex_spec("(a+)+b")
        for n in (26, 64, 10_000):
            try:
                validate_output(spec, "a" * n, truncated=True)
            except OutputValidationError as exc:
                assert exc.truncated and exc.raw == "a" * n
            else:
                raise AssertionError("a run of a's without b matched (a+)+b")
        assert validate_output(spec, "a" * 10_000 + "b") == "a" * 10_000 + "b"
        print("ok")
    """)
    assert out.strip() == "ok"


@pytest.mark.parametrize("schema,text", [
    ({"type": "string", "pattern": "^(a+)+b$"}, json.dumps("a" * 64)),
    ({"type": "object", "patternProperties": {"^(a+)+b$": {"type": "integer"}}}, json.dumps({"a" * 64 + "c": "x"})),
    ({"type": "object", "patternProperties": {"^(a+)+b$": {"type": "integer"}}, "additionalProperties": False},
     json.dumps({"a" * 64: 1})),
    ({"type": "object", "patternProperties": {"^(a+)+b$": {"type": "integer"}}, "unevaluatedProperties": False},
     json.dumps({"a" * 64: 1})),
    ({"type": "object", "propertyNames": {"pattern": "^(a+)+b$"}}, json.dumps({"a" * 64: 1})),
], ids=["pattern", "patternProperties", "additionalProperties", "unevaluatedProperties", "propertyNames"])
def test_json_schema_pattern_checks_are_linear(schema, text):
    code = f"""
        import json
        from structgen.constraints.spec import json_schema_spec
        from structgen.constraints.validation import validate_output
        from structgen.errors import OutputValidationError
        spec = json_schema_spec(json.loads({json.dumps(json.dumps(schema))}), strict=False)
        try:
            validate_output(spec, {text!r})
            print("accepted")
        except OutputValidationError as exc:
            print("rejected", exc.errors)
    """
    out = run_under_deadline(code)
    expected = "accepted" if "patternProperties" in schema and "additionalProperties" not in schema \
        and "unevaluatedProperties" not in schema else "rejected"
    assert out.startswith(expected), out


def test_pattern_matching_follows_json_schema_search_semantics():
    spec = json_schema_spec({"type": "string", "pattern": "b+"})
    assert validate_output(spec, '"abbbc"') == "abbbc"  # unanchored: found inside
    with pytest.raises(OutputValidationError, match="does not match"):
        validate_output(spec, '"ac"')
    # \d in JSON Schema (ECMA-262) is ASCII: an Arabic-Indic digit is not one
    digits = json_schema_spec({"type": "string", "pattern": "^\\d+$"})
    assert validate_output(digits, '"123"') == "123"
    with pytest.raises(OutputValidationError):
        validate_output(digits, json.dumps("\u0663"))


def test_lookaround_pattern_is_still_checked_with_a_bound():
    spec = json_schema_spec({"type": "string", "pattern": "^(?!foo)[a-z]+$"})
    assert validate_output(spec, '"bar"') == "bar"
    with pytest.raises(OutputValidationError):
        validate_output(spec, '"foobar"')


def test_regex_validation_is_what_the_mask_enforces():
    # Python's \w is Unicode (letters and digits of any script); the engine's translation agrees
    spec = regex_spec(r"\w+")
    assert validate_output(spec, "héllo日本") == "héllo日本"
    with pytest.raises(OutputValidationError):
        validate_output(spec, "a-b")
    with pytest.raises(OutputValidationError):
        validate_output(regex_spec(r"\d{3}"), "12")  # full match, not a prefix


@pytest.mark.model
def test_end_to_end_catastrophic_regex_returns_on_the_embedded_model():
    """``gen(regex="(a+)+b", max_tokens=40)`` after a prompt of a's: it used to never return."""
    pytest.importorskip("torch")
    out = run_under_deadline("""
        import structgen as sg
        from structgen.backends.embedded import EmbeddedBackend
        from structgen.errors import OutputValidationError

        @sg.program
        def aaa(s):
            s += "a" * 60
            s += sg.gen("x", regex="(a+)+b", max_tokens=40)

        backend = EmbeddedBackend()
        try:
            state = aaa.run(backend=backend)
            import re
            assert re.fullmatch("a+b", state["x"]), state["x"]
            print("valid")
        except OutputValidationError as exc:
            assert exc.truncated and set(exc.raw) <= set("ab"), exc
            print("rejected")
        finally:
            backend.close()
    """)
    assert out.strip().splitlines()[-1] in ("valid", "rejected")


# --- item 5: bad input at the boundary is a ConstraintError naming it --------------------------


def _deep_schema(levels: int) -> dict:
    s: dict = {"type": "string"}
    for _ in range(levels):
        s = {"type": "object", "properties": {"a": s}}
    return s


@pytest.mark.parametrize("kwargs,needle", [
    ({"regex": ".{4294967295}"}, ".{4294967295}"),
    ({"regex": "(" * 500 + "a" + ")" * 500}, "((((("),
    ({"regex": "(" * 5000 + "a" + ")" * 5000}, "((((("),
    ({"regex": "(?<=a)b"}, "(?<=a)b"),
    ({"json_schema": _deep_schema(600)}, "properties"),
    ({"json_schema": {"type": "object", "properties": {"a": {"enum": {1, 2}}}}}, "enum"),
    ({"json_schema": {"type": "number", "maximum": float("nan")}}, "maximum"),
    ({"json_schema": {"type": "strin"}}, "strin"),
    ({"json_schema": {"type": "object", "properties": {"a": {"minimum": "x"}}}}, "minimum"),
    ({"json_schema": "[" * 5000 + "]" * 5000}, "nested"),
], ids=["overflow", "groups500", "groups5000", "lookbehind", "schema600", "set", "nan", "bad-type",
        "bad-keyword", "deep-text"])
def test_bad_constraints_raise_constraint_error_when_the_gen_is_built(kwargs, needle):
    with pytest.raises(ConstraintError) as info:
        sg.gen("x", **kwargs)
    assert needle in str(info.value)


# --- item 6: deep output and self-recursive schemas are typed, with the raw text ----------------


def test_deeply_nested_output_is_an_output_validation_error_with_raw_text():
    deep = "[" * 5000 + "]" * 5000
    with pytest.raises(OutputValidationError) as info:
        validate_output(json_schema_spec({}), deep)
    assert info.value.raw == deep and "nested deeper" in str(info.value)
    with pytest.raises(OutputValidationError):  # past the depth limit even where Python could parse it
        validate_output(json_schema_spec({}), "[" * 100 + "]" * 100)
    assert validate_output(json_schema_spec({}), "[" * 60 + "]" * 60) is not None


def test_deeply_nested_output_is_retried_not_blamed_on_the_program():
    deep = "[" * 5000 + "]" * 5000

    @sg.program
    def nested(s):
        s += sg.gen("v", json_schema={"type": "array"}, retries=1)

    state = nested.run(backend=FakeBackend([deep, "[[1]]"]))
    assert state.value("v") == [[1]]
    with pytest.raises(OutputValidationError) as info:
        nested.run(backend=FakeBackend([deep, deep]))
    assert info.value.raw == deep


@pytest.mark.parametrize("schema", [
    {"$schema": "https://json-schema.org/draft/2019-09/schema", "$recursiveRef": "#"},
    {"$schema": "https://json-schema.org/draft/2019-09/schema", "$recursiveAnchor": True, "$recursiveRef": "#"},
    {"$ref": "#"},
    {"$dynamicAnchor": "a", "$dynamicRef": "#a"},
], ids=["recursiveRef", "recursiveAnchor", "ref-root", "dynamicRef"])
def test_schema_that_recurses_without_end_is_a_constraint_error(schema):
    with pytest.raises(ConstraintError, match="refers to itself"):
        validate_output(JsonSchemaSpec(json.dumps(schema)), "1")


def test_recursive_schema_still_validates_nested_values():
    tree = {"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}}}, "$ref": "#/$defs/n"}
    value = "[" * 60 + "]" * 60
    assert validate_output(json_schema_spec(tree), value) is not None


# --- item 11: what json.loads lets through ----------------------------------------------------


def test_duplicate_keys_are_rejected_even_when_the_last_is_valid():
    spec = json_schema_spec({"type": "object", "properties": {"a": {"type": "integer"}}})
    with pytest.raises(OutputValidationError, match="duplicate key 'a'") as info:
        validate_output(spec, '{"a":"x","a":1}')
    assert info.value.raw == '{"a":"x","a":1}'
    with pytest.raises(OutputValidationError, match="duplicate key"):  # nested too
        validate_output(json_schema_spec({}), '[{"b":{"c":1,"c":1}}]')


@pytest.mark.parametrize("text", ["1e400", "-1e400", '{"x":[1.5E309]}'])
def test_numbers_beyond_a_double_are_rejected_not_read_as_infinity(text):
    with pytest.raises(OutputValidationError, match="out of range for a double"):
        validate_output(json_schema_spec({}), text)
    assert validate_output(json_schema_spec({"type": "number"}), "1e300") == 1e300
    assert validate_output(json_schema_spec({"type": "number"}), "1e-400") == 0.0  # underflow is a number


@pytest.mark.parametrize("text", ['"\\ud800"', '"a\\udfff"', '{"\\ud83d":1}', '["ok","\\udc00x"]'])
def test_lone_surrogates_are_rejected(text):
    with pytest.raises(OutputValidationError, match="lone surrogate"):
        validate_output(json_schema_spec({}), text)
    assert validate_output(json_schema_spec({}), '"\\ud83d\\ude00"') == "\U0001F600"  # a pair is fine


def test_nan_bound_is_a_constraint_error_not_no_bound():
    with pytest.raises(ConstraintError, match="JSON cannot express"):
        json_schema_spec({"type": "number", "maximum": float("nan")})
    with pytest.raises(ConstraintError, match="not valid JSON"):  # a spec made without the builder
        validate_output(JsonSchemaSpec('{"type":"number","maximum":NaN}'), "5")


def test_regex_spec_built_directly_is_still_checked_linearly():
    out = run_under_deadline("""
        from structgen.constraints.spec import RegexSpec
        from structgen.constraints.validation import validate_output
        from structgen.errors import OutputValidationError
        try:
            validate_output(RegexSpec("(a|aa)+b"), "a" * 5000)
        except OutputValidationError:
            print("rejected")
    """)
    assert out.strip() == "rejected"
    with pytest.raises(ConstraintError):  # an engine-unsupported pattern cannot be checked
        validate_output(RegexSpec("(a)\\1"), "aa")
