"""Items 5-6: the agent loop on a scripted backend (the interpreter's unit tests).

The fake backend plays the model: its outputs are scripted tool-call turns in the
injected ``structgen`` format. What is asserted is the loop's behaviour -- which tools
ran, with which arguments, what the model was shown, when it stopped.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from pydantic import BaseModel

import structgen as sg
from structgen.backends.fake import FakeBackend
from structgen.contract.backend import Capabilities, GenerateResult
from structgen.errors import CapabilityError, OutputValidationError, ProgramError
from structgen.tools import ToolExecutor
from structgen.tools.calls import ToolCall
from structgen.tools.formats import INJECTED

RAN: list[tuple[str, dict]] = []


@sg.tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    RAN.append(("add", {"a": a, "b": b}))
    return a + b


@sg.tool
def fail(x: int) -> int:
    """Always fails."""
    RAN.append(("fail", {"x": x}))
    raise RuntimeError("disk on fire")


def call(*calls):
    return INJECTED.render_calls(list(calls))


def agent_program(tools, **loop):
    @sg.program
    def agent(s, question):
        s += sg.use_tools(tools)
        s += sg.system("You are an agent.")
        s += sg.user(question)
        sg.run_tools(s, tools, **loop)

    return agent


@pytest.fixture(autouse=True)
def _clear():
    RAN.clear()


def test_loop_runs_calls_shows_results_and_records_steps():
    be = FakeBackend([call(("add", {"a": 2, "b": 3}), ("add", {"a": 1, "b": 1})), "The sum is 5."])
    st = agent_program([add]).run(question="2+3?", backend=be)
    assert RAN == [("add", {"a": 2, "b": 3}), ("add", {"a": 1, "b": 1})]
    assert st["agent"] == "The sum is 5."
    res = st.value("agent")
    assert res.stopped == "answer" and len(res.steps) == 2
    first = res.steps[0]
    assert [(c.tool, c.arguments, c.result, c.error) for c in first.calls] == [
        ("add", {"a": 2, "b": 3}, 5, None), ("add", {"a": 1, "b": 1}, 2, None)]
    assert all(c.duration_s >= 0 for c in first.calls)
    second_prompt = be.requests[1].prompt
    assert "<tools>" in second_prompt and '"name": "add"' in second_prompt  # the tool block, once
    assert second_prompt.count("<|tool|>") == 2  # both results in the template's tool role
    msgs = st.messages()
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    assert msgs[3]["content"] == "5" and msgs[3]["tool_call_id"] == res.steps[0].calls[0].id
    assert st.tool_calls("agent_0")[0].arguments.a == 2


def test_a_raising_tool_becomes_an_error_result_the_model_sees():
    be = FakeBackend([call(("fail", {"x": 1})), "Sorry."])
    st = agent_program([add, fail]).run(question="?", backend=be)
    rec = st.value("agent").steps[0].calls[0]
    assert rec.error == "RuntimeError: disk on fire" and rec.result is None
    assert json.dumps({"error": "RuntimeError: disk on fire"}) in be.requests[1].prompt
    assert st["agent"] == "Sorry."


def test_loop_guard_stops_a_repeated_identical_call():
    be = FakeBackend([call(("add", {"a": 1, "b": 2}))] * 3)
    st = agent_program([add]).run(question="?", backend=be)
    res = st.value("agent")
    assert res.stopped == "loop_guard" and RAN == [("add", {"a": 1, "b": 2})]  # the repeat never ran
    assert st["agent"] == ""
    repeat = res.steps[1].calls[0]  # recorded, marked as not run
    assert repeat.tool == "add" and repeat.result is None and repeat.error == "not run (loop_guard)"


def test_a_turn_cut_by_max_tokens_runs_its_whole_calls():
    text = call(("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": 4}))
    cut = GenerateResult(text=text[:text.rindex('"b"')], finish_reason="length")
    be = FakeBackend([cut, "Done."])
    st = agent_program([add]).run(question="?", backend=be)
    res = st.value("agent")
    assert RAN == [("add", {"a": 1, "b": 2})] and res.stopped == "answer" and st["agent"] == "Done."
    assert st.value("agent_0").truncated and [c.tool for c in res.steps[0].calls] == ["add"]
    early = GenerateResult(text=text[:text.index('"b"')], finish_reason="length")
    with pytest.raises(OutputValidationError):  # cut inside the first call: nothing to run
        agent_program([add]).run(question="?", backend=FakeBackend([early]))


def test_step_call_and_time_limits():
    be = FakeBackend([call(("add", {"a": i, "b": 0})) for i in range(5)])
    assert agent_program([add], max_steps=2).run(question="?", backend=be).value("agent").stopped == "max_steps"
    assert len(RAN) == 2
    RAN.clear()
    be = FakeBackend([call(("add", {"a": 1, "b": 0}), ("add", {"a": 2, "b": 0})), call(("add", {"a": 3, "b": 0}))])
    res = agent_program([add], max_calls=2).run(question="?", backend=be).value("agent")
    assert res.stopped == "max_calls" and len(RAN) == 2 and res.steps[-1].calls[0].error == "not run (max_calls)"
    be = FakeBackend([call(("add", {"a": 1, "b": 0}))])
    res = agent_program([add], max_seconds=0.0).run(question="?", backend=be).value("agent")
    assert res.stopped == "max_seconds" and len(RAN) == 2


def test_a_model_tool_is_the_final_answer():
    class Final(BaseModel):
        value: int

    be = FakeBackend([call(("Final", {"value": 7}))])
    res = agent_program([add, Final]).run(question="?", backend=be).value("agent")
    assert res.stopped == "final_tool" and isinstance(res.final, Final) and res.final.value == 7


def test_executor_runs_only_registered_tools_with_timeouts_concurrently():
    barrier = threading.Barrier(2, timeout=20)

    @sg.tool
    def meet(n: int) -> int:
        """Both calls must be running at once to pass the barrier."""
        barrier.wait()
        return n

    gate = {"count": 0}

    @sg.tool
    async def ameet(n: int) -> int:
        """Async: both wait for each other on the event loop."""
        gate["count"] += 1
        while gate["count"] < 2:
            await asyncio.sleep(0.001)
        return n

    @sg.tool(timeout=0.05)
    def slow(n: int) -> int:
        """Sleeps past its timeout."""
        time.sleep(1.0)
        return n

    @sg.tool(timeout=0.05)
    async def aslow(n: int) -> int:
        """Sleeps past its timeout."""
        await asyncio.sleep(5)
        return n

    def c(name, **args):
        return ToolCall(id=name, name=name, arguments=args, raw_arguments=args, raw="")

    with ToolExecutor([meet, ameet, slow, aslow]) as ex:
        out = ex.run([c("meet", n=1), c("meet", n=2), c("ameet", n=3), c("ameet", n=4)])
        assert [r.value for r in out] == [1, 2, 3, 4] and all(r.ok for r in out)
        out = ex.run([c("slow", n=1), c("aslow", n=1), c("rm_rf", path="/")])
        assert "timed out" in out[0].error and "timed out" in out[1].error
        assert out[2].error == "unknown tool 'rm_rf'"


def test_forks_run_parallel_sub_agents_in_batches():
    def responder(req):
        q = req.messages[1].content
        if req.messages[-2].role == "tool":
            return f"done {q}"
        return call(("add", {"a": len(q), "b": 1}))

    be = FakeBackend(responder=responder)

    @sg.program
    def team(s, questions):
        s += sg.use_tools([add])
        s += sg.system("Sub-agents.")
        forks = s.fork(len(questions))
        forks += lambda i: sg.user(questions[i])
        results = sg.run_tools(forks, [add])
        s["answers"] = [r.answer for r in results]

    st = team.run(questions=["a", "bb", "ccc"], backend=be)
    assert st["answers"] == ["done a", "done bb", "done ccc"]
    assert sorted(r[1]["a"] for r in RAN) == [1, 2, 3]
    assert be.batches[:2] == [3, 3]  # each step of the three sub-agents went out as one batch


def test_program_called_as_a_tool_runs_on_the_callers_backend():
    @sg.program
    def shout(s, word: str):
        """Shout a word."""
        s += sg.user("Shout " + word)
        s += sg.assistant(sg.gen("answer", max_tokens=8))

    def responder(req):
        if req.variable == "answer":
            return "HEY"
        if req.messages[-2].role == "tool":
            return "It said HEY."
        return call(("shout", {"word": "hey"}))

    be = FakeBackend(responder=responder)
    st = agent_program([shout]).run(question="shout hey", backend=be)
    rec = st.value("agent").steps[0].calls[0]
    assert rec.tool == "shout" and rec.result == "HEY" and st["agent"] == "It said HEY."


def test_capability_error_before_sending_and_undeclared_tools():
    plain = FakeBackend(["x"], capabilities=Capabilities(json_schema=True))
    with pytest.raises(CapabilityError):
        agent_program([add]).run(question="?", backend=plain)
    assert plain.requests == []

    @sg.program
    def undeclared(s):
        s += sg.user("hi")
        s += sg.assistant(sg.gen("x", tools=[add]))

    with pytest.raises(ProgramError, match="use_tools"):
        undeclared.run(backend=FakeBackend(["x"]))
