"""A staged parallel turn asks for calls until the user's numbers are used (structgen.tools.coverage).

The numbers of a question, the numbers a call uses, and when a call adds coverage; the
forced stage's grammar (the separator and a call, never the block's end); through the
interpreter with a scripted backend whose every output is checked against its request's
grammar (the real tokenizer and llguidance): uncovered numbers ask for one more call, a
call that repeats an earlier one or uses no uncovered number is dropped (in the meta, never
streamed) and the block ends before it, ``coverage: False`` leaves the choice to the model.
On the real model: every call kept after a forced stage is new, and the turn validates.
"""

from __future__ import annotations

import pytest

import structgen as sg
from structgen.backends.fake import FakeBackend
from structgen.constraints.compiler import compiler_for
from structgen.contract.backend import GenerateResult
from structgen.errors import ProgramError
from structgen.tools.budget import CALL_FLOOR, block_chars, longest_call
from structgen.tools.calls import ToolCall
from structgen.tools.coverage import adds_coverage, call_numbers, question_numbers, steered, uncovered
from structgen.tools.definition import Tool
from structgen.tools.formats import INJECTED
from structgen.tools.grammar import tool_grammar
from structgen.tools.spec import ToolRequest
from structgen.tools.staging import next_stage


@sg.tool
def factorial(number: int) -> int:
    """The factorial of a number."""
    return number


@sg.tool
def note(text: str) -> str:
    """Write a note."""
    return text


@sg.tool
def em_force(b_field: float, area: float, d_time: int, label: str = "") -> float:
    """The induced EMF."""
    return b_field * area / d_time


QUESTION = "Find the factorial of 5, 10 and 15."
END = "]</tool_call>"


def _call(n: int | str) -> str:
    return INJECTED.call_json("factorial", {"number": n})


def _note(text: str) -> str:
    return INJECTED.call_json("note", {"text": text})


def _tc(args: dict, name: str = "factorial") -> ToolCall:
    return ToolCall(id="c", name=name, arguments=args, raw_arguments=args, raw="")


def test_the_numbers_of_a_question_and_of_a_call():
    assert question_numbers(QUESTION) == {5.0, 10.0, 15.0}
    assert question_numbers("Play Maroon 5 for 20 minutes; HbA1c and COVID19 are names; $1,200.50 -3") == \
        {5.0, 20.0, 1200.5, 3.0}
    assert call_numbers(_tc({"a": 5, "b": -3.0, "c": "from 10 to 1,200", "d": True, "e": [{"f": 7}], "g": None})) \
        == {5.0, 3.0, 10.0, 1200.0, 7.0}
    assert uncovered(QUESTION, [_tc({"number": 5})]) == {10.0, 15.0}
    assert uncovered(QUESTION, [_tc({"number": 5}), _tc({"number": "10 and 15"})]) == set()


def test_a_call_adds_coverage_when_it_is_new_and_uses_what_the_others_did_not():
    first = [_tc({"number": 5})]
    assert adds_coverage(QUESTION, first, _tc({"number": 10}))
    assert not adds_coverage(QUESTION, first, _tc({"number": 5}))  # a repeat
    assert not adds_coverage(QUESTION, first, _tc({"number": 7}))  # no number the question left
    assert not adds_coverage(QUESTION, [*first, _tc({"number": 10})], _tc({"number": 10}))
    q = "Play Taylor Swift and Maroon 5 for 20 minutes each."
    swift = [_tc({"artist": "Taylor Swift", "minutes": 20})]
    assert adds_coverage(q, swift, _tc({"artist": "maroon 5", "minutes": 20}))  # a string of the question, new
    assert not adds_coverage(q, swift, _tc({"artist": "Taylor Swift", "minutes": 15}))  # 15 is not the question's
    assert not adds_coverage(q, swift, _tc({"artist": "Adele", "minutes": 20}))  # a string the question lacks


@pytest.fixture(scope="module")
def compiler(tokenizer):
    return compiler_for(tokenizer)


def _accepts(compiler, grammar: str, text: str) -> bool:
    from structgen.constraints.spec import GrammarSpec

    m = compiler.compile(GrammarSpec(grammar=grammar)).matcher()
    ids = m.tokenize_bytes(text.encode())
    if m.validate_tokens(ids) != len(ids):
        return False
    m.consume_many(ids)
    return bool(m.is_accepting() or m.is_stopped())


def test_the_forced_stage_writes_a_call_and_never_ends_the_block(compiler):
    forced = tool_grammar(INJECTED, [factorial], mode="required", max_calls=1, stage="more")
    free = tool_grammar(INJECTED, [factorial], mode="required", max_calls=1, stage="next")
    assert _accepts(compiler, forced, ", " + _call(10)) and _accepts(compiler, free, ", " + _call(10))
    assert not _accepts(compiler, forced, END) and _accepts(compiler, free, END)


def test_a_steered_tool_must_put_an_owed_number_in_one_numeric_argument():
    s = steered(factorial, {10.0, 15.0})
    assert s.name == "factorial" and s.parameters["properties"]["number"]["enum"] == [10, 15, -10, -15]
    assert s.parameters["required"] == ["number"]
    assert steered(factorial, {2.5}) is factorial  # an integer argument takes no 2.5
    assert steered(factorial, set()) is factorial and steered(note, {10.0}) is note  # nothing to steer
    e = steered(em_force, {2.5, 10.0}).parameters
    assert [list(v["properties"]) for v in e["anyOf"]] == [["b_field", "area", "d_time", "label"]] * 3
    assert [v["properties"][p]["enum"] for v, p in zip(e["anyOf"], ["b_field", "area", "d_time"], strict=True)] \
        == [[2.5, 10, -2.5, -10], [2.5, 10, -2.5, -10], [10, -10]]
    assert all(v["required"] == ["b_field", "area", "d_time"] for v in e["anyOf"])
    assert "enum" not in em_force.parameters["properties"]["d_time"]  # the tool itself is unchanged
    bounded = Tool(name="bounded", description="",
                   parameters={"type": "object", "properties": {"n": {"type": "integer", "minimum": 11}}})
    assert steered(bounded, {10.0, 15.0}).parameters["properties"]["n"]["enum"] == [15]  # limits kept
    assert steered(bounded, {0.0, 12.0}).parameters["properties"]["n"]["enum"] == [12]


def test_the_steered_stage_refuses_a_repeat_and_numbers_not_owed(compiler):
    spec = ToolRequest.make([factorial, note, em_force], tool_choice="required", parallel=True).resolve(
        None, max_tokens=400)
    stage = next_stage(spec, remaining=300, calls_done=1, force=True, steer={10.0, 15.0})
    assert stage is not None

    def em(b: float, a: float, t: int) -> str:
        return INJECTED.call_json("em_force", {"b_field": b, "area": a, "d_time": t})

    for text, ok in [(_call(10), True), (_call(15), True), (_call(5), False), (_call(7), False),
                     (_note("ten"), True),  # a tool with no numeric argument is offered as it is
                     (em(5, 2, 10), True), (em(15, 2, 4), True), (em(5, 2, 4), False),  # one of its three
                     (_call(-10), True)]:  # either sign: coverage reads numbers sign aside
        assert _accepts(compiler, stage.grammar, ", " + text) is ok, text
    assert not _accepts(compiler, stage.grammar, END)
    free = next_stage(spec, remaining=300, calls_done=1, force=False, steer={10.0})
    assert free is not None and _accepts(compiler, free.grammar, ", " + _call(5))  # steering only when forced


def test_a_forced_call_is_tried_where_one_more_does_not_fit_at_its_longest(compiler):
    spec = ToolRequest.make([factorial], tool_choice="required", parallel=True).resolve(None, max_tokens=400)
    block = block_chars(INJECTED)
    floor = longest_call(INJECTED, [factorial], CALL_FLOOR, lean=True)
    short = block + 1 + len(INJECTED.separator) + int(floor) - 5  # a floor call does not fit
    assert next_stage(spec, remaining=short, calls_done=1, force=False) is None  # the model's choice: the end
    tried = next_stage(spec, remaining=short, calls_done=1, force=True, steer={10.0})
    assert tried is not None  # coverage asks: the call is tried, planned at the floor
    assert _accepts(compiler, tried.grammar, ", " + _call(10)) and not _accepts(compiler, tried.grammar, END)
    assert not _accepts(compiler, tried.grammar, ", " + _call(5))  # still steered
    # no room at all for one more call's text: not even tried
    assert next_stage(spec, remaining=block + 1 + len(INJECTED.separator), calls_done=1, force=True,
                      steer={10.0}) is None


@sg.program
def factorials(s, question, choice="required", tools=(factorial,)):
    s += sg.use_tools(list(tools))
    s += sg.user(question)
    s += sg.assistant(sg.gen("turn", tools=list(tools), tool_choice=choice, parallel_tool_calls=True,
                             max_tokens=160))


def scripted(compiler, pieces, stages):
    """Writes ``pieces`` in turn, each checked against its request's grammar; ``stages``
    collects whether each request could end the block (``"next"``) or had to call (``"more"``)."""
    queue = list(pieces)

    def respond(req):
        piece = queue.pop(0)
        grammar = req.constraint.grammar
        if len(stages) or not piece.startswith("<tool_call>"):
            stages.append("next" if _accepts(compiler, grammar, END) else "more")
        m = compiler.compile(req.constraint).matcher()
        ids = m.tokenize_bytes(piece.encode())
        assert m.validate_tokens(ids) == len(ids), (piece, grammar)
        return GenerateResult(text=piece, meta={"completion_tokens": len(ids)})
    return respond


def test_uncovered_numbers_ask_for_one_more_call_until_all_are_used(compiler):
    stages: list[str] = []
    pieces = ["<tool_call>[" + _call(5), ", " + _call(10), ", " + _call(15), END]
    fb = FakeBackend(responder=scripted(compiler, pieces, stages))
    st = factorials.run(question=QUESTION, backend=fb)
    st.raise_if_failed()
    assert stages == ["more", "more", "next"]  # 10 and 15 owed, then the model's own choice
    assert [c.raw_arguments["number"] for c in st.tool_calls("turn")] == [5, 10, 15]
    assert "dropped_calls" not in st.get_meta_info("turn")


@pytest.mark.parametrize("second", [_note("ten"), _note("factorials")])  # strings the question lacks
def test_a_forced_call_that_adds_no_coverage_is_dropped_and_never_streamed(compiler, tokenizer, second):
    stages: list[str] = []
    fb = FakeBackend(responder=scripted(compiler, ["<tool_call>[" + _call(5), ", " + second], stages))
    st = factorials.run(question=QUESTION, backend=fb, stream=True, tools=(factorial, note))
    streamed = "".join(st.text_iter())
    st.raise_if_failed()
    assert stages == ["more"] and len(fb.requests) == 2
    assert st["turn"] == "<tool_call>[" + _call(5) + END  # the block ends before the dropped call
    assert [c.raw_arguments["number"] for c in st.tool_calls("turn")] == [5]
    meta = st.get_meta_info("turn")
    assert meta["dropped_calls"] == [", " + second] and meta["finish_reason"] == "stop"
    assert second not in streamed.split(_call(5), 1)[1] and streamed == st.text()
    # the turn's tokens are the kept text's; the dropped stage is counted as a stage
    assert meta["completion_tokens"] == len(tokenizer.encode("<tool_call>[" + _call(5), add_special_tokens=False))
    assert meta["tool_stages"] == 2


def test_a_tried_call_cut_by_the_tokens_left_is_dropped(compiler, tokenizer):
    first = "<tool_call>[" + _call(5)
    block = block_chars(INJECTED)
    left = block + 1 + len(INJECTED.separator) + 10  # fewer than a floor call of factorial takes
    budgets: list[int] = []
    cuts: list[str] = []

    def respond(req):
        budgets.append(req.params.max_new_tokens)
        if len(budgets) == 1:  # the first call, counted as taking all but ``left`` tokens
            return GenerateResult(text=first, meta={"completion_tokens": 160 - left})
        assert not _accepts(compiler, req.constraint.grammar, END)  # coverage's call, not the end
        m = compiler.compile(req.constraint).matcher()
        piece = ", " + _call(10)
        ids = m.tokenize_bytes(piece.encode())
        ids = ids[: min(len(ids) // 2, req.params.max_new_tokens)]  # the tokens ran out inside the call
        assert m.validate_tokens(ids) == len(ids)
        cuts.append(tokenizer.decode(ids))
        return GenerateResult(text=cuts[-1], finish_reason="length", meta={"completion_tokens": len(ids)})

    st = factorials.run(question=QUESTION, backend=FakeBackend(responder=respond))
    st.raise_if_failed()
    assert budgets == [160, left]  # the tried stage is sent with the tokens really left
    assert st["turn"] == first + END and [c.raw_arguments["number"] for c in st.tool_calls("turn")] == [5]
    meta = st.get_meta_info("turn")
    assert meta["finish_reason"] == "stop" and meta["dropped_calls"] == cuts and len(cuts) == 1
    assert meta["completion_tokens"] == 160 - left and meta["tool_stages"] == 2


def test_coverage_off_leaves_the_choice_to_the_model(compiler):
    stages: list[str] = []
    fb = FakeBackend(responder=scripted(compiler, ["<tool_call>[" + _call(5), END], stages))
    st = factorials.run(question=QUESTION, choice={"mode": "required", "coverage": False}, backend=fb)
    st.raise_if_failed()
    assert stages == ["next"] and len(st.tool_calls("turn")) == 1
    with pytest.raises(ProgramError, match="coverage"):
        ToolRequest.make([factorial], tool_choice={"coverage": "yes"})
    committed = ToolRequest.make([factorial], tool_choice={"mode": "auto", "coverage": False}).committed()
    assert committed.choice() == {"mode": "required", "allowed": ["factorial"], "coverage": False}


def test_one_call_turns_and_questions_without_numbers_are_not_forced(compiler):
    stages: list[str] = []
    fb = FakeBackend(responder=scripted(compiler, ["<tool_call>[" + _call(5), END], stages))
    st = factorials.run(question="Find some factorials.", backend=fb)
    st.raise_if_failed()
    assert stages == ["next"]


def test_on_the_real_model_every_kept_call_is_new(embedded_backend):
    questions = [QUESTION, "Factorials of 3 and 4, please.", "What is the factorial of 6, 7, 8 and 9?"]
    states = factorials.run_batch([{"question": q} for q in questions], backend=embedded_backend)
    for q, st in zip(questions, states, strict=True):
        st.raise_if_failed()
        calls = st.tool_calls("turn")
        meta = st.get_meta_info("turn")
        assert len(calls) >= 1 and st["turn"].endswith(END) and meta["completion_tokens"] <= 160
        # while numbers were owed the next call was forced, and it stood only if it added coverage
        for i in range(1, len(calls)):
            if uncovered(q, calls[:i]):
                assert adds_coverage(q, calls[:i], calls[i]), (q, [c.key() for c in calls])
        for dropped in meta.get("dropped_calls", []):  # only ever after a call that left numbers owed
            assert dropped.startswith(", ") and '"name": "factorial"' in dropped and uncovered(q, calls)
