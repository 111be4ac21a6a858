"""Items 2, 4, 6 on the real SmolLM2-135M (embedded backend, injected ``structgen`` format).

Structure only: every turn parses, every call names an allowed tool with valid arguments,
bounds hold; and a batch of agent runs computes its shared system prompt and tool block
exactly once (exact cache counters, as the engine's prefix tests check).
"""

from __future__ import annotations

from typing import Literal

import pytest

import structgen as sg
from structgen.lang.tracer import trace_first_prompt
from structgen.tools.formats import detect_format

pytestmark = pytest.mark.model


@sg.tool
def convert(value: float, unit: Literal["km", "mi"]) -> float:
    """Convert a distance to metres."""
    return value * (1000.0 if unit == "km" else 1609.344)


@sg.tool
def capital(country: str) -> str:
    """The capital of a country."""
    return {"France": "Paris"}.get(country, "unknown")


TOOLS = [convert, capital]


@sg.program
def ask(s, question, budget=64, **gen):
    s += sg.use_tools(TOOLS)
    s += sg.system("You are a helpful assistant.")
    s += sg.user(question)
    s += sg.assistant(sg.gen("turn", tools=TOOLS, max_tokens=budget, **gen))


def test_smollm2_gets_the_injected_format(embedded_backend):
    assert detect_format(embedded_backend.chat_template()).name == "structgen"


@pytest.mark.parametrize("gen", [
    {"tool_choice": "required"},
    {"tool_choice": "required", "parallel_tool_calls": 2},
    {"tool_choice": "capital"},
    {"tool_choice": {"allowed": ["convert"], "mode": "required"}},
    {"tool_choice": "auto", "parallel_tool_calls": True},
    {"tool_choice": "none"},
    {"tool_choice": "required", "think": {"tags": ("<think>", "</think>"), "max_chars": 60}, "budget": 128},
], ids=["required", "k2", "named", "allowed", "auto", "none", "think"])
def test_every_turn_is_valid(embedded_backend, gen):
    st = ask.run(question="How many metres is 3 km, and what is the capital of France?", backend=embedded_backend,
                 **gen)
    turn = st.value("turn")
    calls = st.tool_calls("turn")
    choice = gen["tool_choice"]
    gen.pop("budget", None)
    k = {False: 1, True: 16}.get(gen.get("parallel_tool_calls", False), gen.get("parallel_tool_calls"))
    if choice == "none":
        assert calls == [] and "<tool_call>" not in st["turn"]
    elif choice != "auto":
        assert 1 <= len(calls) <= k
    if choice == "capital":
        assert {c.name for c in calls} == {"capital"}
    if isinstance(choice, dict):
        assert {c.name for c in calls} == {"convert"}
    for c in calls:
        assert type(c.arguments).__name__ in ("ConvertArgs", "CapitalArgs")  # typed arguments
        assert c.name in ("convert", "capital") and c.raw in st["turn"]
    if gen.get("think"):
        assert st["turn"].startswith("<think>") and turn.thinking is not None
        assert st.get_meta_info("turn")["thinking"] == turn.thinking
    meta = st.get_meta_info("turn")
    assert meta["tool_calls"] == [{"id": c.id, "name": c.name, "arguments": c.raw_arguments} for c in calls]


def test_thinking_then_a_json_schema(embedded_backend):
    @sg.program
    def rate(s):
        s += sg.user("Rate the movie Alien from 1 to 5.")
        s += sg.assistant(sg.gen("r", json_schema={"type": "object", "properties": {"stars": {"enum": [1, 2, 3, 4, 5]}},
                                                   "required": ["stars"], "additionalProperties": False},
                                 think={"tags": ("<think>", "</think>"), "max_chars": 40}, max_tokens=64))

    st = rate.run(backend=embedded_backend)
    assert st["r"].startswith("<think>") and st.value("r")["stars"] in (1, 2, 3, 4, 5)
    assert isinstance(st.get_meta_info("r")["thinking"], str)


def test_agent_loop_records_cached_and_computed_tokens(embedded_backend):
    agent = sg.Agent(TOOLS, system="Use the tools.", max_steps=2, tool_choice="required", parallel_tool_calls=False)
    st = agent.run("What is the capital of France?", backend=embedded_backend)
    res = st.value("answer")
    assert res.stopped in ("max_steps", "loop_guard")
    for step in res.steps:
        assert 0 <= step.cached_tokens <= step.prompt_tokens
        assert step.computed_tokens >= step.prompt_tokens - step.cached_tokens  # uncached prompt + generated
        assert len(step.calls) == 1
    assert res.steps[1].cached_tokens >= res.steps[0].prompt_tokens  # the second turn reuses the first's KV


def _delta(backend, before):
    after = backend.stats()
    return {k: after[k] - before[k] for k in ("prompt_tokens", "cached_tokens", "computed_tokens")}


def test_a_batch_of_agents_computes_the_system_prompt_and_tool_block_once(embedded_backend):
    be = embedded_backend
    agent = sg.Agent(TOOLS, system="You answer with the tools.", max_steps=1, tool_choice="required",
                     parallel_tool_calls=False, max_tokens=64)
    countries = ["France", "Japan", "Kenya", "Peru", "Chile", "Spain"]
    items = [{"question": f"{c}: which capital?"} for c in countries]
    prefix = agent.program.shared_prefix(items, backend=be)
    assert "<tools>" in prefix and "You answer with the tools." in prefix  # system prompt + tool block
    prefix_ids = be.encode(prefix)
    prompt_ids = [be.encode(trace_first_prompt(agent.program, it, be)) for it in items]
    assert all(ids[:len(prefix_ids)] == prefix_ids for ids in prompt_ids)
    assert len({ids[len(prefix_ids)] for ids in prompt_ids}) == len(items)  # items differ right after it
    be.clear_prefix_cache()
    before = be.stats()
    states = agent.program.run_batch(items, backend=be)
    assert all(st.error() is None for st in states)
    d = _delta(be, before)
    own = sum(len(ids) - len(prefix_ids) for ids in prompt_ids)
    assert d["computed_tokens"] == len(prefix_ids) + own  # the shared block once, then each item's own
    assert d["cached_tokens"] == len(items) * len(prefix_ids)
    assert d["prompt_tokens"] == len(prefix_ids) + sum(len(ids) for ids in prompt_ids)
