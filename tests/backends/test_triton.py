"""Triton backend: a real tritonserver (PyTriton) serving structgen's embedded model.

The served model speaks the TensorRT-LLM ensemble's generate-endpoint names, including
``guided_decoding_guide_type``/``guided_decoding_guide``; the adapter reads the model's
metadata and declares only what its inputs can carry.
"""

from __future__ import annotations

import json
import re
import threading
import time

import jsonschema
import pytest

from structgen.backends.triton import TritonBackend
from structgen.constraints.spec import (
    ChoiceSpec,
    GrammarSpec,
    RegexSpec,
    json_schema_spec,
)
from structgen.contract.backend import (
    GenerateRequest,
    GenerateResult,
    SamplingParams,
    SelectRequest,
)
from structgen.errors import BackendError, CapabilityError
from tests.backend_fakes import Recorder
from tests.program_suite import CASES
from tests.servers import triton as triton_server
from tests.servers.fixtures import LOG_DIR, require_engine
from tests.servers.proxy import FaultProxy

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["city", "n"], "additionalProperties": False}
TRT_INPUTS = ["text_input", "max_tokens", "temperature", "top_k", "top_p", "stop_words", "random_seed",
              "guided_decoding_guide_type", "guided_decoding_guide", "exclude_input_in_output"]


def _meta(inputs):
    return {"name": "ensemble", "inputs": [{"name": n, "datatype": "BYTES", "shape": [1]} for n in inputs],
            "outputs": [{"name": "text_output", "datatype": "BYTES", "shape": [-1]}]}


def _fake(inputs, model="ensemble") -> tuple[TritonBackend, Recorder]:
    rec = Recorder({"GET /v2": {"name": "triton", "version": "2.60.0"},
                    f"GET /v2/models/{model}": _meta(inputs),
                    f"POST /v2/models/{model}/generate": {"model_name": model, "text_output": "abc"}})
    return TritonBackend("http://127.0.0.1:9", model=model, max_retries=0, **rec.transports()), rec


def test_tensorrtllm_ensemble_payload():
    b, rec = _fake(TRT_INPUTS)
    params = SamplingParams(max_new_tokens=20, temperature=0.3, top_k=5, stop=("\n",), seed=7)
    [res] = b.generate([GenerateRequest(prompt="Q:", params=params, constraint=json_schema_spec(SCHEMA))])
    [p] = rec.payloads("/v2/models/ensemble/generate")
    assert p == {"text_input": "Q:", "max_tokens": 20, "temperature": 0.3, "top_k": 5, "stop_words": ["\n"],
                 "random_seed": 7, "exclude_input_in_output": True, "guided_decoding_guide_type": "json_schema",
                 "guided_decoding_guide": json_schema_spec(SCHEMA).schema}
    assert res.text == "abc" and b.version == "2.60.0" and b.flavor == "tensorrtllm"


def test_a_model_without_guided_inputs_cannot_take_constraints():
    b, rec = _fake(["text_input", "max_tokens"])
    for spec in (RegexSpec("a"), json_schema_spec(SCHEMA), ChoiceSpec(("a", "b"))):
        with pytest.raises(CapabilityError) as info:
            b.generate([GenerateRequest(prompt="x", constraint=spec)])
        assert info.value.backend == "triton" and info.value.version == "2.60.0"
    with pytest.raises(CapabilityError, match="top_k"):
        b.generate([GenerateRequest(prompt="x", params=SamplingParams(top_k=3))])
    with pytest.raises(CapabilityError, match="select"):
        b.select([SelectRequest(prompt="x", choices=("a", "b"))])
    assert rec.payloads("/v2/models/ensemble/generate") == []


def test_lark_grammar_is_a_capability_error():
    b, rec = _fake(TRT_INPUTS)
    with pytest.raises(CapabilityError, match="grammar"):
        b.generate([GenerateRequest(prompt="x", constraint=GrammarSpec('start: "a"'))])
    assert rec.payloads("/v2/models/ensemble/generate") == []


def test_vllm_flavour_payload():
    b, rec = _fake(["text_input", "stream", "sampling_parameters", "exclude_input_in_output"], model="vllm_model")
    b.generate([GenerateRequest(prompt="x", params=SamplingParams(max_new_tokens=5, top_k=2),
                                constraint=RegexSpec("[ab]+"))])
    [p] = rec.payloads("/v2/models/vllm_model/generate")
    assert b.flavor == "vllm" and p["stream"] is False and p["exclude_input_in_output"] is True
    assert json.loads(p["sampling_parameters"]) == {"max_tokens": 5, "temperature": 0.0, "top_k": 2,
                                                    "guided_decoding": {"regex": "[ab]+"}}


def test_not_an_llm_model_is_reported():
    rec = Recorder({"GET /v2": {"version": "2.51.0"},
                    "GET /v2/models/m": {"inputs": [{"name": "INPUT0"}], "outputs": [{"name": "OUTPUT0"}]}})
    b = TritonBackend("http://127.0.0.1:9", model="m", max_retries=0, **rec.transports())
    with pytest.raises(BackendError, match="text_input"):
        _ = b.capabilities


# -- a real tritonserver -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def server():
    require_engine("triton")
    srv = triton_server.start(LOG_DIR)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def backend(server):
    from structgen.backends.embedded.loader import resolve_model_dir

    # Triton cannot report the tokenizer: the chat template comes from the model directory
    b = TritonBackend(server.url, model="structgen", timeout=120, tokenizer=resolve_model_dir())
    yield b
    b.close()


@pytest.mark.server
def test_detects_the_real_server(backend):
    assert backend.version == "2.51.0" and backend.flavor == "tensorrtllm"
    assert backend.capabilities.regex and backend.capabilities.select == "choice"


@pytest.mark.server
def test_constraints_hold_through_triton(backend):
    out = backend.generate([
        GenerateRequest(prompt="A city and a number as JSON: ", constraint=json_schema_spec(SCHEMA),
                        params=SamplingParams(max_new_tokens=48)),
        GenerateRequest(prompt="Phone: ", constraint=RegexSpec(r"\d{3}-\d{4}")),
        GenerateRequest(prompt="Colour: ", constraint=ChoiceSpec(("red", "green", "blue")))])
    assert all(isinstance(r, GenerateResult) for r in out), out
    jsonschema.validate(json.loads(out[0].text), SCHEMA)
    assert re.fullmatch(r"\d{3}-\d{4}", out[1].text)
    assert out[2].text in ("red", "green", "blue")
    [sel] = backend.select([SelectRequest(prompt="Is water wet? Answer: ", choices=("yes", "no"))])
    assert sel.index in (0, 1)


@pytest.mark.server
@pytest.mark.parametrize("case", sorted(CASES))
def test_program_suite_on_triton(backend, case):
    CASES[case](backend)


@pytest.mark.server
def test_503_through_a_proxy_is_retried(server):
    with FaultProxy(server.url, plan=[503, 503], default="pass") as proxy:
        b = TritonBackend(proxy.url, model="structgen", version="2.51.0",
                          capabilities=None, backoff=0.01, max_retries=3)
        b.inputs = frozenset({"text_input", "guided_decoding_guide_type", "guided_decoding_guide",
                              "max_tokens", "temperature"})
        b.flavor = "tensorrtllm"
        [res] = b.generate([GenerateRequest(prompt="x", constraint=RegexSpec("[0-9]{2}"))])
        assert re.fullmatch("[0-9]{2}", res.text) and b.stats()["retries"] == 2


@pytest.mark.server
def test_zz_killed_mid_batch(server):
    b = TritonBackend(server.url, model="structgen", timeout=60, max_retries=1, backoff=0.01)
    _ = b.capabilities  # detect while the server is up
    reqs = [GenerateRequest(prompt=f"Story {i}:", params=SamplingParams(max_new_tokens=300)) for i in range(6)]
    box: dict[str, object] = {}
    t = threading.Thread(target=lambda: box.setdefault("out", b.generate(reqs)))
    t0 = time.monotonic()
    t.start()
    time.sleep(1.5)
    server.kill()
    t.join(timeout=90)
    assert not t.is_alive(), "batch hung after the server died"
    out = box["out"]
    assert len(out) == len(reqs)
    errors = [r for r in out if isinstance(r, BackendError)]
    assert errors and all(isinstance(r, (GenerateResult, BackendError)) for r in out)
    assert all(e.retryable for e in errors)
    assert time.monotonic() - t0 < 90
