"""Item 7 without a live engine: what each server backend is sent for gen(tools=...).

OpenAI-compatible chat routes get their native ``tools`` / ``tool_choice`` / ``strict`` /
``parallel_tool_calls`` and the calls that come back are validated; vLLM gets the Lark
grammar in ``structured_outputs`` (>= 0.10.2) or a CapabilityError before sending;
llama.cpp gets GBNF (checked here by compiling it with llguidance's GBNF reader against
the real tokenizer); SGLang gets ``ebnf`` (Lark) only from an llguidance grammar backend.
"""

from __future__ import annotations

import json
from typing import Literal

import pytest

import structgen as sg
from structgen.backends.openai import OpenAIBackend
from structgen.errors import CapabilityError, OutputValidationError
from tests.backend_fakes import Recorder


@sg.tool
def lookup(city: str, unit: Literal["C", "F"] = "C") -> str:
    """Look up the weather."""
    return f"{city}: 20{unit}"


@sg.tool
def flag(on: bool) -> bool:
    """Set a flag."""
    return on


TOOLS = [lookup, flag]


@sg.program
def agent(s, **gen):
    s += sg.use_tools(TOOLS)
    s += sg.user("Weather in Oslo?")
    s += sg.assistant(sg.gen("turn", tools=TOOLS, max_tokens=64, **gen))


def openai_with(calls_by_turn):
    turns = iter(calls_by_turn)

    def answer(payload):
        calls = next(turns)
        msg = {"content": None if calls else "It is 20C.", "tool_calls": [
            {"id": f"srv{i}", "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(calls)] or None}
        return {"choices": [{"message": msg, "finish_reason": "tool_calls" if calls else "stop"}]}

    rec = Recorder({"POST /v1/chat/completions": answer})
    return OpenAIBackend("http://127.0.0.1:9", model="m", max_retries=0, **rec.transports()), rec


def test_openai_native_tools_payload_and_validated_calls():
    be, rec = openai_with([[("lookup", '{"city": "Oslo", "unit": "C"}')]])
    st = agent.run(backend=be, tool_choice="required", parallel_tool_calls=2)
    [p] = rec.payloads("/v1/chat/completions")
    assert [t["function"]["name"] for t in p["tools"]] == ["lookup", "flag"]
    assert p["tool_choice"] == "required" and p["parallel_tool_calls"] is True
    assert "strict" not in p["tools"][0]["function"]  # an optional argument: not OpenAI-strict
    assert p["tools"][1]["function"]["strict"] is True
    assert "response_format" not in p
    [c] = st.tool_calls("turn")
    assert c.name == "lookup" and c.arguments.city == "Oslo"


def test_openai_tool_choice_shapes():
    for choice, expect in (("flag", {"type": "function", "function": {"name": "flag"}}), ("none", "none"),
                           ({"allowed": ["lookup"]}, "auto")):
        be, rec = openai_with([[("flag", '{"on": false}')] if choice == "flag" else []])
        agent.run(backend=be, tool_choice=choice)
        [p] = rec.payloads("/v1/chat/completions")
        assert p["tool_choice"] == expect
        if isinstance(choice, dict):
            assert [t["function"]["name"] for t in p["tools"]] == ["lookup"]


def test_openai_invalid_calls_fail_validation():
    for calls in ([("delete_all", "{}")], [("lookup", '{"city": 3}')], [("flag", '{"on": true}')] * 2):
        be, _ = openai_with([calls])
        with pytest.raises(OutputValidationError):
            agent.run(backend=be, tool_choice="auto")


def test_openai_loop_sends_tool_calls_and_tool_messages_back():
    be, rec = openai_with([[("lookup", '{"city": "Oslo"}')], []])

    @sg.program
    def loop(s):
        s += sg.use_tools(TOOLS)
        s += sg.user("Weather in Oslo?")
        sg.run_tools(s, TOOLS)

    st = loop.run(backend=be)
    assert st["agent"] == "It is 20C."
    second = rec.payloads("/v1/chat/completions")[1]["messages"]
    assert [m["role"] for m in second] == ["user", "assistant", "tool"]
    call = second[1]["tool_calls"][0]
    assert call["function"]["name"] == "lookup" and json.loads(call["function"]["arguments"]) == {"city": "Oslo"}
    assert second[2]["tool_call_id"] == call["id"] and second[2]["content"] == "Oslo: 20C"


def test_openai_thinking_is_a_capability_error_before_sending():
    be, rec = openai_with([[]])
    with pytest.raises(CapabilityError, match="thinking"):
        agent.run(backend=be, think=True)
    assert rec.payloads("/v1/chat/completions") == []


def _vllm(version):
    from structgen.backends.embedded.loader import resolve_model_dir
    from structgen.backends.vllm import VLLMBackend

    rec = Recorder({"GET /version": {"version": version},
                    "GET /v1/models": {"data": [{"id": "m", "root": "/nonexistent"}]},
                    "POST /v1/completions": {"choices": [{
                        "text": '<tool_call>[{"name": "flag", "arguments": {"on": true}}]</tool_call>',
                        "finish_reason": "stop"}]}})
    return VLLMBackend("http://127.0.0.1:9", max_retries=0, tokenizer=resolve_model_dir(), **rec.transports()), rec


def test_vllm_gets_the_grammar_and_old_vllm_a_capability_error():
    be, rec = _vllm("0.32.0")
    st = agent.run(backend=be, tool_choice="required")
    [p] = rec.payloads("/v1/completions")
    grammar = p["structured_outputs"]["grammar"]
    assert "%json" in grammar and '\\"name\\": \\"lookup\\"' in grammar
    assert "<tools>" in p["prompt"]  # the injected tool block (SmolLM2's template has no tools)
    assert st.tool_calls("turn")[0].arguments.on is True
    old, rec = _vllm("0.9.2")
    with pytest.raises(CapabilityError):
        agent.run(backend=old, tool_choice="required")
    assert rec.payloads("/v1/completions") == []


def test_sglang_needs_an_llguidance_grammar_backend():
    from structgen.backends.sglang import SGLangBackend
    from structgen.contract.backend import GenerateRequest
    from structgen.tools.formats import INJECTED
    from structgen.tools.spec import build_spec

    spec = build_spec(TOOLS, INJECTED, tool_choice="required")
    rec = Recorder({"/get_server_info": {"version": "0.5", "grammar_backend": "xgrammar"}})
    xg = SGLangBackend("http://127.0.0.1:9", max_retries=0, **rec.transports())
    with pytest.raises(CapabilityError):
        xg.check_generate(GenerateRequest(prompt="p", constraint=spec))
    rec = Recorder({"/get_server_info": {"version": "0.5", "grammar_backend": "llguidance"}})
    llg = SGLangBackend("http://127.0.0.1:9", max_retries=0, **rec.transports())
    llg.check_generate(GenerateRequest(prompt="p", constraint=spec))
    assert llg.build_payload(GenerateRequest(prompt="p", constraint=spec))["sampling_params"]["ebnf"] == spec.grammar


@pytest.mark.parametrize("mode", ["auto", "required"])
def test_llamacpp_gbnf_accepts_valid_calls_only(mode, tokenizer):
    import llguidance
    from llguidance.gbnf_to_lark import gbnf_to_lark

    from structgen.backends.llamacpp.adapter import grammar_for
    from structgen.constraints.engines.llguidance import llguidance_tokenizer
    from structgen.tools.formats import INJECTED
    from structgen.tools.spec import build_spec

    spec = build_spec(TOOLS, INJECTED, tool_choice=mode, parallel=2)
    gbnf = grammar_for(spec)
    lark = gbnf_to_lark(gbnf)
    lt = llguidance_tokenizer(tokenizer)
    grammar = llguidance.LLMatcher.grammar_from_lark(lark)

    def ok(text):
        m = llguidance.LLMatcher(lt, grammar, log_level=0)
        ids = tokenizer(text, add_special_tokens=False).input_ids
        return m.validate_tokens(ids) == len(ids) and (m.consume_tokens(ids) or True) and m.is_accepting()

    good = INJECTED.render_calls([("flag", {"on": True}), ("lookup", {"city": "Oslo"})])
    assert ok(good.replace(", ", ",").replace(": ", ":").replace('{"name":', '{"name": ').replace(
        ',"arguments":', ', "arguments": ').replace('},{"name', '}, {"name'))
    assert not ok(INJECTED.render_calls([("drop", {})]))
    assert not ok("Sunny.")  # the injected format's auto opens the call block first
    assert ok("<tool_call>[]</tool_call>Sunny.") is (mode == "auto")
    assert ok("<tool_call>[]</tool_call>") is (mode == "auto")
