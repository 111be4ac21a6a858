"""``tool_choice="auto"``'s first decision by relevance (structgen.tools.relevance): the
allowed tools' texts are scored after the user's question and with no context, as one
``select`` with unconditional scores; the best tool's mean log-probability gain decides the
turn -- a call forced among the allowed tools at or above the threshold (the decision is
made once), a plain answer (never the call trigger) below it. Structure only: scripted
scores force each branch on a fake backend; on the real SmolLM2 every decided turn follows
its own recorded score, and every call made is valid.
"""

from __future__ import annotations

import pytest

import structgen as sg
from structgen.backends.fake import FakeBackend
from structgen.contract.backend import Capabilities, GenerateRequest, Message, SelectResult
from structgen.errors import ProgramError
from structgen.tools.formats import FORMATS, INJECTED
from structgen.tools.relevance import (
    DEFAULT_RELEVANCE_THRESHOLD,
    MODEL_WEIGHT,
    QUERY,
    TOOL,
    RelevanceRequest,
    combined,
    decide_relevance,
    relevance_query,
    relevance_scores,
)
from structgen.tools.spec import ToolRequest, build_spec
from tests.tools.test_decision import TOOLS

CALL = '<tool_call>[{"name": "add", "arguments": {"a": 1, "b": 2}}]</tool_call>'


@sg.program
def ask(s, question, choice="auto"):
    s += sg.use_tools(TOOLS)
    s += sg.user(question)
    s += sg.assistant(sg.gen("turn", tools=TOOLS, tool_choice=choice, parallel_tool_calls=True, max_tokens=48))


def _caps(**kw) -> Capabilities:
    return Capabilities(regex=True, json_schema=True, grammar=True, tools=True, select="logprobs",
                        sampling=frozenset({"max_new_tokens", "temperature"}), **kw)


def test_the_query_is_the_user_message_the_turn_answers():
    msgs = [Message("system", "s"), Message("user", "  What is\n 2+3? "), Message("assistant", "")]
    assert relevance_query(msgs) == "What is\n 2+3?"
    assert relevance_query([*msgs, Message("tool", "5")]) is None  # after tool results: the probe
    assert relevance_query([Message("user", "   ")]) is None
    assert relevance_query([Message("system", "s")]) is None


def test_scores_are_the_mean_gain_per_token_and_decide_the_turn():
    res = SelectResult(input_token_logprobs=[[-1.0, -3.0], [-0.5]], unconditional_token_logprobs=[[-4.0, -4.0], [-0.5]])
    assert relevance_scores(res) == [pytest.approx(2.0), pytest.approx(0.0)]
    with pytest.raises(ValueError):
        relevance_scores(SelectResult(input_token_logprobs=[[-1.0]], unconditional_token_logprobs=[]))
    spec = build_spec(TOOLS, INJECTED)
    hi = (spec.relevance_threshold + 0.1) / MODEL_WEIGHT  # a gain whose relevance reaches the threshold
    called = decide_relevance(spec, [hi, 0.0])  # nothing to commit to: the call block as it is
    assert called.mode == "auto" and called.relevance == pytest.approx(combined(hi, 0.0))
    assert called.call_threshold is None and called.grammar == spec.grammar
    forced = build_spec(TOOLS, INJECTED, tool_choice={"mode": "required", "allowed": ["add", "weather"]})
    committed = decide_relevance(spec, [hi, 0.0], committed=lambda only: forced)
    assert committed.mode == "required" and committed.grammar == forced.grammar != spec.grammar
    assert committed.relevance == called.relevance and committed.relevance_threshold == spec.relevance_threshold
    with pytest.raises(sg.OutputValidationError):  # the forced grammar's check: a call, not an answer
        committed.validate_output("<tool_call>[]</tool_call>Five.")
    assert [c.name for c in committed.validate_output(CALL).calls] == ["add"]
    assert decide_relevance(spec, [0.5], committed=lambda only: forced).mode == "none"  # below: not committed
    lo = (spec.relevance_threshold - 0.01) / MODEL_WEIGHT
    answered = decide_relevance(spec, [0.0, lo])
    assert answered.mode == "none" and answered.relevance == pytest.approx(spec.relevance_threshold - 0.01)
    with pytest.raises(sg.OutputValidationError):  # the answer grammar's check: no call
        answered.validate_output(CALL)


def test_the_threshold_is_set_for_auto_in_the_injected_format_only():
    assert build_spec(TOOLS, INJECTED).relevance_threshold == DEFAULT_RELEVANCE_THRESHOLD
    given = build_spec(TOOLS, INJECTED, tool_choice={"mode": "auto", "relevance_threshold": -0.5})
    assert given.relevance_threshold == -0.5
    off = build_spec(TOOLS, INJECTED, tool_choice={"mode": "auto", "relevance_threshold": None})
    assert off.relevance_threshold is None
    # a call threshold given alone chooses the probe
    assert build_spec(TOOLS, INJECTED, tool_choice={"mode": "auto", "call_threshold": 0.3}).relevance_threshold is None
    assert build_spec(TOOLS, INJECTED, tool_choice="required").relevance_threshold is None
    assert build_spec(TOOLS, INJECTED, think=True).relevance_threshold is None
    assert build_spec(TOOLS, FORMATS["hermes"]).relevance_threshold is None
    for bad in ("x", True, float("nan")):
        with pytest.raises(ProgramError, match="relevance_threshold"):
            sg.gen("t", tools=TOOLS, tool_choice={"mode": "auto", "relevance_threshold": bad})


@pytest.mark.parametrize("gain, expect_call", [(5.0, True), (0.5, False)])
def test_one_scoring_select_then_the_decided_grammar(gain, expect_call):
    def selector(req):  # the first tool ("add") gains `gain` nats per token, the other none
        return [[-1.0 + (gain if i == 0 else 0.0)] * 3 for i in range(len(req.choices))]

    call = CALL.replace('"a": 1, "b": 2', '"a": 2, "b": 3')  # its arguments from the question: it stands
    fb = FakeBackend([call if expect_call else "Five."], selector=selector, capabilities=_caps(prefix_cache=True))
    st = ask.run(question="What is  2 + 3?", backend=fb)
    st.raise_if_failed()
    first, second = fb.requests
    assert isinstance(first, RelevanceRequest) and first.need_unconditional
    assert first.prompt == QUERY.format(query="What is 2 + 3?")
    assert first.choices == (TOOL.format(name="add", description="Add two integers."),
                             TOOL.format(name="weather", description="The weather in a city."))
    assert isinstance(second, GenerateRequest) and second.constraint.mode == ("required" if expect_call else "none")
    assert second.params.max_new_tokens == 48
    meta = st.get_meta_info("turn")
    # the gain: (-1 + gain) - (-0.5), the fake's unconditional; the question shares no word with a tool
    assert meta["tool_relevance"] == pytest.approx(combined(gain - 0.5, 0.0))
    assert [c.name for c in st.tool_calls("turn")] == (["add"] if expect_call else [])
    assert st.text().count("What is  2 + 3?") == 1 and "Function:" not in st.text()  # scoring adds no text


def test_a_committed_turn_keeps_the_allowed_tools_and_the_budget():
    fb = FakeBackend([CALL], selector=lambda req: [[2.0] * 3 for _ in req.choices],
                     capabilities=_caps(prefix_cache=True))
    st = ask.run(question="Add 1 and 2.", choice={"mode": "auto", "allowed": ["add"]}, backend=fb)
    st.raise_if_failed()
    first, second = fb.requests
    assert first.choices == (TOOL.format(name="add", description="Add two integers."),)  # only the allowed
    forced = FakeBackend([CALL], capabilities=_caps(prefix_cache=True))  # the same turn asked as "required"
    ask.run(question="Add 1 and 2.", choice={"mode": "required", "allowed": ["add"]}, backend=forced).raise_if_failed()
    expect = forced.requests[0].constraint
    assert second.constraint.mode == "required" and second.constraint.allowed == ("add",)
    assert second.constraint.grammar == expect.grammar and second.params.max_new_tokens == 48
    assert ToolRequest.make(TOOLS).committed().choice() == {"mode": "required", "allowed": ["add", "weather"]}


@sg.program
def ask_one(s, question, choice="auto"):
    s += sg.use_tools(TOOLS)
    s += sg.user(question)
    s += sg.assistant(sg.gen("turn", tools=TOOLS, tool_choice=choice, max_tokens=48))


def _weather_first(req):  # the second tool ("weather") gains 5 nats per token, "add" none
    return [[-1.0 + (5.0 if i == 1 else 0.0)] * 3 for i in range(len(req.choices))]


WEATHER = '<tool_call>[{"name": "weather", "arguments": {"city": "Oslo"}}]</tool_call>'


def test_a_one_call_turn_is_routed_to_its_most_relevant_tool():
    spec = build_spec(TOOLS, INJECTED)  # one call at most
    hi = (spec.relevance_threshold + 0.1) / MODEL_WEIGHT
    asked: list[str | None] = []

    def committed(only):
        asked.append(only)
        allowed = [t.name for t in TOOLS] if only is None else [only]
        return build_spec(TOOLS, INJECTED, tool_choice={"mode": "required", "allowed": allowed})

    turn = decide_relevance(spec, [0.0, hi], committed=committed)
    assert asked == ["weather"] and turn.routed == "weather" and turn.allowed == ("weather",)
    assert turn.relevance_names == ("add", "weather") and len(turn.relevance_parts) == 2
    with pytest.raises(sg.OutputValidationError):  # the other tool can no longer be called
        turn.validate_output(CALL)
    assert [c.name for c in turn.validate_output(WEATHER).calls] == ["weather"]
    # a lexical count can outweigh the model's gain: the higher total wins
    asked.clear()
    assert decide_relevance(spec, [hi, 0.0], committed=committed, lexical=[0.0, 10.0]).routed == "weather"
    # not routed: several calls allowed, routing turned off, one tool only, or no call at all
    asked.clear()
    several = build_spec(TOOLS, INJECTED, parallel=True)
    assert decide_relevance(several, [0.0, hi], committed=committed).routed is None
    off = build_spec(TOOLS, INJECTED, tool_choice={"mode": "auto", "route": False})
    assert decide_relevance(off, [0.0, hi], committed=committed).routed is None
    single = build_spec(TOOLS, INJECTED, tool_choice={"mode": "auto", "allowed": ["add"]})
    assert decide_relevance(single, [hi], committed=committed).routed is None
    assert asked == [None, None, None]
    assert decide_relevance(spec, [0.0, 0.0], committed=committed).routed is None and asked == [None, None, None]


def test_a_routed_turn_on_a_backend_calls_only_that_tool_and_says_so():
    fb = FakeBackend([WEATHER], selector=_weather_first, capabilities=_caps(prefix_cache=True))
    st = ask_one.run(question="Is it raining in Oslo?", backend=fb)
    st.raise_if_failed()
    _, second = fb.requests
    assert second.constraint.mode == "required" and second.constraint.allowed == ("weather",)
    meta = st.get_meta_info("turn")
    assert meta["tool_routed"] == "weather"
    assert [t["name"] for t in meta["tool_scores"]] == ["add", "weather"]  # both scored tools, after routing
    assert [c.name for c in st.tool_calls("turn")] == ["weather"]
    unrouted = FakeBackend([WEATHER], selector=_weather_first, capabilities=_caps(prefix_cache=True))
    st = ask_one.run(question="Is it raining in Oslo?", choice={"mode": "auto", "route": False}, backend=unrouted)
    st.raise_if_failed()
    assert unrouted.requests[1].constraint.allowed == ("add", "weather")
    assert "tool_routed" not in st.get_meta_info("turn")


def test_routing_options_are_checked():
    assert ToolRequest.make(TOOLS).committed("add").choice() == {"mode": "required", "allowed": ["add"]}
    with pytest.raises(ProgramError, match="route"):
        ToolRequest.make(TOOLS, tool_choice={"mode": "auto", "allowed": ["add"]}).committed("weather")
    with pytest.raises(ProgramError, match="route"):
        sg.gen("t", tools=TOOLS, tool_choice={"mode": "auto", "route": "yes"})


def test_each_run_of_a_batch_scores_its_own_question():
    # scores below the threshold, each run's own: every turn answers
    fb = FakeBackend(responder=lambda req: "ok", selector=lambda req: [[-30.0 + len(req.prompt)] for _ in req.choices],
                     capabilities=_caps(prefix_cache=True))
    questions = ["q", "qq", "qqq", "qqqq"]
    states = ask.run_batch([{"question": q} for q in questions], backend=fb, num_threads=4)
    for q, st in zip(questions, states, strict=True):
        st.raise_if_failed()
        prompt = QUERY.format(query=q)
        assert st.get_meta_info("turn")["tool_relevance"] == pytest.approx(combined(-29.5 + len(prompt), 0.0))
        assert st["turn"] == "ok"
    scorings = [r for r in fb.requests if isinstance(r, RelevanceRequest)]
    assert sorted(r.prompt for r in scorings) == sorted(QUERY.format(query=q) for q in questions)
    assert len(fb.requests) == 8  # one scoring and one generation per run


def test_no_scoring_without_select_logprobs_or_a_prefix_cache_or_when_turned_off():
    for caps, choice in ((_caps(), "auto"),  # no prefix cache
                         (Capabilities(regex=True, grammar=True, tools=True, select="choice", prefix_cache=True,
                                       sampling=frozenset({"max_new_tokens", "temperature"})), "auto"),
                         (_caps(prefix_cache=True), {"mode": "auto", "relevance_threshold": None})):
        fb = FakeBackend([CALL], capabilities=caps)
        st = ask.run(question="2 + 3?", choice=choice, backend=fb)
        st.raise_if_failed()
        assert len(fb.requests) == 1 and fb.requests[0].constraint.mode == "auto"
        assert [c.name for c in st.tool_calls("turn")] == ["add"]


@pytest.mark.model
def test_the_default_decision_follows_the_relevance_in_a_batch(embedded_backend):
    questions = ["What is 2 + 3? Add the two integers.", "What is the weather in Paris?",
                 "Write a haiku about the sea."]
    states = ask.run_batch([{"question": q} for q in questions], backend=embedded_backend)
    for st in states:
        st.raise_if_failed()
        turn, r = st.value("turn"), st.get_meta_info("turn")["tool_relevance"]
        assert "call_probability" not in st.get_meta_info("turn")  # relevance decided: no probe
        meta = st.get_meta_info("turn")
        if r >= DEFAULT_RELEVANCE_THRESHOLD and "declined_calls" not in meta:  # a call, as the forced grammar writes it
            assert st["turn"].startswith("<tool_call>[{")
            assert turn.calls and all(c.name in {"add", "weather"} for c in turn.calls)
        else:  # a plain answer (below the threshold, or its call withdrawn: tests/tools/test_grounding.py)
            assert turn.calls == [] and "<tool_call>" not in st["turn"] and st["turn"]


@pytest.mark.model
@pytest.mark.parametrize("threshold, expect_block", [(-100.0, True), (100.0, False)])
def test_thresholds_force_each_branch_on_the_model(embedded_backend, threshold, expect_block):
    choice = {"mode": "auto", "relevance_threshold": threshold, "grounding_threshold": None}  # relevance alone
    st = ask.run(question="What is 2 + 3?", choice=choice, backend=embedded_backend)
    st.raise_if_failed()
    assert st["turn"].startswith("<tool_call>[") == expect_block
    if not expect_block:
        assert "<tool_call>" not in st["turn"] and st.tool_calls("turn") == []
    assert -100.0 < st.get_meta_info("turn")["tool_relevance"] < 100.0
