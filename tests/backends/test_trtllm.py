"""TensorRT-LLM adapter: translation against trtllm-serve's documented ``response_format``.

No installable TensorRT-LLM here; ``backends/trtllm/gpu_check.sh`` runs it live on a GPU.
"""

from __future__ import annotations

import pytest

from structgen.backends.trtllm import TRTLLMBackend, llm_api_guided_kwargs
from structgen.constraints.spec import (
    ChoiceSpec,
    GrammarSpec,
    RegexSpec,
    json_schema_spec,
)
from structgen.contract.backend import GenerateRequest, SamplingParams, SelectRequest
from structgen.errors import CapabilityError
from tests.backend_fakes import Recorder

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def _completion(payload):
    prompt = payload["prompt"]
    rf = payload.get("response_format") or {}
    text = "yes" if rf.get("type") == "regex" and "yes" in rf.get("regex", "") else '{"n":1}'
    return {"object": "text_completion", "model": "m", "choices": [
        {"index": 0, "text": text, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": 2}}


def backend(**kw) -> tuple[TRTLLMBackend, Recorder]:
    rec = Recorder({"GET /version": {"version": "1.2.0"},
                    "GET /v1/models": {"data": [{"id": "llama", "object": "model"}]},
                    "POST /v1/completions": _completion})
    return TRTLLMBackend("http://127.0.0.1:8000", max_retries=0, **kw, **rec.transports()), rec


@pytest.mark.parametrize("spec,rf", [
    # the schema is sent closed, as gen() builds it (no keys beyond "n")
    (json_schema_spec(SCHEMA), {"type": "json", "schema": {**SCHEMA, "additionalProperties": False}}),
    (RegexSpec(r"[a-z]+"), {"type": "regex", "regex": "[a-z]+"}),
    (ChoiceSpec(("yes", "no")), {"type": "regex", "regex": "(yes|no)"}),
])
def test_response_format_payloads(spec, rf):
    b, rec = backend()
    params = SamplingParams(max_new_tokens=16, temperature=0.0, top_k=5, seed=3, stop=("\n",))
    [res] = b.generate([GenerateRequest(prompt="P", params=params, constraint=spec)])
    [payload] = rec.payloads("/v1/completions")
    assert payload == {"model": "llama", "prompt": "P", "max_tokens": 16, "temperature": 0.0, "top_k": 5,
                       "seed": 3, "stop": ["\n"], "response_format": rf}
    assert res.finish_reason == "stop"
    assert b.version == "1.2.0"


def test_lark_grammar_needs_llguidance():
    b, rec = backend()
    with pytest.raises(CapabilityError) as info:
        b.generate([GenerateRequest(prompt="P", constraint=GrammarSpec('start: "a"'))])
    assert info.value.backend == "trtllm" and rec.payloads("/v1/completions") == []
    b, rec = backend(guided_decoding_backend="llguidance")
    b.generate([GenerateRequest(prompt="P", constraint=GrammarSpec('start: "a"'))])
    assert rec.payloads("/v1/completions")[0]["response_format"] == {"type": "ebnf", "ebnf": 'start: "a"'}


def test_without_a_guided_decoding_backend_every_constraint_raises_before_sending():
    b, rec = backend(guided_decoding_backend=None)
    for spec in (json_schema_spec(SCHEMA), RegexSpec("a"), ChoiceSpec(("a",)), GrammarSpec('start: "a"')):
        with pytest.raises(CapabilityError):
            b.generate([GenerateRequest(prompt="P", constraint=spec)])
    with pytest.raises(CapabilityError, match="select"):
        b.select([SelectRequest(prompt="P", choices=("a", "b"))])
    assert rec.payloads("/v1/completions") == []


def test_select_is_a_constrained_choice_and_scoring_methods_raise():
    b, rec = backend()
    [res] = b.select([SelectRequest(prompt="Answer: ", choices=("yes", "no"))])
    assert res.index == 0
    assert rec.payloads("/v1/completions")[0]["response_format"] == {"type": "regex", "regex": "(yes|no)"}
    with pytest.raises(CapabilityError, match="scoring method"):
        b.select([SelectRequest(prompt="A", choices=("yes", "no"), method="greedy_token_selection")])


def test_unsupported_sampling_raises():
    b, rec = backend()
    with pytest.raises(CapabilityError, match="min_p"):
        b.generate([GenerateRequest(prompt="P", params=SamplingParams(min_p=0.1))])
    assert rec.payloads("/v1/completions") == []


def test_llm_api_translation():
    assert llm_api_guided_kwargs(json_schema_spec(SCHEMA)) == {"json": json_schema_spec(SCHEMA).schema}
    assert llm_api_guided_kwargs(RegexSpec("a+")) == {"regex": "a+"}
    assert llm_api_guided_kwargs(ChoiceSpec(("x", "y"))) == {"regex": "(x|y)"}
    with pytest.raises(CapabilityError):
        llm_api_guided_kwargs(GrammarSpec('start: "a"'))
    assert llm_api_guided_kwargs(GrammarSpec('start: "a"'), guided_decoding_backend="llguidance") == {
        "grammar": 'start: "a"'}


def test_version_route_missing_is_fine():
    rec = Recorder({"GET /v1/models": {"data": [{"id": "llama"}]}})
    b = TRTLLMBackend("http://127.0.0.1:8000", max_retries=0, **rec.transports())
    assert b.version is None and b.capabilities.json_schema


# -- live: only where a server runs (backends/trtllm/gpu_check.sh on a GPU machine) ----------
LIVE_URL = __import__("os").environ.get("STRUCTGEN_TRTLLM_URL")
live = pytest.mark.skipif(not LIVE_URL, reason="no live trtllm-serve (set STRUCTGEN_TRTLLM_URL; "
                                              "see backends/trtllm/gpu_check.sh)")


@pytest.mark.server
@live
def test_live_constraints_and_select():
    import json
    import os
    import re

    import jsonschema

    b = TRTLLMBackend(LIVE_URL, guided_decoding_backend=os.environ.get("STRUCTGEN_TRTLLM_GUIDED", "xgrammar"))
    out = b.generate([GenerateRequest(prompt="Count: ", constraint=json_schema_spec(SCHEMA)),
                      GenerateRequest(prompt="Code: ", constraint=RegexSpec(r"[A-Z]{3}-\d{2}"))])
    jsonschema.validate(json.loads(out[0].text), SCHEMA)
    assert re.fullmatch(r"[A-Z]{3}-\d{2}", out[1].text)
    [sel] = b.select([SelectRequest(prompt="The sky is", choices=("blue", "green"))])
    assert sel.index in (0, 1)
