"""A server's malformed output is the server's failure, and output problems get retries=
(issue 13 item 6, server side).

Real local servers (tests/servers/misbehaving.py) answer each adapter's route with
non-string text (a number, null, a list, an object) where text belongs: the request fails
with a BackendError naming the field and quoting the body -- never a ProgramError blamed
on the program body -- and the other requests of the batch are unaffected. An output the
adapter itself finds invalid (llama.cpp's check, OpenAI's choice unwrap) is an
OutputValidationError with the raw text, re-sampled under ``retries=``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

import structgen as sg
from structgen.backends.llamacpp import LlamaCppBackend
from structgen.backends.openai import OpenAIBackend
from structgen.backends.openai.adapter import OpenAICompatBackend
from structgen.backends.sglang import SGLangBackend
from structgen.backends.triton import TritonBackend
from structgen.backends.vllm import VLLMBackend
from structgen.constraints.spec import ChoiceSpec
from structgen.contract.backend import Capabilities, GenerateRequest, GenerateResult
from structgen.errors import BackendError, OutputValidationError, ProgramError
from tests.servers.misbehaving import MisbehavingServer

BAD = [123, None, ["a", "b"], {"text": "a"}, 1.5, True]
BAD_IDS = ["int", "null", "list", "object", "float", "bool"]


def _vllm(url: str) -> VLLMBackend:
    return VLLMBackend(url, model="m", version="0.32.0", tokenizer="", max_retries=0)


def _openai(url: str) -> OpenAIBackend:
    return OpenAIBackend(url, model="m", version="v1", max_retries=0)


def _sglang(url: str) -> SGLangBackend:
    return SGLangBackend(url, model="m", version="0.5", grammar_backend="xgrammar", tokenizer="", max_retries=0)


def _triton(url: str) -> TritonBackend:
    return TritonBackend(url, model="m", version="2.51", flavor="tensorrtllm", tokenizer="", max_retries=0)


def _llamacpp(url: str) -> LlamaCppBackend:
    return LlamaCppBackend(url, model="m", version="b1", tokenizer="", max_retries=0)


# adapter, the body its route answers with ``value`` where the generated text belongs, the field
ROUTES = {
    "vllm": (_vllm, lambda v: {"choices": [{"text": v, "finish_reason": "stop"}]}, "choices[0].text"),
    "llamacpp": (_llamacpp, lambda v: {"choices": [{"text": v, "finish_reason": "stop"}]}, "choices[0].text"),
    "openai": (_openai, lambda v: {"choices": [{"message": {"role": "assistant", "content": v},
                                                "finish_reason": "stop"}]}, "choices[0].message.content"),
    "sglang": (_sglang, lambda v: {"text": v, "meta_info": {"finish_reason": {"type": "stop"}}}, "text"),
    "triton": (_triton, lambda v: {"model_name": "m", "text_output": v}, "text_output"),
}


def _prompt(payload: Any) -> str:
    if "messages" in payload:
        return str(payload["messages"][-1]["content"])
    return str(payload.get("prompt") or payload.get("text") or payload.get("text_input"))


@pytest.mark.parametrize("bad", BAD, ids=BAD_IDS)
@pytest.mark.parametrize("name", sorted(ROUTES))
def test_non_string_text_is_a_backend_error_that_fails_alone(name, bad):
    make, shape, field = ROUTES[name]

    def body(payload: Any, headers: dict[str, str]) -> Any:
        prompt = _prompt(payload)
        return shape(bad if prompt == "bad" else prompt.upper())

    with MisbehavingServer("json", body=body) as srv:
        b = make(srv.url)
        out = b.generate([GenerateRequest(prompt=p, variable=p) for p in ("ok", "bad", "fine")])
        b.close()
    assert isinstance(out[0], GenerateResult) and out[0].text == "OK"
    assert isinstance(out[2], GenerateResult) and out[2].text == "FINE"
    err = out[1]
    assert type(err) is BackendError and not err.retryable and err.variable == "bad", err
    assert field in str(err) and "not a string" in str(err)
    assert json.dumps(bad) in str(err)  # the raw body is quoted


@pytest.mark.parametrize("bad", [123, None, ["x"]], ids=["int", "null", "list"])
def test_a_program_sees_the_backend_blamed_not_its_body(bad):
    @sg.program
    def ask(s):
        s += "Q: " + sg.gen("answer", max_tokens=4)

    with MisbehavingServer("json", body={"choices": [{"text": bad, "finish_reason": "stop"}]}) as srv:
        b = _vllm(srv.url)
        with pytest.raises(sg.StructgenError) as info:
            ask.run(backend=b)
        b.close()
    err = info.value
    assert isinstance(err, BackendError) and not isinstance(err, ProgramError)
    assert err.variable == "answer" and "choices[0].text" in str(err) and "program body" not in str(err)


def test_null_content_is_allowed_only_beside_tool_calls_or_a_refusal():
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]

    def body(payload: Any, headers: dict[str, str]) -> Any:
        prompt = _prompt(payload)
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if prompt == "tool":
            message["tool_calls"] = calls
        elif prompt == "refuse":
            message["refusal"] = "I can't help with that"
        return {"choices": [{"message": message, "finish_reason": "stop"}]}

    with MisbehavingServer("json", body=body) as srv:
        b = _openai(srv.url)
        tool, refuse, empty = b.generate([GenerateRequest(prompt=p) for p in ("tool", "refuse", "none")])
        b.close()
    assert tool.text == "" and tool.meta["tool_calls"] == calls
    assert refuse.text == "" and refuse.meta["refusal"]
    assert isinstance(empty, BackendError) and "content is null" in str(empty)


@pytest.mark.parametrize("body", [
    {"choices": []},
    {"choices": ["text"]},
    {"choices": [{"message": "hello"}]},
    {"choices": [{"message": {"content": "x"}}], "usage": "lots"},
], ids=["no-choice", "choice-not-object", "message-not-object", "usage-not-object"])
def test_malformed_chat_bodies(body):
    with MisbehavingServer("json", body=body) as srv:
        b = _openai(srv.url)
        [out] = b.generate([GenerateRequest(prompt="p")])
        b.close()
    if "usage" in body:  # bookkeeping only: the text is still good
        assert isinstance(out, GenerateResult) and out.text == "x"
    else:
        assert type(out) is BackendError and "unexpected response" in str(out)


def test_sglang_meta_info_must_be_an_object():
    with MisbehavingServer("json", body={"text": "x", "meta_info": "done"}) as srv:
        b = _sglang(srv.url)
        [out] = b.generate([GenerateRequest(prompt="p")])
        b.close()
    assert type(out) is BackendError and "meta_info" in str(out)


def test_an_adapter_that_lets_non_text_through_is_caught_by_the_base():
    class Sloppy(OpenAICompatBackend):
        name = "sloppy"
        route = "completions"

        def _capabilities_for(self, version: str | None) -> Capabilities:
            return Capabilities()

        def parse_text(self, request: GenerateRequest, body: Any) -> GenerateResult:
            return GenerateResult(text=body["choices"][0]["text"])

    with MisbehavingServer("json", body={"choices": [{"text": 7}]}) as srv:
        b = Sloppy(srv.url, model="m", version="1", tokenizer="", max_retries=0)
        [out] = b.generate([GenerateRequest(prompt="p")])
        b.close()
    assert type(out) is BackendError and "int 7" in str(out)


# -- output problems found by an adapter: OutputValidationError, retried ------------------------
def _flaky(bad_text: str, good_text: str, shape: Any):
    """A body callable: the first answer is ``bad_text``, the later ones ``good_text``."""
    seen: list[Any] = []

    def body(payload: Any, headers: dict[str, str]) -> Any:
        seen.append(payload)
        return shape(bad_text if len(seen) == 1 else good_text)

    return body, seen


def test_llamacpp_invalid_output_is_an_output_error_and_retries_apply():
    _, shape, _ = ROUTES["llamacpp"]

    @sg.program
    def year(s):
        s += "Year: " + sg.gen("y", regex=r"(19|20)[0-9]{2}", max_tokens=6, retries=2)

    body, seen = _flaky("20x5", "2025", shape)
    with MisbehavingServer("json", body=body) as srv:
        b = _llamacpp(srv.url)
        state = year.run(backend=b)
        b.close()
    assert state["y"] == "2025" and len(seen) == 2
    assert state.get_meta_info("y")["attempts"] == 2
    assert seen[1]["temperature"] > 0  # the retry re-samples


def test_retries_of_a_backend_output_error_are_bounded_and_keep_the_raw_text():
    _, shape, _ = ROUTES["llamacpp"]

    @sg.program
    def year(s, retries):
        s += "Year: " + sg.gen("y", regex=r"(19|20)[0-9]{2}", max_tokens=6, retries=retries)

    for retries in (0, 2):
        with MisbehavingServer("json", body=shape("20x5")) as srv:
            b = _llamacpp(srv.url)
            with pytest.raises(OutputValidationError) as info:
                year.run(retries=retries, backend=b)
            b.close()
            assert srv.hits == 1 + retries
        assert info.value.raw == "20x5" and info.value.variable == "y"


def test_openai_choice_unwrap_failure_is_an_output_error_with_the_raw_text():
    _, shape, _ = ROUTES["openai"]
    with MisbehavingServer("json", body=shape('{"choice": "green"}')) as srv:
        b = _openai(srv.url)
        [out] = b.generate([GenerateRequest(prompt="p", constraint=ChoiceSpec(("red", "blue")))])
        b.close()
    assert isinstance(out, OutputValidationError) and out.raw == '{"choice": "green"}'
