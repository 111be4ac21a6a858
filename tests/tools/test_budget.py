"""A tool call fits ``max_tokens`` (structgen.tools.budget): the grammar bounds every argument
that could run away, so a call closes within the budget.

Checked against the real SmolLM2 tokenizer and llguidance's matcher (the bound is in the
grammar), and on the real model with a prompt that asks for a long argument and a small
``max_tokens``: the call closes, parses and validates, and is not cut.
"""

from __future__ import annotations

import pytest

import structgen as sg
from structgen.constraints.compiler import compiler_for
from structgen.tools.budget import MIN_CAP, bounded_schema, call_chars, fit_to_budget
from structgen.tools.formats import INJECTED
from structgen.tools.spec import build_spec


@sg.tool
def note(text: str, tags: list[str]) -> str:
    """Save a note with tags."""
    return text


@sg.tool
def lookup(city: str, country: str = "", units: str = "metric", days: int = 1, detail: bool = False) -> str:
    """Weather for a city."""
    return city


@pytest.fixture(scope="module")
def compiler(tokenizer):
    return compiler_for(tokenizer)


def accepts(compiler, spec, text: str) -> bool:
    m = compiler.compile(spec).matcher()
    ids = m.tokenize_bytes(text.encode())
    return m.validate_tokens(ids) == len(ids)


def test_a_budget_below_the_plan_is_served_best_effort():
    (tool, cap), = fit_to_budget(INJECTED, [note], max_tokens=64)
    assert tool is note and cap == MIN_CAP  # no optional argument to drop: the smallest bound


@pytest.mark.parametrize("max_tokens", [128, 256, 512])
def test_the_longest_call_fits_the_budget_and_the_grammar_holds_the_bound(compiler, max_tokens):
    (tool, cap), = fit_to_budget(INJECTED, [note], max_tokens=max_tokens)
    assert cap >= MIN_CAP and tool is note
    block = len(INJECTED.open) + len(INJECTED.close) + 2
    assert call_chars(INJECTED, note, cap) + block <= max_tokens - 1  # the plan fits, one token to spare
    assert call_chars(INJECTED, note, cap + 1) + block > max_tokens - 1  # and is the largest that does
    spec = build_spec([note], INJECTED, tool_choice="required", max_tokens=max_tokens)
    head = '<tool_call>[{"name": "note", "arguments": {"text": "'
    assert accepts(compiler, spec, head + "a" * cap + '", "tags": []}}]</tool_call>')
    assert not accepts(compiler, spec, head + "a" * (cap + 1))  # one more character: refused
    items = ", ".join(['"t"'] * (max(2, cap // 6) + 1))
    assert not accepts(compiler, spec, head + f'x", "tags": [{items}]')  # one item too many: refused
    assert spec.validate_output(head + "a" * cap + '", "tags": ["t"]}}]</tool_call>').calls[0].name == "note"


def test_no_budget_no_bound(compiler):
    spec = build_spec([note], INJECTED, tool_choice="required")
    head = '<tool_call>[{"name": "note", "arguments": {"text": "'
    assert accepts(compiler, spec, head + "a" * 2000 + '", "tags": []}}]</tool_call>')


def test_a_tight_budget_drops_optional_arguments_last_first(compiler):
    (fitted, cap), = fit_to_budget(INJECTED, [lookup], max_tokens=140)
    kept = list(fitted.parameters["properties"])
    assert kept[0] == "city" and "city" in fitted.parameters["required"]
    assert kept == ["city", "country", "units", "days", "detail"][:len(kept)] and len(kept) < 5
    assert call_chars(INJECTED, fitted, cap) <= 140 - 1 - len(INJECTED.open) - len(INJECTED.close) - 2
    spec = build_spec([lookup], INJECTED, tool_choice="required", max_tokens=140)
    dropped = next(k for k in ("country", "units", "days", "detail") if k not in kept)
    head = '<tool_call>[{"name": "lookup", "arguments": {"city": "Oslo", '
    assert not accepts(compiler, spec, head + f'"{dropped}"')
    assert spec.validate_output('<tool_call>[{"name": "lookup", "arguments": {"city": "Oslo"}}]</tool_call>').calls


def test_bounded_schema_keeps_enums_and_tighter_bounds():
    schema = {"type": "object", "properties": {
        "a": {"type": "string", "maxLength": 3}, "b": {"enum": ["xx", "yyyyyyyyyyyy"]},
        "c": {"type": "array", "items": {"type": "string"}, "minItems": 9},
        "d": {"type": "object"}, "e": {}}, "required": ["a"]}
    out = bounded_schema(schema, 20)
    p = out["properties"]
    assert p["a"]["maxLength"] == 3 and "maxLength" not in p["b"]
    # never below the schema's own minimum: the bounded schema accepts a subset of the original
    assert p["c"]["maxItems"] == 9 and p["c"]["minItems"] == 9 and p["c"]["items"]["maxLength"] == 20
    assert p["d"]["maxProperties"] == 3 and p["e"] == {"type": "string", "maxLength": 20}
    assert schema["properties"]["a"] == {"type": "string", "maxLength": 3}  # the tool's own schema untouched


@sg.program
def write_note(s, budget):
    s += sg.use_tools([note])
    s += sg.user("Save a very long note: write out the full text of a long story about a dragon, "
                 "at least two thousand words, with many tags.")
    s += sg.assistant(sg.gen("turn", tools=[note], tool_choice="required", max_tokens=budget))


@pytest.mark.model
@pytest.mark.parametrize("budget", [128, 160])
def test_a_call_closes_within_a_small_max_tokens_on_the_real_model(embedded_backend, budget):
    st = write_note.run(budget=budget, backend=embedded_backend)
    st.raise_if_failed()
    turn = st.value("turn")
    assert not turn.truncated and len(turn.calls) == 1  # the call closed: nothing was cut
    call = turn.calls[0]
    assert call.name == "note" and isinstance(call.raw_arguments["text"], str)
    (_, cap), = fit_to_budget(INJECTED, [note], max_tokens=budget)
    assert len(call.raw_arguments["text"]) <= cap and all(len(t) <= cap for t in call.raw_arguments["tags"])
    meta = st.get_meta_info("turn")
    assert meta["finish_reason"] != "length" and meta["completion_tokens"] <= budget
