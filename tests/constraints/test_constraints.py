"""The llguidance constraint engine with the real SmolLM2 tokenizer (no model weights).

Random walks pick any token the mask allows (many seeds) and check that the finished
text satisfies the spec; known tokenizations of valid strings must pass the mask token
by token; bad tokens put the matcher in its error state instead of raising.
"""

from __future__ import annotations

import ipaddress
import json
import math
import random
import re
import threading
from enum import Enum
from typing import Any

import numpy as np
import pytest
from pydantic import BaseModel, ConfigDict, Field

from structgen.constraints.bitmask import (
    allocate_token_bitmask,
    allowed_token_ids,
    apply_token_bitmask_inplace,
    bitmask_words,
)
from structgen.constraints.compiler import (
    CompileCache,
    compiler_for,
    default_cache,
    tokenizer_fingerprint,
)
from structgen.constraints.engines.llguidance import (
    LLGuidanceMatcher,
    python_regex_to_rust,
)
from structgen.constraints.spec import (
    ChoiceSpec,
    GrammarSpec,
    JsonSchemaSpec,
    RegexSpec,
    dtype_spec,
    json_schema_spec,
    regex_spec,
)
from structgen.constraints.validation import validate_output
from structgen.errors import ConstraintError, OutputValidationError
from tests.jsontext import outside_strings

SEEDS = range(12)

OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
IPV4 = rf"({OCTET}\.){{3}}{OCTET}"
ISO_DATE = r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])"


# --- fixtures and helpers -------------------------------------------------------------


@pytest.fixture(scope="module")
def compiler(tokenizer):
    return compiler_for(tokenizer, cache=CompileCache())


@pytest.fixture(scope="module")
def lltok(compiler):
    return compiler.ladder.llguidance_tokenizer


@pytest.fixture(scope="module")
def structural(compiler, lltok):
    """Two token-id sets that make random walks end: JSON punctuation / digits, and closers."""
    punct, closers = set('"{}[],:0123456789-.'), set('"}]')
    punct_ids, closer_ids = [], []
    for t in range(compiler.vocab_size):
        if t == compiler.eos_token_id:
            continue
        text = lltok.decode_bytes([t])
        if text and all(chr(b) in punct for b in text):
            punct_ids.append(t)
        if text and all(chr(b) in closers for b in text):
            closer_ids.append(t)
    return np.array(punct_ids), np.array(closer_ids)


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def random_walk(compiler, lltok, structural, spec, seed: int, *, max_steps: int = 600,
                eos_prob: float = 0.3) -> str:
    """Generate with uniformly random allowed tokens; check EOS-iff-accepting at every step."""
    rng = random.Random(seed)
    eos = compiler.eos_token_id
    matcher = compiler.compile(spec).matcher()
    bitmask = allocate_token_bitmask(1, compiler.vocab_size, kind="numpy")
    tokens: list[int] = []
    for step in range(max_steps):
        matcher.fill_bitmask(bitmask, 0)
        allowed = allowed_token_ids(bitmask, 0, compiler.vocab_size)
        eos_allowed = bool(np.any(allowed == eos))
        assert eos_allowed == matcher.is_accepting(), (step, lltok.decode_str(tokens))
        if matcher.is_stopped():
            assert allowed.tolist() == [eos]
            break
        if eos_allowed and rng.random() < eos_prob:
            break
        choices = allowed[allowed != eos]
        assert len(choices) > 0
        preferences = [structural[0]] if rng.random() < 0.5 else []
        if step > max_steps // 3:  # late: close what is open
            preferences = [structural[1], structural[0]]
        for subset in preferences:
            preferred = np.intersect1d(choices, subset, assume_unique=True)
            if len(preferred):
                choices = preferred
                break
        token = int(choices[rng.randrange(len(choices))])
        assert matcher.consume(token), matcher.error()
        tokens.append(token)
    else:
        pytest.fail(f"walk did not finish in {max_steps} steps: {lltok.decode_str(tokens)!r}")
    assert matcher.is_accepting()
    assert matcher.consume(eos)
    assert matcher.is_stopped() and matcher.error() is None
    return lltok.decode_bytes(tokens).decode("utf-8")


def allowed_now(matcher, compiler) -> np.ndarray:
    bitmask = allocate_token_bitmask(1, compiler.vocab_size, kind="numpy")
    matcher.fill_bitmask(bitmask)
    return allowed_token_ids(bitmask, 0, compiler.vocab_size)


# --- schemas used below -------------------------------------------------------------


class Color(str, Enum):  # noqa: UP042 -- the str-mixin enum pydantic users write
    red = "red"
    green = "green"
    blue = "blue"


class Address(BaseModel):
    model_config = ConfigDict(extra="forbid")

    street: str = Field(max_length=20)
    zip: str = Field(pattern=r"^[0-9]{5}$")


class Person(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=16)
    age: int = Field(ge=0, le=150)
    color: Color
    tags: list[str] = Field(max_length=3)
    address: Address
    nickname: str | None = None
    score: float


NESTED = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "meta": {
            "type": "object",
            "properties": {"ok": {"type": "boolean"}, "note": {"type": ["string", "null"], "maxLength": 10}},
            "required": ["ok", "note"],
            "additionalProperties": False,
        },
    },
    "required": ["id", "meta"],
    "additionalProperties": False,
}
ENUM = {"enum": ["alpha", "beta", 3, None, True]}
ARRAY = {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "minItems": 1, "maxItems": 4}
REFS = {
    "$defs": {
        "point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                  "required": ["x", "y"], "additionalProperties": False},
    },
    "type": "object",
    "properties": {"a": {"$ref": "#/$defs/point"}, "path": {"type": "array", "items": {"$ref": "#/$defs/point"},
                                                             "maxItems": 2}},
    "required": ["a", "path"],
    "additionalProperties": False,
}

ANY_OBJECT = {"type": "object"}  # free-form JSON: keys and nested values of any kind

SCHEMAS = {"nested": NESTED, "enum": ENUM, "array": ARRAY, "refs": REFS, "any_object": ANY_OBJECT}


# --- random walks -----------------------------------------------------------------------


@pytest.mark.parametrize("name,pattern,check", [
    ("ipv4", IPV4, ipaddress.IPv4Address),
    ("iso_date", ISO_DATE, None),
])
@pytest.mark.parametrize("seed", SEEDS)
def test_regex_walks_fully_match(compiler, lltok, structural, name, pattern, check, seed):
    spec = regex_spec(pattern)
    text = random_walk(compiler, lltok, structural, spec, seed)
    assert re.fullmatch(pattern, text), text
    if check is not None:
        check(text)
    assert validate_output(spec, text) == text


@pytest.mark.parametrize("dtype", [int, float, bool, str])
@pytest.mark.parametrize("seed", SEEDS)
def test_dtype_walks_fully_match(compiler, lltok, structural, dtype, seed):
    spec = dtype_spec(dtype)
    text = random_walk(compiler, lltok, structural, spec, seed)
    assert re.fullmatch(spec.pattern, text), text
    if dtype is int:
        int(text)
    elif dtype is float:
        float(text)


def overflows_double(text: str) -> bool:
    """A number past a double's range (``1e400``): the JSON grammar allows its digits, final
    validation rejects it rather than hand the program ``inf``."""
    numbers = re.findall(r"-?[0-9]+(?:\.[0-9]+)?[eE][-+]?[0-9]+", outside_strings(text))
    return any(math.isinf(float(n)) for n in numbers)


def validate_walk(spec: Any, text: str) -> Any:
    if overflows_double(text):
        with pytest.raises(OutputValidationError, match="out of range for a double"):
            validate_output(spec, text)
        return None
    return validate_output(spec, text)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@pytest.mark.parametrize("seed", SEEDS)
def test_schema_walks_are_valid_and_compact(compiler, lltok, structural, name, seed):
    spec = json_schema_spec(SCHEMAS[name])
    text = random_walk(compiler, lltok, structural, spec, seed, eos_prob=1.0)
    if overflows_double(text):
        validate_walk(spec, text)
        return
    value = validate_output(spec, text)
    assert json.loads(text) == value
    assert not re.search(r"\s", outside_strings(text)), text


@pytest.mark.parametrize("seed", SEEDS)
def test_pydantic_walks_give_typed_instances(compiler, lltok, structural, seed):
    spec = json_schema_spec(Person)
    text = random_walk(compiler, lltok, structural, spec, seed, eos_prob=1.0)
    person = validate_walk(spec, text)
    if person is None:
        return
    assert isinstance(person, Person)
    assert isinstance(person.address, Address) and isinstance(person.color, Color)
    assert not re.search(r"\s", outside_strings(text)), text


@pytest.mark.parametrize("choices", [
    ("yes", "no"),
    ("a", "ab", "abc"),          # prefixes: EOS is allowed mid-way
    ("é", 'say "hi"', "tab\there", "日本"),
    ("", "x"),
])
@pytest.mark.parametrize("seed", SEEDS)
def test_choice_walks_end_on_a_choice(compiler, lltok, structural, choices, seed):
    spec = ChoiceSpec(choices)
    text = random_walk(compiler, lltok, structural, spec, seed)
    assert text in choices
    assert validate_output(spec, text) == text


def test_lark_grammar_walk(compiler, lltok, structural):
    spec = GrammarSpec('start: "(" item ("," item)* ")"\nitem: /[a-c]{1,3}/')
    for seed in SEEDS:
        text = random_walk(compiler, lltok, structural, spec, seed)
        assert re.fullmatch(r"\([a-c]{1,3}(,[a-c]{1,3})*\)", text), text


# --- known tokenizations, bad tokens, EOS -----------------------------------------------


@pytest.mark.parametrize("spec,text", [
    (regex_spec(IPV4), "192.168.10.255"),
    (regex_spec(ISO_DATE), "2024-02-29"),
    (dtype_spec(int), "-42"),
    (dtype_spec(float), "3.25"),
    (dtype_spec(bool), "False"),
    (dtype_spec(str), '"hello world 42"'),
    (json_schema_spec(NESTED), '{"id":7,"meta":{"ok":true,"note":null}}'),
    (json_schema_spec(REFS), '{"a":{"x":1.5,"y":-2},"path":[{"x":0,"y":0}]}'),
    (json_schema_spec(Person),
     ('{"name":"Ada","age":36,"color":"green","tags":["x","y"],'
      '"address":{"street":"Main St","zip":"12345"},"nickname":null,"score":9.5}')),
    (ChoiceSpec(("apple pie", "banana")), "apple pie"),
])
def test_known_tokenization_is_allowed_token_by_token(compiler, tokenizer, spec, text):
    matcher = compiler.compile(spec).matcher()
    eos = compiler.eos_token_id
    ids = encode(tokenizer, text)
    for i, token in enumerate(ids):
        allowed = allowed_now(matcher, compiler)
        assert token in allowed, (i, tokenizer.decode(ids[:i]), tokenizer.decode([token]))
        assert (eos in allowed) == matcher.is_accepting()
        assert matcher.consume(token), matcher.error()
    assert matcher.is_accepting()
    assert eos in allowed_now(matcher, compiler)
    assert matcher.consume(eos)
    assert matcher.is_stopped()
    assert validate_output(spec, text) is not None


@pytest.mark.parametrize("spec,prefix,bad", [
    (regex_spec(IPV4), "10.", "a"),
    (dtype_spec(int), "4", "x"),
    (json_schema_spec(NESTED), '{"id":', '"'),
    (ChoiceSpec(("yes", "no")), "", "maybe"),
])
def test_invalid_token_is_rejected_without_raising(compiler, tokenizer, spec, prefix, bad):
    matcher = compiler.compile(spec).matcher()
    assert matcher.consume_many(encode(tokenizer, prefix))
    bad_token = encode(tokenizer, bad)[0]
    assert bad_token not in allowed_now(matcher, compiler)
    assert matcher.validate_tokens([bad_token]) == 0
    assert matcher.error() is None
    assert matcher.consume(bad_token) is False
    assert matcher.error()  # a reason, not a traceback
    assert "<state>" not in matcher.error()
    assert matcher.is_stopped() and not matcher.is_accepting()
    assert matcher.consume(encode(tokenizer, "1")[0]) is False  # the error state is permanent
    assert allowed_now(matcher, compiler).tolist() == [compiler.eos_token_id]  # only EOS left


def test_out_of_range_token_is_an_error_state(compiler):
    matcher = compiler.compile(dtype_spec(int)).matcher()
    assert matcher.consume(10**9) is False
    assert "outside the vocabulary" in matcher.error()
    assert matcher.consume(-1) is False


def test_eos_only_when_accepting(compiler, tokenizer):
    eos = compiler.eos_token_id
    matcher = compiler.compile(regex_spec(r"ab+")).matcher()
    assert eos not in allowed_now(matcher, compiler)
    assert not matcher.is_accepting()
    matcher.consume_many(encode(tokenizer, "a"))
    assert eos not in allowed_now(matcher, compiler)
    matcher.consume_many(encode(tokenizer, "b"))
    assert matcher.is_accepting() and not matcher.is_stopped()
    assert eos in allowed_now(matcher, compiler)
    early = compiler.compile(regex_spec(r"ab+")).matcher()
    assert early.consume(eos) is False and early.error()


def test_stopped_after_grammar_completes(compiler, tokenizer):
    matcher = compiler.compile(dtype_spec(bool)).matcher()
    assert matcher.consume_many(encode(tokenizer, "True"))
    assert matcher.is_stopped() and matcher.is_accepting()
    assert allowed_now(matcher, compiler).tolist() == [compiler.eos_token_id]
    assert matcher.forced_tokens() == []
    json_matcher = compiler.compile(json_schema_spec(NESTED)).matcher()
    assert json_matcher.consume_many(encode(tokenizer, '{"id":1,"meta":{"ok":false,"note":"x"}}'))
    assert json_matcher.is_stopped() and json_matcher.is_accepting()


def test_forced_tokens_fast_forward(compiler, tokenizer, lltok):
    matcher = compiler.compile(json_schema_spec(NESTED)).matcher()
    assert matcher.forced_text() == b'{"id":'
    forced = matcher.forced_tokens()  # whole tokens only: the last bytes may merge further
    assert forced and b'{"id":'.startswith(lltok.decode_bytes(forced))
    assert matcher.consume_many(forced)
    assert matcher.consume_many(encode(tokenizer, '":'))
    assert matcher.forced_tokens() == [] and matcher.forced_text() == b""  # the integer is free
    assert matcher.consume_many(encode(tokenizer, "5,"))
    assert matcher.forced_text() == b'"meta":{"ok":'
    assert lltok.decode_str(matcher.forced_tokens()).startswith('"meta')


def test_rollback_restores_state(compiler, tokenizer):
    spec = json_schema_spec(NESTED)
    text = '{"id":12,"meta":{"ok":true,"note":null}}'
    ids = encode(tokenizer, text)
    matcher = compiler.compile(spec).matcher()
    assert matcher.consume_many(ids[:4])
    before = allowed_now(matcher, compiler)
    assert matcher.consume_many(ids[4:])
    assert matcher.is_stopped()
    assert matcher.consume(compiler.eos_token_id)  # EOS after the grammar stopped
    matcher.rollback(1 + len(ids) - 4)
    assert matcher.num_consumed == 4
    assert np.array_equal(allowed_now(matcher, compiler), before)
    assert matcher.consume_many(ids[4:]) and matcher.is_accepting()
    with pytest.raises(ValueError):
        matcher.rollback(len(ids) + 1)
    matcher.reset()
    assert matcher.num_consumed == 0 and matcher.forced_text() == b'{"id":'


def test_rollback_of_eos_before_stop(compiler, tokenizer):
    matcher = compiler.compile(regex_spec(r"a+")).matcher()
    a = encode(tokenizer, "a")[0]
    assert matcher.consume(a) and matcher.consume(compiler.eos_token_id)
    assert matcher.is_stopped()
    matcher.rollback(1)
    assert not matcher.is_stopped() and matcher.is_accepting()
    assert matcher.consume(a)


def test_fork_is_independent(compiler, tokenizer):
    matcher = compiler.compile(ChoiceSpec(("red", "blue"))).matcher()
    twin = matcher.fork()
    assert isinstance(twin, LLGuidanceMatcher)
    assert matcher.consume_many(encode(tokenizer, "red"))
    assert twin.num_consumed == 0
    assert twin.consume_many(encode(tokenizer, "blue")) and twin.is_accepting()


def test_flexible_whitespace_allows_spaces_compact_does_not(compiler, tokenizer):
    space = encode(tokenizer, " ")[0]
    compact = compiler.compile(json_schema_spec(NESTED)).matcher()
    flexible = compiler.compile(json_schema_spec(NESTED, whitespace="flexible")).matcher()
    for m in (compact, flexible):
        assert m.consume_many(encode(tokenizer, '{"id":'))
    assert space not in allowed_now(compact, compiler)
    assert space in allowed_now(flexible, compiler)
    text = '{ "id": 1, "meta": {"ok": true, "note": null} }'
    m = compiler.compile(json_schema_spec(NESTED, whitespace="flexible")).matcher()
    assert m.consume_many(encode(tokenizer, text)) and m.is_accepting()


# --- compile errors -----------------------------------------------------------------------


@pytest.mark.parametrize("spec,needle", [
    (RegexSpec("[a-"), "malformed regex"),
    (RegexSpec("(a"), "malformed regex"),
    (RegexSpec(r"(?<=a)b"), "look-around"),
    (RegexSpec(r"(a)\1"), ""),
    (JsonSchemaSpec('{"type":"nope"}'), "malformed JSON schema"),
    (JsonSchemaSpec('{"type":"object","properties":{"a":{"minimum":"x"}}}'), "$.properties.a.minimum"),
    (JsonSchemaSpec('{"$ref":"http://example.com/x.json"}'), "never fetched"),
    (JsonSchemaSpec('{"$ref":"#/$defs/missing"}'), ""),
    (JsonSchemaSpec("{not json"), "not valid JSON"),
    (GrammarSpec("start: undefined_rule"), "undefined_rule"),
    (GrammarSpec(""), ""),
    (ChoiceSpec(()), "empty"),
])
def test_malformed_specs_raise_constraint_error(compiler, spec, needle):
    with pytest.raises(ConstraintError) as info:
        compiler.compile(spec)
    assert needle in str(info.value)
    assert "<state>" not in str(info.value)


def test_remote_ref_is_never_fetched(compiler, monkeypatch):
    import socket

    def no_network(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    schema = {"type": "object", "properties": {"x": {"$ref": "http://example.com/x.json"}}}
    with pytest.raises(ConstraintError, match="never fetched"):  # where the gen is built
        json_schema_spec(schema)
    with pytest.raises(ConstraintError, match="never fetched"):  # and by the compiler itself
        compiler.compile(JsonSchemaSpec(json.dumps(schema)))


@pytest.mark.parametrize("draft", [
    "http://json-schema.org/draft-04/schema#",
    "http://json-schema.org/draft-06/schema#",
    "http://json-schema.org/draft-07/schema#",
    "https://json-schema.org/draft/2019-09/schema",
    "https://json-schema.org/draft/2020-12/schema",
])
def test_meta_schema_checked_per_draft(compiler, draft):
    ok = {"$schema": draft, "type": "object", "properties": {"n": {"type": "integer"}}}
    assert compiler.compile(json_schema_spec(ok)).exact
    bad = {"$schema": draft, "type": "object", "required": "n"}
    with pytest.raises(ConstraintError, match="malformed JSON schema"):
        compiler.compile(json_schema_spec(bad))


def test_unenforceable_keywords_compile_leniently(compiler, lltok, structural):
    spec = json_schema_spec({"type": "array", "items": {"enum": [1, 2, 3]}, "uniqueItems": True, "maxItems": 3})
    compiled = compiler.compile(spec)
    assert compiled.exact is False
    assert any("uniqueItems" in w for w in compiled.warnings)
    assert compiler.compile(json_schema_spec(NESTED)).exact is True


def test_python_regex_classes_are_rewritten():
    assert python_regex_to_rust(r"\w+") == r"[\p{L}\p{N}_]+"
    assert python_regex_to_rust(r"[\w-]") == r"[[\p{L}\p{N}_]-]"
    assert python_regex_to_rust(r"\\w\d") == r"\\w\d"


def test_unicode_word_class_agrees_with_python(compiler, tokenizer, lltok):
    """Rust's \\w includes combining marks; Python's does not. The mask must follow Python."""
    spec = regex_spec(r"\w+")
    matcher = compiler.compile(spec).matcher()
    allowed = set(allowed_now(matcher, compiler).tolist())
    for token in encode(tokenizer, "e\u0301"):  # 'e' + combining acute accent
        text = lltok.decode_bytes([token])
        try:
            decoded = text.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if decoded and re.fullmatch(r"\w+", decoded) is None:
            assert token not in allowed


# --- the compile cache -------------------------------------------------------------------


def test_cache_counts_hits_and_misses_exactly(tokenizer):
    cache = CompileCache()
    compiler = compiler_for(tokenizer, cache=cache)
    first = compiler.compile(regex_spec(r"[0-9]{3}"))
    second = compiler.compile(regex_spec(r"[0-9]{3}"))
    assert first is second
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.size, stats.evictions) == (1, 1, 1, 0)


def test_property_order_is_generation_order(compiler, tokenizer, lltok):
    spec = json_schema_spec({"type": "object", "properties": {"z": {"const": 1}, "a": {"const": 2}},
                             "required": ["z", "a"], "additionalProperties": False})
    matcher = compiler.compile(spec).matcher()
    assert matcher.forced_text() == b'{"z":1,"a":2}'


def test_equal_json_specs_share_a_compiled_constraint(tokenizer):
    cache = CompileCache()
    compiler = compiler_for(tokenizer, cache=cache)
    a = compiler.compile(json_schema_spec({"type": "integer", "minimum": 0}))
    b = compiler.compile(json_schema_spec('{"type": "integer",\n "minimum": 0}'))
    assert a is b and cache.stats().hits == 1


def test_failed_compiles_are_not_cached(tokenizer):
    cache = CompileCache()
    compiler = compiler_for(tokenizer, cache=cache)
    for _ in range(2):
        with pytest.raises(ConstraintError):
            compiler.compile(RegexSpec("[a-"))
    assert cache.stats().misses == 2 and len(cache) == 0


def test_lru_evicts_the_513th_spec(tokenizer):
    cache = CompileCache()
    assert cache.maxsize == 512
    compiler = compiler_for(tokenizer, cache=cache)
    specs = [ChoiceSpec((f"c{i}",)) for i in range(513)]
    for spec in specs[:512]:
        compiler.compile(spec)
    compiler.compile(specs[0])  # touch: now most recent, so specs[1] is the oldest
    compiler.compile(specs[512])
    stats = cache.stats()
    assert (stats.size, stats.evictions, stats.misses, stats.hits) == (512, 1, 513, 1)
    assert (specs[0], compiler.fingerprint) in cache
    assert (specs[1], compiler.fingerprint) not in cache
    compiler.compile(specs[1])
    assert cache.stats().misses == 514


def test_compiler_for_is_shared_per_vocabulary(tokenizer):
    assert compiler_for(tokenizer) is compiler_for(tokenizer)
    assert compiler_for(tokenizer).cache is default_cache()
    own = compiler_for(tokenizer, cache=CompileCache(4))
    assert own.ladder is compiler_for(tokenizer).ladder  # one llguidance tokenizer
    fp = tokenizer_fingerprint(tokenizer)
    assert fp == tokenizer_fingerprint(tokenizer) and len(fp) == 64


def test_compile_cache_is_thread_safe(tokenizer):
    cache = CompileCache()
    compiler = compiler_for(tokenizer, cache=cache)
    specs = [regex_spec(rf"x{{{i}}}") for i in range(8)]
    results: list[list[Any]] = []
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            rng = random.Random(seed)
            mine = [compiler.compile(specs[rng.randrange(8)]) for _ in range(40)]
            for compiled in mine[:5]:
                compiled.matcher().fill_bitmask(allocate_token_bitmask(1, compiler.vocab_size, kind="numpy"))
            results.append(mine)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    stats = cache.stats()
    assert stats.hits + stats.misses == 6 * 40
    assert stats.size == 8
    by_pattern: dict[str, set[int]] = {}
    for mine in results:
        for compiled in mine:
            by_pattern.setdefault(compiled.spec.pattern, set()).add(id(compiled))
    assert all(len(ids) == 1 for ids in by_pattern.values())  # one stored object per spec


def test_compile_cache_rejects_bad_size():
    with pytest.raises(ValueError):
        CompileCache(0)


# --- bitmasks ------------------------------------------------------------------------------


def test_torch_and_numpy_masks_agree_and_apply(compiler, tokenizer):
    import torch

    spec = ChoiceSpec(("yes", "no"))
    tmask = allocate_token_bitmask(2, compiler.vocab_size)
    nmask = allocate_token_bitmask(2, compiler.vocab_size, kind="numpy")
    compiler.compile(spec).matcher().fill_bitmask(tmask, 1)
    compiler.compile(spec).matcher().fill_bitmask(nmask, 1)
    assert np.array_equal(tmask.numpy(), nmask)
    allowed = allowed_token_ids(tmask, 1, compiler.vocab_size)
    assert len(allowed_token_ids(tmask, 0, compiler.vocab_size)) == compiler.vocab_size  # row 0 untouched
    logits = torch.randn(2, compiler.vocab_size + 64)  # a model may pad its vocabulary
    apply_token_bitmask_inplace(logits, tmask)
    finite = torch.nonzero(torch.isfinite(logits[1])).flatten().numpy()
    assert np.array_equal(finite, allowed)
    assert torch.isfinite(logits[0, :compiler.vocab_size]).all()
    assert not torch.isfinite(logits[:, compiler.vocab_size:]).any()
    one = torch.zeros(compiler.vocab_size)
    apply_token_bitmask_inplace(one, tmask[1])
    assert np.array_equal(torch.nonzero(torch.isfinite(one)).flatten().numpy(), allowed)
    assert {tokenizer.decode([int(t)]) for t in allowed} >= {"yes", "no"}


def test_accelerator_unpacking_path_agrees_with_cpu_path():
    import torch

    from structgen.constraints.bitmask import _apply_table, _apply_unpacked

    gen = torch.Generator().manual_seed(0)
    mask = torch.randint(-2**31, 2**31 - 1, (3, 40), dtype=torch.int32, generator=gen)
    a, b = torch.zeros(3, 1270), torch.zeros(3, 1270)
    _apply_unpacked(a, mask, 1270)
    _apply_table(b, mask, 1270)
    assert torch.equal(a, b)
    for row in range(3):
        expected = [t for t in range(1270) if (int(mask[row, t // 32]) >> (t % 32)) & 1]
        assert torch.nonzero(torch.isfinite(a[row])).flatten().tolist() == expected


def test_fill_bitmask_misuse_raises(compiler):
    import torch

    matcher = compiler.compile(dtype_spec(int)).matcher()
    words = bitmask_words(compiler.vocab_size)
    with pytest.raises(TypeError):
        matcher.fill_bitmask(np.zeros((1, words), dtype=np.int64))
    with pytest.raises(ValueError):
        matcher.fill_bitmask(np.zeros((1, words - 1), dtype=np.int32))
    with pytest.raises(IndexError):
        matcher.fill_bitmask(np.zeros((1, words), dtype=np.int32), 1)
    with pytest.raises(ValueError):
        matcher.fill_bitmask(np.zeros(words, dtype=np.int32))
    with pytest.raises(TypeError):
        matcher.fill_bitmask([[0] * words])
    with pytest.raises(TypeError):
        matcher.fill_bitmask(torch.zeros((1, words), dtype=torch.float32))
    with pytest.raises(ValueError):
        matcher.fill_bitmask(torch.zeros((words, 2), dtype=torch.int32)[:, :1].t())
