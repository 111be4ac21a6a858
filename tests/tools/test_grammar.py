"""Item 2-4: the tool-call grammar against the real SmolLM2 tokenizer and llguidance.

Every format x mode: valid turns are accepted in full, and unknown tools, invalid
arguments, one call too many, text where a call is required, and calls where none is
allowed are rejected by the token mask. Rendered calls parse back to the same calls.
"""

from __future__ import annotations

import json

import pytest

import structgen as sg
from structgen.constraints.compiler import compiler_for
from structgen.errors import OutputValidationError, ProgramError
from structgen.tools.formats import FORMATS
from structgen.tools.spec import build_spec


@sg.tool
def add(a: int, b: int) -> int:
    """Add."""
    return a + b


@sg.tool
def pick(color: str, size: int = 1) -> str:
    """Pick a color."""
    return color


TOOLS = [add, pick]


@pytest.fixture(scope="module")
def compiler(tokenizer):
    return compiler_for(tokenizer)


def accepts(compiler, tokenizer, spec, text: str) -> bool:
    m = compiler.compile(spec).matcher()
    ids = tokenizer(text, add_special_tokens=False).input_ids
    if m.validate_tokens(ids) != len(ids):
        return False
    assert m.consume_many(ids)
    return m.is_accepting()


def calls_text(fmt, calls, content=""):
    return FORMATS[fmt].render_calls(calls, content)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_auto_accepts_answers_and_valid_calls_only(fmt, compiler, tokenizer):
    f = FORMATS[fmt]
    spec = build_spec(TOOLS, f, tool_choice="auto", parallel=2)
    answer = "<tool_call>[]</tool_call>The answer is 42." if f.opens_in_auto else "The answer is 42."
    ok = [calls_text(fmt, [("add", {"a": 1, "b": 2})]),
          calls_text(fmt, [("add", {"a": 1, "b": 2}), ("pick", {"color": "red"})]),
          answer]
    if f.text_before and not f.opens_in_auto:
        ok.append(calls_text(fmt, [("pick", {"color": "red", "size": 3})], content="Let me check. "))
    for text in ok:
        assert accepts(compiler, tokenizer, spec, text), text
        turn = spec.validate_output(text)
        assert all(c.name in ("add", "pick") for c in turn.calls)
    bad = [calls_text(fmt, [("sub", {"a": 1, "b": 2})]),                     # unknown tool
           calls_text(fmt, [("add", {"a": "1", "b": 2})]),                   # wrong type
           calls_text(fmt, [("add", {"a": 1})]),                             # missing argument
           calls_text(fmt, [("add", {"a": 1, "b": 2, "c": 3})]),             # unknown argument
           calls_text(fmt, [("add", {"a": 1, "b": 2})] * 3)]                 # more than k=2
    for text in bad:
        assert not accepts(compiler, tokenizer, spec, text), text
        with pytest.raises(OutputValidationError):
            spec.validate_output(text)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_required_named_allowed_none(fmt, compiler, tokenizer):
    f = FORMATS[fmt]
    one = calls_text(fmt, [("add", {"a": 1, "b": 2})])
    two = calls_text(fmt, [("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": 4})])
    required = build_spec(TOOLS, f, tool_choice="required", parallel=False)
    assert accepts(compiler, tokenizer, required, one)
    assert not accepts(compiler, tokenizer, required, two)  # parallel_tool_calls=False: exactly one
    assert not accepts(compiler, tokenizer, required, "No call.")
    if f.text_before:  # required: the call starts at once, no text to ramble in
        assert not accepts(compiler, tokenizer, required, calls_text(fmt, [("add", {"a": 1, "b": 2})], "Hm. "))
    m = compiler.compile(required).matcher()
    ids = tokenizer(one, add_special_tokens=False).input_ids
    m.consume_many(ids)
    assert m.is_stopped()  # after the last allowed call the grammar ends: no loop to max_tokens
    named = build_spec(TOOLS, f, tool_choice="pick")
    assert not accepts(compiler, tokenizer, named, one)
    assert accepts(compiler, tokenizer, named, calls_text(fmt, [("pick", {"color": "blue"})]))
    allowed = build_spec(TOOLS, f, tool_choice={"allowed": ["add"]})
    text = "<tool_call>[]</tool_call>text" if f.opens_in_auto else "text"
    assert accepts(compiler, tokenizer, allowed, one) and accepts(compiler, tokenizer, allowed, text)
    assert not accepts(compiler, tokenizer, allowed, calls_text(fmt, [("pick", {"color": "blue"})]))
    none = build_spec(TOOLS, f, tool_choice="none")
    assert accepts(compiler, tokenizer, none, "Just text.")
    assert not accepts(compiler, tokenizer, none, one)
    k3 = build_spec(TOOLS, f, tool_choice="required", parallel=3)
    assert accepts(compiler, tokenizer, k3, calls_text(fmt, [("add", {"a": i, "b": i}) for i in range(3)]))
    assert not accepts(compiler, tokenizer, k3, calls_text(fmt, [("add", {"a": i, "b": i}) for i in range(4)]))


def test_injected_empty_list_means_no_call(compiler, tokenizer):
    auto = build_spec(TOOLS, FORMATS["structgen"], tool_choice="auto")
    assert accepts(compiler, tokenizer, auto, "<tool_call>[]</tool_call>")
    assert auto.validate_output("<tool_call>[]</tool_call>").calls == []
    turn = auto.validate_output("<tool_call>[]</tool_call>\nNo tool fits.")
    assert turn.calls == [] and turn.content == "No tool fits." and turn.is_answer
    required = build_spec(TOOLS, FORMATS["structgen"], tool_choice="required")
    assert not accepts(compiler, tokenizer, required, "<tool_call>[]</tool_call>")
    with pytest.raises(OutputValidationError):
        required.validate_output("<tool_call>[]</tool_call>")


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_a_truncated_turn_keeps_its_whole_calls_only(fmt):
    spec = build_spec(TOOLS, FORMATS[fmt], tool_choice="required", parallel=3)
    full = calls_text(fmt, [("add", {"a": 1, "b": 2}), ("pick", {"color": "red"})])
    second = full.rindex('{"name": "pick"')
    for cut in (second + 5, full.rindex("red")):  # max_tokens inside the second call
        turn = spec.validate_output(full[:cut], truncated=True)
        assert [c.name for c in turn.calls] == ["add"] and turn.calls[0].arguments.a == 1 and turn.truncated
        with pytest.raises(OutputValidationError):  # the same text, not cut by max_tokens: malformed
            spec.validate_output(full[:cut])
    assert not spec.validate_output(full, truncated=True).truncated  # whole: nothing was cut
    with pytest.raises(OutputValidationError) as exc:  # cut inside the first call: no call to keep
        spec.validate_output(full[:full.index('"b"')], truncated=True)
    assert exc.value.truncated


def test_answer_never_contains_the_trigger(compiler, tokenizer):
    spec = build_spec(TOOLS, FORMATS["hermes"], tool_choice="auto")
    assert not accepts(compiler, tokenizer, spec, "text <tool_call> more text")
    llama = build_spec(TOOLS, FORMATS["llama3_json"], tool_choice="auto")
    assert not accepts(compiler, tokenizer, llama, '{"not": "a call"}')


def test_think_section_then_the_constraint(compiler, tokenizer):
    spec = build_spec(TOOLS, FORMATS["structgen"], tool_choice="required", think=True)
    call = calls_text("structgen", [("add", {"a": 1, "b": 2})])
    text = "<think>I should add.</think>\n" + call
    assert accepts(compiler, tokenizer, spec, text)
    assert not accepts(compiler, tokenizer, spec, "<think>x</think>\nplain text")  # thinking never frees the rest
    assert not accepts(compiler, tokenizer, spec, call)  # the section comes first
    turn = spec.validate_output(text)
    assert turn.thinking == "I should add." and turn.calls[0].arguments.a == 1
    tagged = build_spec(TOOLS, FORMATS["structgen"], tool_choice="required", think=("<r>", "</r>"))
    assert accepts(compiler, tokenizer, tagged, "<r>hm</r>\n" + call)
    bounded = build_spec(TOOLS, FORMATS["structgen"], tool_choice="required",
                         think={"tags": ("<think>", "</think>"), "max_chars": 5})
    assert accepts(compiler, tokenizer, bounded, "<think>abcde</think>\n" + call)
    assert not accepts(compiler, tokenizer, bounded, "<think>abcdef</think>\n" + call)


def test_thinking_before_json_and_regex(compiler, tokenizer):
    from structgen.tools.thinking import thinking_spec

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    spec = thinking_spec(True, json_schema=schema)
    assert accepts(compiler, tokenizer, spec, '<think>count</think>\n{"n":3}')
    assert not accepts(compiler, tokenizer, spec, '<think>count</think>\n{"n":"3"}')
    assert spec.validate_output('<think>count</think>\n{"n":3}') == {"n": 3}
    rx = thinking_spec(True, regex=r"[0-9]{3}")
    assert accepts(compiler, tokenizer, rx, "<think>a</think>\n123")
    assert not accepts(compiler, tokenizer, rx, "<think>a</think>\n12a")
    assert thinking_spec(True, dtype=int).validate_output("<think>a</think>\n12") == 12


def test_choice_and_parallel_arguments_are_checked():
    with pytest.raises(ProgramError):
        build_spec(TOOLS, FORMATS["hermes"], tool_choice="nope")
    with pytest.raises(ProgramError):
        build_spec(TOOLS, FORMATS["hermes"], tool_choice={"allowed": ["nope"]})
    with pytest.raises(ProgramError):
        build_spec(TOOLS, FORMATS["hermes"], parallel=0)
    with pytest.raises(ProgramError):
        build_spec(TOOLS, FORMATS["hermes"], think="yes")


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_render_parse_round_trip(fmt):
    spec = build_spec(TOOLS, FORMATS[fmt], tool_choice="auto", parallel=True)
    calls = [("add", {"a": 1, "b": 2}), ("pick", {"color": "r\u00e9d \"x\""})]
    turn = spec.validate_output(spec.render_calls(calls))
    assert [(c.name, c.raw_arguments) for c in turn.calls] == calls
    assert len({c.id for c in turn.calls}) == 2
    assert json.loads(turn.calls[1].raw)["name"] == "pick"
