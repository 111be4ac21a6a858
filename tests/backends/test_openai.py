"""Generic OpenAI-compatible servers: response_format json_schema (strict), no regex/grammar."""

from __future__ import annotations

import json

import pytest

from structgen.backends.openai import OpenAIBackend
from structgen.constraints.spec import (
    ChoiceSpec,
    GrammarSpec,
    RegexSpec,
    json_schema_spec,
)
from structgen.contract.backend import GenerateRequest, Message, SamplingParams, SelectRequest
from structgen.errors import CapabilityError, OutputValidationError
from tests.backend_fakes import Recorder

SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"],
          "additionalProperties": False}


def _chat(payload):
    rf = payload.get("response_format") or {}
    if rf.get("json_schema", {}).get("name") == "choice":
        enum = rf["json_schema"]["schema"]["properties"]["choice"]["enum"]
        content = json.dumps({"choice": enum[-1]}, separators=(",", ":"))
    else:
        content = '{"a":"b"}'
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "finish_reason": "stop"}], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}


def backend() -> tuple[OpenAIBackend, Recorder]:
    rec = Recorder({"GET /v1/models": {"data": [{"id": "gpt-x"}]}, "POST /v1/chat/completions": _chat})
    return OpenAIBackend("http://127.0.0.1:9", api_key="sk-test", max_retries=0, **rec.transports()), rec


def test_json_schema_goes_into_strict_response_format():
    b, rec = backend()
    msgs = (Message("system", "S"), Message("user", "U"), Message("assistant", ""))
    [res] = b.generate([GenerateRequest(prompt="ignored", messages=msgs, constraint=json_schema_spec(SCHEMA),
                                        params=SamplingParams(max_new_tokens=20, temperature=0.2, seed=1))])
    [p] = rec.payloads("/v1/chat/completions")
    assert p["messages"] == [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert p["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "output", "schema": SCHEMA, "strict": True}}
    assert p["max_tokens"] == 20 and p["temperature"] == 0.2 and p["seed"] == 1 and p["model"] == "gpt-x"
    assert res.text == '{"a":"b"}'


def test_choices_become_a_strict_enum_and_are_unwrapped():
    b, _ = backend()
    [res] = b.generate([GenerateRequest(prompt="q", constraint=ChoiceSpec(("red", "blue")))])
    assert res.text == "blue" and res.meta["raw"] == '{"choice":"blue"}'
    [sel] = b.select([SelectRequest(prompt="q", choices=("red", "blue"))])
    assert sel.index == 1


@pytest.mark.parametrize("spec", [RegexSpec(r"\d+"), GrammarSpec('start: "a"')])
def test_regex_and_grammar_are_capability_errors_before_sending(spec):
    b, rec = backend()
    with pytest.raises(CapabilityError) as info:
        b.generate([GenerateRequest(prompt="q", constraint=spec)])
    assert info.value.backend == "openai" and info.value.version == "v1"
    assert rec.payloads("/v1/chat/completions") == []


@pytest.mark.parametrize("params", [SamplingParams(top_k=3), SamplingParams(min_p=0.1),
                                    SamplingParams(return_logprob=True), SamplingParams(stop_regex=("x",))])
def test_unhonoured_sampling_parameters_raise(params):
    b, rec = backend()
    with pytest.raises(CapabilityError, match="sampling"):
        b.generate([GenerateRequest(prompt="q", params=params)])
    assert rec.payloads("/v1/chat/completions") == []


def test_select_scoring_methods_and_prefill_raise():
    b, rec = backend()
    with pytest.raises(CapabilityError, match="scoring"):
        b.select([SelectRequest(prompt="q", choices=("a", "b"), method="token_length_normalized")])
    with pytest.raises(CapabilityError, match="prefill"):
        b.generate([GenerateRequest(prompt="q", messages=(Message("user", "u"), Message("assistant", "half")))])
    assert rec.payloads("/v1/chat/completions") == []


def test_bad_choice_answer_is_a_validation_error():
    rec = Recorder({"POST /v1/chat/completions": {"choices": [{"message": {"content": '{"choice":"x"}'},
                                                               "finish_reason": "stop"}]}})
    b = OpenAIBackend("http://127.0.0.1:9", model="m", max_retries=0, **rec.transports())
    [res] = b.generate([GenerateRequest(prompt="q", constraint=ChoiceSpec(("a", "b")))])
    assert isinstance(res, OutputValidationError) and res.raw == '{"choice":"x"}'


def test_tools_are_sent_and_tool_calls_returned():
    calls = [{"id": "c1", "type": "function", "function": {"name": "get", "arguments": '{"q":"x"}'}}]
    rec = Recorder({"POST /v1/chat/completions": {"choices": [{"message": {"content": None, "tool_calls": calls},
                                                               "finish_reason": "tool_calls"}]}})
    tool = {"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}
    b = OpenAIBackend("http://127.0.0.1:9", model="m", tools=[tool], tool_choice="auto", max_retries=0,
                      **rec.transports())
    [res] = b.generate([GenerateRequest(prompt="q")])
    assert res.meta["tool_calls"] == calls and res.text == ""
    [p] = rec.payloads("/v1/chat/completions")
    assert p["tools"] == [tool] and p["tool_choice"] == "auto"
