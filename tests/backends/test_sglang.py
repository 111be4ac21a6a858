"""SGLang adapter: request translation against SGLang's documented /generate payloads.

SGLang cannot run on this CPU (no CPU build of sgl-kernel), so these tests check the
payloads the adapter sends and how it reads documented responses; ``gpu_check.sh``
runs the same adapter against a live server on a GPU machine.
"""

from __future__ import annotations

import re

import pytest

from structgen.backends.sglang import SGLangBackend
from structgen.backends.sglang.adapter import choice_regex
from structgen.constraints.spec import (
    ChoiceSpec,
    GrammarSpec,
    RegexSpec,
    json_schema_spec,
)
from structgen.contract.backend import GenerateRequest, SamplingParams, SelectRequest
from structgen.errors import BackendError, CapabilityError
from structgen.lang.choices import method_by_name
from tests.backend_fakes import Recorder

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
INFO = {"version": "0.5.6", "grammar_backend": "xgrammar", "model_path": "/models/llama",
        "tokenizer_path": "/models/llama"}


def _generate_response(payload):
    texts = payload["text"]
    def meta(t):
        return {"prompt_tokens": len(t.split()), "completion_tokens": 2, "cached_tokens": 0,
                "finish_reason": {"type": "stop", "matched": 2}}
    if isinstance(texts, list):
        return [{"text": "ok", "meta_info": meta(t)} for t in texts]
    return {"text": '{"name":"x"}', "meta_info": meta(texts)}


def backend(routes=None, **kw) -> tuple[SGLangBackend, Recorder]:
    rec = Recorder({"GET /get_server_info": INFO, "POST /generate": _generate_response, **(routes or {})})
    return SGLangBackend("http://127.0.0.1:30000", max_retries=0, **kw, **rec.transports()), rec


def test_version_and_grammar_backend_are_detected():
    b, rec = backend()
    assert b.version == "0.5.6" and b.grammar_backend == "xgrammar"
    assert b.capabilities.select == "logprobs" and not b.capabilities.grammar
    assert rec.requests[0][:2] == ("GET", "/get_server_info")


def test_newer_server_info_route_is_used_when_the_old_one_is_gone():
    rec = Recorder({"GET /server_info": {**INFO, "grammar_backend": "llguidance"}})
    b = SGLangBackend("http://127.0.0.1:30000", max_retries=0, **rec.transports())
    assert b.capabilities.grammar and b.grammar_backend == "llguidance"


@pytest.mark.parametrize("spec,expected", [
    (json_schema_spec(SCHEMA), {"json_schema": json_schema_spec(SCHEMA).schema}),
    (RegexSpec(r"\d+"), {"regex": r"\d+"}),
    (ChoiceSpec(("yes", "no", "a.b")), {"regex": r"(yes|a\.b|no)"}),
])
def test_constraints_go_into_sampling_params(spec, expected):
    b, rec = backend()
    params = SamplingParams(max_new_tokens=32, temperature=0.5, top_p=0.9, top_k=20, stop=("\n",))
    [res] = b.generate([GenerateRequest(prompt="Q: ", params=params, constraint=spec)])
    [payload] = rec.payloads("/generate")
    assert payload == {"text": "Q: ", "sampling_params": {
        "max_new_tokens": 32, "temperature": 0.5, "top_p": 0.9, "top_k": 20, "stop": ["\n"], **expected}}
    assert res.text == '{"name":"x"}' and res.finish_reason == "stop"
    assert res.meta["meta_info"]["prompt_tokens"] == 1


def test_json_schema_is_sent_as_json_text_not_an_object():
    b, rec = backend()
    b.generate([GenerateRequest(prompt="x", constraint=json_schema_spec(SCHEMA))])
    assert isinstance(rec.payloads("/generate")[0]["sampling_params"]["json_schema"], str)


def test_choice_regex_matches_exactly_the_choices():
    rx = choice_regex(("a", "ab", "a+b", "(x)"))
    for c in ("a", "ab", "a+b", "(x)"):
        assert re.fullmatch(rx, c)
    assert not re.fullmatch(rx, "aab") and not re.fullmatch(rx, "x")


def test_grammar_needs_the_llguidance_grammar_backend_and_nothing_is_sent():
    b, rec = backend()
    with pytest.raises(CapabilityError) as info:
        b.generate([GenerateRequest(prompt="x", constraint=GrammarSpec('start: "a"'))])
    assert info.value.backend == "sglang" and info.value.version == "0.5.6"
    assert "grammar" in str(info.value)
    assert rec.payloads("/generate") == []
    b2, rec2 = backend(grammar_backend="llguidance")
    b2.generate([GenerateRequest(prompt="x", constraint=GrammarSpec('start: "a"'))])
    assert rec2.payloads("/generate")[0]["sampling_params"]["ebnf"] == 'start: "a"'


def test_unsupported_sampling_parameter_raises_before_sending():
    b, rec = backend()
    with pytest.raises(CapabilityError, match="n"):
        b.generate([GenerateRequest(prompt="x", params=SamplingParams(n=2))])
    assert rec.payloads("/generate") == []


def test_logprob_options_are_top_level_fields():
    b, rec = backend()
    b.generate([GenerateRequest(prompt="x", params=SamplingParams(return_logprob=True, logprob_start_len=0,
                                                                   top_logprobs_num=3))])
    p = rec.payloads("/generate")[0]
    assert p["return_logprob"] is True and p["logprob_start_len"] == 0 and p["top_logprobs_num"] == 3


def test_length_finish_and_abort():
    b, _ = backend({"POST /generate": {"text": "abc", "meta_info": {"finish_reason": {"type": "length",
                                                                                      "length": 3}}}})
    [res] = b.generate([GenerateRequest(prompt="x")])
    assert res.finish_reason == "length"
    b, _ = backend({"POST /generate": {"text": "", "meta_info": {"finish_reason": {
        "type": "abort", "message": "grammar compile failed"}}}})
    [res] = b.generate([GenerateRequest(prompt="x")])
    assert isinstance(res, BackendError) and "grammar compile failed" in str(res)


def test_select_reads_input_token_logprobs_after_the_prompt():
    # prompt has 4 tokens; logprob_start_len = 2 -> entries cover positions 2.. (first None)
    def gen(payload):
        if payload["sampling_params"]["max_new_tokens"] == 0 and isinstance(payload["text"], str):
            return {"text": "", "meta_info": {"prompt_tokens": 4}}
        assert payload["logprob_start_len"] in (2, 0) and payload["return_logprob"] is True
        if payload["logprob_start_len"] == 0:  # unconditional
            return [{"text": "", "meta_info": {"input_token_logprobs": [[None, 1, None], [-0.5, 7, None]]}},
                    {"text": "", "meta_info": {"input_token_logprobs": [[None, 2, None]]}}]
        return [{"text": "", "meta_info": {"input_token_logprobs": [
                    [None, 10, None], [-1.0, 11, None], [-0.2, 12, None], [-0.4, 13, None]]}},
                {"text": "", "meta_info": {"input_token_logprobs": [
                    [None, 10, None], [-1.0, 11, None], [-2.0, 14, None]]}}]

    b, rec = backend({"POST /generate": gen})
    [res] = b.select([SelectRequest(prompt="a b c d", choices=("yes please", "no"), need_unconditional=True)])
    assert res.input_token_logprobs == [[-0.2, -0.4], [-2.0]]
    assert res.unconditional_token_logprobs == [[0.0, -0.5], [0.0]]
    assert method_by_name(None)(choices=("yes please", "no"), token_logprobs=res.input_token_logprobs).index == 0
    texts = [p["text"] for p in rec.payloads("/generate")]
    assert texts[1] == ["a b c dyes please", "a b c dno"]


def test_prefix_is_sent_once_first_for_a_group():
    b, rec = backend()
    shared = "You are an extractor. " * 5
    reqs = [GenerateRequest(prompt=shared + f"item {i}", group="g") for i in range(3)]
    b.generate(reqs)
    payloads = rec.payloads("/generate")
    assert payloads[0] == {"text": shared + "item ", "sampling_params": {"max_new_tokens": 0, "temperature": 0}}
    assert len(payloads) == 4 and b.stats()["warm_prefixes"] == 1


# -- live: only where a server runs (backends/sglang/gpu_check.sh on a GPU machine) ----------
LIVE_URL = __import__("os").environ.get("STRUCTGEN_SGLANG_URL")
live = pytest.mark.skipif(not LIVE_URL, reason="no live SGLang server (set STRUCTGEN_SGLANG_URL; "
                                              "see backends/sglang/gpu_check.sh)")


@pytest.mark.server
@live
def test_live_constraints_and_select():
    import jsonschema

    b = SGLangBackend(LIVE_URL)
    out = b.generate([GenerateRequest(prompt="Name: ", constraint=json_schema_spec(SCHEMA)),
                      GenerateRequest(prompt="Code: ", constraint=RegexSpec(r"[A-Z]{3}-\d{2}")),
                      GenerateRequest(prompt="Pick: ", constraint=ChoiceSpec(("left", "right")))])
    jsonschema.validate(__import__("json").loads(out[0].text), SCHEMA)
    assert re.fullmatch(r"[A-Z]{3}-\d{2}", out[1].text) and out[2].text in ("left", "right")
    [sel] = b.select([SelectRequest(prompt="The sky is", choices=(" blue", " green"), need_unconditional=True)])
    assert len(sel.input_token_logprobs) == 2 and all(sel.input_token_logprobs)
    if b.capabilities.grammar:
        [g] = b.generate([GenerateRequest(prompt="x", constraint=GrammarSpec('start: "ab" /[0-9]{2}/'))])
        assert re.fullmatch(r"ab[0-9]{2}", g.text)
