"""``tool_choice="auto"`` in the injected format: the first decision, scored by the model
(structgen.tools.decision). On the real SmolLM2 (embedded backend): the probe reads the
call probability, the turn then follows the decision -- the call block when the probability
reaches the threshold, a plain answer (never the call trigger) below it -- and every call
made is valid. Structure only: the thresholds 0 and 1 force each branch, whatever the model.
"""

from __future__ import annotations

import math

import pytest

import structgen as sg
from structgen.backends.fake import FakeBackend
from structgen.contract.backend import Capabilities, GenerateResult
from structgen.errors import ProgramError
from structgen.tools.decision import DEFAULT_CALL_THRESHOLD, call_probability
from structgen.tools.formats import FORMATS, INJECTED
from structgen.tools.spec import build_spec


@sg.tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@sg.tool
def weather(city: str) -> str:
    """The weather in a city."""
    return "sunny"


TOOLS = [add, weather]


@sg.program
def ask(s, question, choice="auto"):
    s += sg.use_tools(TOOLS)
    s += sg.user(question)
    s += sg.assistant(sg.gen("turn", tools=TOOLS, tool_choice=choice, parallel_tool_calls=True, max_tokens=48))


def test_call_probability_sums_the_tokens_that_begin_the_trigger():
    meta = {"output_top_logprobs": [[(math.log(0.5), 1, "The"), (math.log(0.1), 2, "<"),
                                     (math.log(0.05), 3, "<tool"), (math.log(0.02), 4, "<a"),
                                     (math.log(0.01), 5, "<tool_call>[")]]}
    assert call_probability(meta, "<tool_call>") == pytest.approx(0.16)
    assert call_probability({}, "<tool_call>") == 0.0
    as_map = {"output_top_logprobs": [{"The": math.log(0.5), "<": math.log(0.1), "<a": math.log(0.2)}]}
    assert call_probability(as_map, "<tool_call>") == pytest.approx(0.1)  # an OpenAI completions map


def test_the_threshold_is_set_for_auto_in_the_injected_format_only():
    assert build_spec(TOOLS, INJECTED).call_threshold == DEFAULT_CALL_THRESHOLD
    assert build_spec(TOOLS, INJECTED, tool_choice={"mode": "auto", "call_threshold": 0.3}).call_threshold == 0.3
    assert build_spec(TOOLS, INJECTED, tool_choice={"mode": "auto", "call_threshold": 0}).call_threshold is None
    assert build_spec(TOOLS, INJECTED, tool_choice="required").call_threshold is None
    assert build_spec(TOOLS, INJECTED, think=True).call_threshold is None  # thinking: the grammar decides
    assert build_spec(TOOLS, FORMATS["hermes"]).call_threshold is None  # native: the lazy trigger
    for bad in (-0.1, 1.5, "x", True):
        with pytest.raises(ProgramError, match="call_threshold"):
            sg.gen("t", tools=TOOLS, tool_choice={"mode": "auto", "call_threshold": bad})


def _caps(sampling: set[str]) -> Capabilities:
    return Capabilities(regex=True, json_schema=True, grammar=True, tools=True, prefix_cache=True,
                        sampling=frozenset({"max_new_tokens", "temperature", *sampling}))


@pytest.mark.parametrize("p, expect_call", [(0.3, True), (0.001, False)])
def test_the_probe_is_one_unconstrained_token_then_the_chosen_grammar(p, expect_call):
    probe = GenerateResult(text="x", finish_reason="length", meta={
        "output_top_logprobs": [[(math.log(p), 7, "<"), (math.log(0.5), 8, "The")]]})
    call = '<tool_call>[{"name": "add", "arguments": {"a": 1, "b": 2}}]</tool_call>'
    fb = FakeBackend([probe, call if expect_call else "Five."],
                     capabilities=_caps({"top_logprobs_num", "return_logprob", "return_text_in_logprobs"}))
    st = ask.run(question="2 + 3?", backend=fb)
    st.raise_if_failed()
    first, second = fb.requests
    assert first.constraint is None and first.params.max_new_tokens == 1 and first.params.top_logprobs_num
    assert second.constraint.mode == ("auto" if expect_call else "none") and second.params.max_new_tokens == 48
    assert st.get_meta_info("turn")["call_probability"] == pytest.approx(p)
    assert [c.name for c in st.tool_calls("turn")] == (["add"] if expect_call else [])
    assert "x" not in st.text().split("2 + 3?")[1]  # the probe's token never joins the text


def test_no_probe_without_top_logprobs_text_or_a_prefix_cache():
    call = '<tool_call>[{"name": "add", "arguments": {"a": 1, "b": 2}}]</tool_call>'
    for caps in (_caps({"top_logprobs_num", "return_logprob"}),
                 Capabilities(tools=True, grammar=True, sampling=frozenset({"max_new_tokens", "temperature",
                                                                            "top_logprobs_num",
                                                                            "return_text_in_logprobs"}))):
        fb = FakeBackend([call], capabilities=caps)
        st = ask.run(question="2 + 3?", backend=fb)
        st.raise_if_failed()
        assert len(fb.requests) == 1 and fb.requests[0].constraint.mode == "auto"
        assert [c.name for c in st.tool_calls("turn")] == ["add"]


@pytest.mark.model
def test_threshold_one_answers_in_text(embedded_backend):
    st = ask.run(question="What is 2 + 3?", choice={"mode": "auto", "call_threshold": 1.0},
                 backend=embedded_backend)
    st.raise_if_failed()
    turn, meta = st.value("turn"), st.get_meta_info("turn")
    assert 0.0 <= meta["call_probability"] < 1.0
    assert turn.calls == [] and "<tool_call>" not in st["turn"] and turn.content == st["turn"]
    before = st.text().split(st["turn"])[0]
    assert st.text().count(st["turn"]) == 1 and before.endswith("assistant\n")  # the probe added no text


@pytest.mark.model
def test_threshold_zero_opens_the_block_without_a_probe(embedded_backend):
    st = ask.run(question="What is 2 + 3?", choice={"mode": "auto", "call_threshold": 0},
                 backend=embedded_backend)
    st.raise_if_failed()
    assert st["turn"].startswith("<tool_call>[") and "call_probability" not in st.get_meta_info("turn")


@pytest.mark.model
def test_the_decision_follows_the_probability_in_a_batch(embedded_backend):
    # call_threshold given alone: the probe decides (the default decides by relevance first:
    # tests/tools/test_relevance.py)
    questions = ["What is 2 + 3?", "What is the weather in Paris?", "Write a haiku about the sea."]
    choice = {"mode": "auto", "call_threshold": DEFAULT_CALL_THRESHOLD}
    states = ask.run_batch([{"question": q, "choice": choice} for q in questions], backend=embedded_backend)
    for st in states:
        st.raise_if_failed()
        turn, p = st.value("turn"), st.get_meta_info("turn")["call_probability"]
        if p >= DEFAULT_CALL_THRESHOLD:  # the call block, as the grammar writes it
            assert st["turn"].startswith("<tool_call>[")
            assert all(c.name in {"add", "weather"} for c in turn.calls)
        else:  # a plain answer: never a call
            assert turn.calls == [] and "<tool_call>" not in st["turn"] and st["turn"]
