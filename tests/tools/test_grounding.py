"""``auto``'s grounding check (structgen.tools.grounding): a call that relevance committed to
stands when the conversation gave its arguments and is withdrawn for a plain answer when it
did not. The share counts strings (normalised substrings) and numbers (by value) of the
user and tool messages, and leaves out what a source cannot show and what the tool's own
schema forces (enum, const). Structure only: a fake backend scripts each branch (each output checked
against its request's grammar); on SmolLM2 every turn follows its own recorded grounding.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import pytest
from pydantic import Field

import structgen as sg
from structgen.backends.fake import FakeBackend
from structgen.constraints.compiler import compiler_for
from structgen.contract.backend import Capabilities, GenerateRequest, GenerateResult, Message
from structgen.errors import ProgramError
from structgen.tools.calls import ToolCall
from structgen.tools.formats import INJECTED
from structgen.tools.grounding import (
    DEFAULT_GROUNDING_THRESHOLD,
    call_grounding,
    grounding_source,
    schema_values,
)
from structgen.tools.relevance import RelevanceRequest
from structgen.tools.spec import build_spec
from tests.tools.test_decision import TOOLS

CALL = '<tool_call>[{"name": "add", "arguments": {"a": 1, "b": 2}}]</tool_call>'


class Unit(StrEnum):
    celsius = "celsius"
    fahrenheit = "fahrenheit"


@sg.tool
def forecast(city: str, days: Annotated[int, Field(ge=1)] = 3, unit: Unit = Unit.celsius, hourly: bool = False) -> str:
    """The forecast for a city."""
    return "sunny"


def _call(name: str, args: dict) -> ToolCall:
    return ToolCall(id="c", name=name, arguments=args, raw_arguments=args, raw="")


def test_the_share_counts_what_the_conversation_could_have_given():
    src = "What's the forecast for  new YORK over the next 5 days?"
    # city (a substring, case and spaces normalised) and 5 (a number by value) count; the
    # enum member and the boolean do not
    full = _call("forecast", {"city": "New York", "days": 5, "unit": "fahrenheit", "hourly": True})
    assert call_grounding([full], [forecast], src) == 1.0
    guessed = _call("forecast", {"city": "Boston", "days": 5.0})
    assert call_grounding([guessed], [forecast], src) == 0.5
    assert call_grounding([_call("forecast", {"days": 3})], [forecast], src) == 0.0  # a default nobody gave: a guess
    assert call_grounding([_call("forecast", {"unit": "celsius"})], [forecast], src) is None  # an enum member
    assert call_grounding([_call("forecast", {"hourly": False, "city": ""})], [forecast], src) is None
    # several calls: one share over all their values; nested values count leaf by leaf
    two = [_call("add", {"a": 1, "b": 2}), _call("add", {"a": 3, "b": 40})]
    assert call_grounding(two, TOOLS, "1 + 2, then 3 + 4") == 0.75
    assert call_grounding([_call("x", {"p": [1, {"q": "ab"}]})], [], "ab 1") == 1.0


def test_schema_values_are_its_enum_members_and_consts():
    schema = {"type": "object", "properties": {
        "u": {"enum": ["Celsius", "F", 7, True]}, "n": {"type": "integer", "default": 3},
        "deep": {"type": "array", "items": {"anyOf": [{"const": "x y"}, {"type": "number", "examples": [2.5]}]}},
        "properties": {"type": "string", "enum": ["p"]}}}  # a property named "properties"
    assert schema_values(schema) == {"celsius", "f", 7.0, "x y", "p"}
    assert schema_values(forecast.parameters) == {"celsius", "fahrenheit"}


def test_the_source_is_the_user_and_tool_messages():
    msgs = [Message("system", "sys 7"), Message("user", "u 1"), Message("assistant", "a 2"), Message("tool", "t 3")]
    assert grounding_source(msgs) == "u 1\nt 3"


def test_the_threshold_is_set_with_relevance_and_checked():
    def threshold(choice):
        return build_spec(TOOLS, INJECTED, tool_choice=choice).grounding_threshold

    assert threshold("auto") == DEFAULT_GROUNDING_THRESHOLD
    assert threshold({"mode": "auto", "grounding_threshold": 0.2}) == 0.2
    assert threshold({"mode": "auto", "grounding_threshold": None}) is None
    # only a turn that relevance decides is checked
    assert threshold({"mode": "auto", "relevance_threshold": None}) is None
    assert threshold("required") is None
    for bad in ("x", True, 1.5, -0.1):
        with pytest.raises(ProgramError, match="grounding_threshold"):
            sg.gen("t", tools=TOOLS, tool_choice={"mode": "auto", "grounding_threshold": bad})


@sg.program
def ask(s, question, choice="auto"):
    s += sg.use_tools(TOOLS)
    s += sg.user(question)
    s += sg.assistant(sg.gen("turn", tools=TOOLS, tool_choice=choice, max_tokens=48))


@pytest.fixture(scope="module")
def compiler(tokenizer):
    return compiler_for(tokenizer)


def _backend(compiler, write=lambda req: CALL if req.constraint.mode == "required" else "Five.") -> FakeBackend:
    """Relevance always high; each turn writes ``write(request)`` (by default: a forced turn
    CALL, an answer "Five."), checked against its request's grammar."""

    def respond(req: GenerateRequest) -> GenerateResult:
        text = write(req)
        m = compiler.compile(req.constraint).matcher()
        ids = m.tokenize_bytes(text.encode())
        assert m.validate_tokens(ids) == len(ids), (text, req.constraint.grammar)
        return GenerateResult(text=text, meta={"completion_tokens": len(ids)})

    caps = Capabilities(regex=True, json_schema=True, grammar=True, tools=True, select="logprobs",
                        prefix_cache=True, sampling=frozenset({"max_new_tokens", "temperature"}))
    return FakeBackend(responder=respond, selector=lambda req: [[1.0] * 3 for _ in req.choices], capabilities=caps)


def test_a_grounded_call_stands(compiler):
    fb = _backend(compiler)
    st = ask.run(question="Add 1 and 2.", backend=fb)
    st.raise_if_failed()
    assert [type(r) for r in fb.requests] == [RelevanceRequest, GenerateRequest]
    assert [c.name for c in st.tool_calls("turn")] == ["add"] and st["turn"] == CALL
    meta = st.get_meta_info("turn")
    assert meta["tool_grounding"] == 1.0 and "declined_calls" not in meta


def test_an_ungrounded_call_is_withdrawn_for_an_answer_and_never_streamed(compiler):
    fb = _backend(compiler)
    st = ask.run(question="Add the numbers.", backend=fb, stream=True)
    streamed = "".join(st.text_iter())
    st.raise_if_failed()
    _, called, answered = fb.requests
    assert called.constraint.mode == "required" and answered.constraint.mode == "none"
    assert answered.prompt == called.prompt and answered.params.max_new_tokens == called.params.max_new_tokens
    assert st["turn"] == "Five." and st.tool_calls("turn") == []
    assert CALL not in streamed and streamed == st.text()  # the withdrawn call was never emitted
    meta = st.get_meta_info("turn")
    assert meta["tool_grounding"] == 0.0 and meta["declined_calls"] == CALL


def test_the_check_turned_off_keeps_the_call(compiler):
    fb = _backend(compiler)
    st = ask.run(question="Add the numbers.", choice={"mode": "auto", "grounding_threshold": None}, backend=fb)
    st.raise_if_failed()
    assert len(fb.requests) == 2 and [c.name for c in st.tool_calls("turn")] == ["add"]
    assert "tool_grounding" not in st.get_meta_info("turn")


@pytest.mark.model
def test_each_turn_follows_its_grounding_on_the_model(embedded_backend):
    questions = ["What is 2 + 3? Add the two integers.", "What is the weather in Paris?", "Add some numbers."]
    states = ask.run_batch([{"question": q, "choice": {"mode": "auto", "relevance_threshold": -100.0}}
                            for q in questions], backend=embedded_backend)
    for q, st in zip(questions, states, strict=True):
        st.raise_if_failed()
        meta, turn = st.get_meta_info("turn"), st.value("turn")
        g = meta["tool_grounding"]
        if "declined_calls" in meta:  # withdrawn: a plain answer, the call kept in the meta
            assert g is not None and g < DEFAULT_GROUNDING_THRESHOLD
            assert turn.calls == [] and "<tool_call>" not in st["turn"]
            assert meta["declined_calls"].startswith("<tool_call>[{")
        else:  # the committed call stands: its grounding, recomputed, is the recorded one
            assert turn.calls and (g is None or g >= DEFAULT_GROUNDING_THRESHOLD)
            assert call_grounding(turn.calls, TOOLS, q) == g


def test_a_staged_turn_withdrawn_is_answered_from_its_first_request(compiler):
    """A parallel turn written call by call (structgen.tools.staging) is checked once it is
    whole; withdrawn, the answer continues the turn's first prompt, not the stages' text."""
    from tests.tools.test_staging import CALL as NOTE_CALL
    from tests.tools.test_staging import note

    @sg.program
    def save(s):
        s += sg.use_tools([note])
        s += sg.user("Save three notes.")
        s += sg.assistant(sg.gen("turn", tools=[note], parallel_tool_calls=True, max_tokens=224))

    pieces = ["<tool_call>[" + NOTE_CALL, "]</tool_call>", "Which notes?"]  # note(text="hi"): "hi" never given
    fb = _backend(compiler, lambda req: pieces.pop(0))
    st = save.run(backend=fb)
    st.raise_if_failed()
    _, first, second, answered = fb.requests
    assert first.constraint.staged_budget == 224 and second.prompt == first.prompt + "<tool_call>[" + NOTE_CALL
    assert answered.prompt == first.prompt and answered.params.max_new_tokens == 224
    assert answered.constraint.mode == "none" and answered.constraint.staged_budget is None
    assert st["turn"] == "Which notes?" and st.tool_calls("turn") == []
    meta = st.get_meta_info("turn")
    assert meta["declined_calls"] == "<tool_call>[" + NOTE_CALL + "]</tool_call>" and meta["tool_grounding"] == 0.0
    assert "tool_stages" not in meta  # the answer is one request
