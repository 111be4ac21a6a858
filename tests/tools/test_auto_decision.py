"""``tool_choice="auto"`` in the injected format: the turn opens the call block, and the model
decides right after ``<tool_call>[`` between ``]`` (no call, then a free-text answer) and
a call. Checked token by token against the real SmolLM2 tokenizer and llguidance's mask;
native formats keep their lazy trigger (free text may come first).
"""

from __future__ import annotations

import pytest

import structgen as sg
from structgen.constraints.bitmask import allocate_token_bitmask, allowed_token_ids
from structgen.constraints.compiler import compiler_for
from structgen.tools.formats import FORMATS, INJECTED
from structgen.tools.spec import build_spec


@sg.tool
def add(a: int, b: int) -> int:
    """Add."""
    return a + b


@sg.tool
def pick(color: str) -> str:
    """Pick a color."""
    return color


TOOLS = [add, pick]


@pytest.fixture(scope="module")
def compiler(tokenizer):
    return compiler_for(tokenizer)


def allowed(matcher, compiler) -> list[int]:
    bitmask = allocate_token_bitmask(1, compiler.vocab_size, kind="numpy")
    matcher.fill_bitmask(bitmask)
    return allowed_token_ids(bitmask, 0, compiler.vocab_size).tolist()


def texts(matcher, ids: list[int]) -> list[str]:
    return [matcher.token_bytes([t]).decode("utf-8", "replace") for t in ids]


def consume_text(matcher, text: str) -> None:
    ids = matcher.tokenize_bytes(text.encode())
    assert matcher.validate_tokens(ids) == len(ids), text
    assert matcher.consume_many(ids)


@pytest.mark.parametrize("parallel", [False, 3])
def test_auto_opens_the_block_then_the_model_decides(compiler, parallel):
    spec = build_spec(TOOLS, INJECTED, tool_choice="auto", parallel=parallel)
    m = compiler.compile(spec).matcher()
    assert m.forced_text() == b"<tool_call>["  # nothing else can start the turn
    start = allowed(m, compiler)
    assert compiler.eos_token_id not in start
    assert all("<tool_call>[".startswith(t) or t.startswith("<tool_call>[") for t in texts(m, start))
    consume_text(m, "<tool_call>[")
    decision = allowed(m, compiler)
    assert compiler.eos_token_id not in decision
    firsts = {t[0] for t in texts(m, decision)}
    assert firsts == {"]", "{"}  # no call, or a call: nothing else


def test_empty_list_then_an_answer_or_nothing(compiler):
    spec = build_spec(TOOLS, INJECTED, tool_choice="auto", parallel=True)
    m = compiler.compile(spec).matcher()
    consume_text(m, "<tool_call>[]</tool_call>")
    assert m.is_accepting() and not m.is_stopped()  # the model may stop here (no call, no text) ...
    assert compiler.eos_token_id in allowed(m, compiler)
    consume_text(m, "\nNo tool can answer that.")  # ... or answer in free text
    assert m.is_accepting()
    bad = m.tokenize_bytes(b" <tool_call>[")
    assert m.validate_tokens(bad) < len(bad)  # never a second call block inside the answer
    turn = spec.validate_output("<tool_call>[]</tool_call>\nNo tool can answer that.")
    assert turn.calls == [] and turn.content == "No tool can answer that."


def test_calls_branch_ends_the_grammar(compiler):
    spec = build_spec(TOOLS, INJECTED, tool_choice="auto", parallel=2)
    text = INJECTED.render_calls([("add", {"a": 1, "b": 2}), ("pick", {"color": "red"})])
    m = compiler.compile(spec).matcher()
    consume_text(m, text)
    assert m.is_stopped()  # after the block closes nothing follows: no rambling after calls
    turn = spec.validate_output(text)
    assert [c.name for c in turn.calls] == ["add", "pick"] and turn.content == ""
    m = compiler.compile(spec).matcher()
    three = INJECTED.render_calls([("add", {"a": 1, "b": 2})] * 3)
    ids = m.tokenize_bytes(three.encode())
    assert m.validate_tokens(ids) < len(ids)


def test_no_text_before_the_block_and_thinking_comes_first(compiler):
    auto = build_spec(TOOLS, INJECTED, tool_choice="auto")
    for text in ("Sure. <tool_call>[]</tool_call>", "Plain answer."):
        m = compiler.compile(auto).matcher()
        ids = m.tokenize_bytes(text.encode())
        assert m.validate_tokens(ids) < len(ids), text
    think = build_spec(TOOLS, INJECTED, tool_choice="auto", think=True)
    m = compiler.compile(think).matcher()
    consume_text(m, "<think>no tool fits</think>\n")
    assert m.forced_text() == b"<tool_call>["  # thinking never turns the decision point off
    consume_text(m, "<tool_call>[]</tool_call>Sorry.")
    assert m.is_accepting()
    turn = think.validate_output("<think>no tool fits</think>\n<tool_call>[]</tool_call>Sorry.")
    assert turn.thinking == "no tool fits" and turn.content == "Sorry." and turn.calls == []


@pytest.mark.parametrize("fmt", ["hermes", "mistral", "llama3_json"])
def test_native_formats_keep_free_text_under_auto(compiler, fmt):
    spec = build_spec(TOOLS, FORMATS[fmt], tool_choice="auto")
    m = compiler.compile(spec).matcher()
    assert m.forced_text() == b""
    consume_text(m, "Plain answer.")
    assert m.is_accepting()
