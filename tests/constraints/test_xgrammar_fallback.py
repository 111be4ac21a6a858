"""XGrammar as the second engine: the ``xgrammar`` rung after llguidance's ``coerce``
(:mod:`structgen.constraints.engines.xgrammar`, composed by :mod:`structgen.constraints.ladder`).

Real XGrammar and the real SmolLM2 tokenizer, no mocks; XGrammar's *absence* is simulated
by making its import fail. Skipped when XGrammar is not installed.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("xgrammar", reason="xgrammar is not installed (pip install 'structgen-lm[xgrammar]')")

from structgen.constraints.base import EngineRefusal
from structgen.constraints.bitmask import allocate_token_bitmask, allowed_token_ids
from structgen.constraints.compiler import CompileCache, compiler_for
from structgen.constraints.engines import xgrammar as xgrammar_engine
from structgen.constraints.engines.llguidance import LLGuidanceCompiled
from structgen.constraints.engines.xgrammar import XGrammarCompiled, XGrammarMatcher
from structgen.constraints.ladder import RUNGS
from structgen.constraints.spec import JsonSchemaSpec, json_schema_spec
from structgen.constraints.validation import validate_output
from structgen.contract.backend import GenerateRequest, GenerateResult, SamplingParams
from structgen.errors import OutputValidationError

# llguidance cannot compile these exactly (a lookahead pattern, uniqueItems, contains);
# XGrammar can (it ignores what it does not enforce, so its grammar is wider, never narrower)
LOOKAHEAD = {"type": "string", "pattern": "^(?!foo)[a-z]+$"}
RECORD = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^(?!foo)[a-z]{1,6}$"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "uniqueItems": True, "maxItems": 2},
        "n": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["name", "tags", "n"],
    "additionalProperties": False,
}
CONTAINS = {"type": "array", "items": {"type": "integer"}, "contains": {"const": 3}, "maxItems": 4}


@pytest.fixture(scope="module")
def compiler(tokenizer):
    return compiler_for(tokenizer, cache=CompileCache())


def compact(value):
    return json.dumps(value, separators=(",", ":"))


def allows(mask, token):
    return bool((int(mask[0, token >> 5]) >> (token & 31)) & 1)


def walk(matcher, ids, mask):
    """Fill, check, consume token by token: ``"ok"``, or where it stopped and why."""
    for i, t in enumerate(ids):
        matcher.fill_bitmask(mask, 0)
        if not allows(mask, t):
            return f"masked at {i}"
        if not matcher.consume(t):
            return f"rejected at {i}"
    return "ok"


def test_ladder_has_the_xgrammar_rung_after_coerce():
    """``coerce`` (the exact schema, oneOf read as anyOf) is tighter than XGrammar on
    MaskBench; the rungs below it ignore or drop keywords, XGrammar does not."""
    assert RUNGS[:4] == ("exact", "coerce", "xgrammar", "lenient")


@pytest.mark.parametrize("schema", [LOOKAHEAD, RECORD, CONTAINS], ids=["lookahead", "record", "contains"])
def test_falls_back_to_xgrammar_when_llguidance_cannot_compile_exactly(compiler, schema):
    compiled = compiler.compile(json_schema_spec(schema))
    assert isinstance(compiled, XGrammarCompiled)
    assert compiled.exact is False  # XGrammar accepts some invalid instances: validation guards
    assert any(w.startswith("exact:") for w in compiled.warnings), compiled.warnings
    assert any(w.startswith("engine: xgrammar") for w in compiled.warnings), compiled.warnings
    assert isinstance(compiled.matcher(), XGrammarMatcher)
    assert compiler.compile(json_schema_spec(schema)) is compiled  # cached like any other


def test_exactly_compilable_schema_stays_on_llguidance(compiler):
    compiled = compiler.compile(json_schema_spec({"type": "object", "properties": {"a": {"type": "integer"}}}))
    assert isinstance(compiled, LLGuidanceCompiled) and compiled.exact


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("value", [
    {"name": "bar", "tags": ["a", "b"], "n": 3},
    {"n": 0, "tags": [], "name": "zz"},  # keys in another order: JSON objects are unordered
])
def test_every_token_of_a_valid_instance_is_allowed(compiler, tokenizer, kind, value):
    compiled = compiler.compile(json_schema_spec(RECORD))
    mask = allocate_token_bitmask(1, compiler.vocab_size, kind=kind)
    m = compiled.matcher()
    text = compact(value)
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert walk(m, ids, mask) == "ok"
    eos = compiler.eos_token_id
    m.fill_bitmask(mask, 0)
    assert allows(mask, eos) and m.is_accepting()
    assert m.is_stopped()  # the object is closed: nothing but EOS may follow (as llguidance)
    assert list(allowed_token_ids(mask, 0, compiler.vocab_size)) == [eos]
    assert m.consume(eos) and m.is_stopped()
    assert m.consume(eos)  # EOS after the stop is accepted, as llguidance does
    assert m.num_consumed == len(ids) + 2
    assert validate_output(compiled.spec, text) == value


def test_keys_in_any_order_and_a_repeated_key_is_caught_by_validation(compiler, tokenizer):
    """JSON objects are unordered (XGrammar's any-order mode). That mode counts keys, so a
    repeated key can stand in for a required one -- the embedded model did exactly that;
    the final validation rejects it."""
    compiled = compiler.compile(json_schema_spec(RECORD))
    mask = allocate_token_bitmask(1, compiler.vocab_size, kind="numpy")
    text = '{"n":1,"name":"a","tags":[]}'
    assert walk(compiled.matcher(), tokenizer.encode(text, add_special_tokens=False), mask) == "ok"
    assert validate_output(compiled.spec, text) == {"n": 1, "name": "a", "tags": []}
    text = '{"name":"john","tags":["a","b"],"tags":[]}'
    m = compiled.matcher()
    if walk(m, tokenizer.encode(text, add_special_tokens=False), mask) == "ok" and m.is_accepting():
        with pytest.raises(OutputValidationError):
            validate_output(compiled.spec, text)


def test_eos_only_where_the_text_is_complete(compiler, tokenizer):
    compiled = compiler.compile(json_schema_spec(LOOKAHEAD))
    mask = allocate_token_bitmask(1, compiler.vocab_size, kind="numpy")
    eos = compiler.eos_token_id
    m = compiled.matcher()
    m.fill_bitmask(mask, 0)
    assert not allows(mask, eos) and not m.is_accepting() and not m.is_stopped()
    assert not m.consume(eos) and m.error()  # EOS before the value is complete: rejected
    m = compiled.matcher()
    assert walk(m, tokenizer.encode('"ab"', add_special_tokens=False), mask) == "ok"
    m.fill_bitmask(mask, 0)
    assert allows(mask, eos) and m.is_accepting() and m.is_stopped()


def test_invalid_instances_are_rejected_or_caught_by_final_validation(compiler, tokenizer):
    compiled = compiler.compile(json_schema_spec(RECORD))
    mask = allocate_token_bitmask(1, compiler.vocab_size, kind="numpy")
    # rejected by the mask: an upper-case letter, an unknown key, a tag outside the enum
    for bad in ({"name": "Bar", "tags": [], "n": 1}, {"name": "a", "tags": [], "n": 1, "x": 1},
                {"name": "a", "tags": ["c"], "n": 1}):
        m = compiled.matcher()
        where = walk(m, tokenizer.encode(compact(bad), add_special_tokens=False), mask)
        if where.startswith("rejected"):
            assert m.error() and m.is_stopped() and not m.is_accepting()
        else:
            m.fill_bitmask(mask, 0)
            assert where != "ok" or not allows(mask, compiler.eos_token_id), bad
    # let through by XGrammar (lookahead, uniqueItems are not enforced), caught by validation
    for bad in ({"name": "foo", "tags": [], "n": 1}, {"name": "a", "tags": ["a", "a"], "n": 1}):
        m = compiled.matcher()
        text = compact(bad)
        assert walk(m, tokenizer.encode(text, add_special_tokens=False), mask) == "ok"
        with pytest.raises(OutputValidationError):
            validate_output(compiled.spec, text)


def test_a_bad_token_is_an_error_state_never_an_exception(compiler, tokenizer):
    compiled = compiler.compile(json_schema_spec(LOOKAHEAD))
    mask = allocate_token_bitmask(1, compiler.vocab_size, kind="numpy")
    m = compiled.matcher()
    x = tokenizer.encode("x", add_special_tokens=False)[0]
    assert not m.consume(x)
    assert "not allowed" in (m.error() or "")
    assert m.is_stopped() and not m.is_accepting() and m.forced_tokens() == []
    m.fill_bitmask(mask, 0)  # stopped in error: EOS only, as llguidance
    assert list(allowed_token_ids(mask, 0, compiler.vocab_size)) == [compiler.eos_token_id]
    assert not m.consume(tokenizer.encode('"', add_special_tokens=False)[0])  # stays in error
    m2 = compiled.matcher()
    assert not m2.consume(compiler.vocab_size + 5) and "outside the vocabulary" in (m2.error() or "")
    m3 = compiled.matcher()
    special = next(i for i in range(compiler.vocab_size) if i != compiler.eos_token_id
                   and i in tokenizer.all_special_ids)
    m3.fill_bitmask(mask, 0)
    assert not allows(mask, special) and not m3.consume(special)  # special tokens are never text


def test_misuse_raises_typed_errors(compiler):
    m = compiler.compile(json_schema_spec(LOOKAHEAD)).matcher()
    words = (compiler.vocab_size + 31) // 32
    with pytest.raises(TypeError):
        m.fill_bitmask(np.zeros((1, words), dtype=np.int64), 0)
    with pytest.raises(ValueError):
        m.fill_bitmask(np.zeros((1, words + 1), dtype=np.int32), 0)
    with pytest.raises(IndexError):
        m.fill_bitmask(np.zeros((1, words), dtype=np.int32), 1)
    with pytest.raises(TypeError):
        m.fill_bitmask([[0] * words], 0)
    with pytest.raises(ValueError):
        m.rollback(1)


def test_fills_the_given_row_in_place_with_the_shared_layout(compiler, tokenizer):
    """Bit ``t % 32`` of word ``t // 32``: XGrammar's masks equal llguidance's on a schema
    both compile (mid-number, where both allow exactly the digits and the terminators)."""
    schema = {"type": "array", "items": {"type": "integer"}}
    lcompiled = compiler.compile(json_schema_spec(schema))
    engine, why = compiler.ladder.second_engine()
    assert engine is not None, why
    xcompiled = engine.compile_schema(json_schema_spec(schema), schema, {})
    assert isinstance(xcompiled, XGrammarCompiled)
    ids = tokenizer.encode("[1,23", add_special_tokens=False)
    lm, xm = lcompiled.matcher(), xcompiled.matcher()
    assert lm.consume_many(ids) and xm.consume_many(ids)
    lmask = allocate_token_bitmask(3, compiler.vocab_size, kind="numpy")
    xmask = allocate_token_bitmask(3, compiler.vocab_size, kind="numpy")
    address = xmask.ctypes.data
    lm.fill_bitmask(lmask, 2)
    xm.fill_bitmask(xmask, 2)
    assert xmask.ctypes.data == address  # written in place (DLPack), no copy
    assert (xmask[:2] == -1).all()  # other rows untouched
    assert np.array_equal(xmask[2], lmask[2])


def test_rollback_and_fork(compiler, tokenizer):
    compiled = compiler.compile(json_schema_spec(RECORD))
    mask = allocate_token_bitmask(1, compiler.vocab_size, kind="numpy")
    ids = tokenizer.encode(compact({"name": "ab", "tags": ["b"], "n": 7}), add_special_tokens=False)
    m = compiled.matcher()
    assert m.consume_many(ids) and m.is_stopped()
    assert m.consume(compiler.eos_token_id) and m.consume(compiler.eos_token_id)
    m.rollback(len(ids) + 2)
    assert m.num_consumed == 0 and not m.is_accepting()
    assert walk(m, ids, mask) == "ok"
    m.rollback(3)
    twin = m.fork()
    assert twin.consume_many(ids[-3:]) and twin.is_accepting()
    assert not m.is_accepting() and m.num_consumed == len(ids) - 3
    with pytest.raises(ValueError):
        m.rollback(len(ids))


def test_forced_tokens_are_consumable_whole_tokens(compiler, tokenizer):
    schema = {"type": "object", "properties": {"name": LOOKAHEAD}, "required": ["name"],
              "additionalProperties": False}
    compiled = compiler.compile(json_schema_spec(schema))
    assert isinstance(compiled, XGrammarCompiled)
    m = compiled.matcher()
    assert m.forced_text() == b'{"name":"'  # the only way to start
    forced = m.forced_tokens()
    text = tokenizer.decode(forced)
    assert forced and '{"name":"'.startswith(text)
    assert m.token_bytes(forced) == text.encode()
    assert m.consume_many(forced)
    assert m.forced_text() == b'{"name":"'[len(text):]  # the held-back tail, if any
    draft = m.draft_tokens()
    assert m.token_bytes(draft) == m.forced_text() and m.consume_many(draft)


def test_xgrammar_absent_the_ladder_continues_with_llguidance(tokenizer, monkeypatch):
    monkeypatch.setitem(sys.modules, "xgrammar", None)  # `import xgrammar` now raises ImportError
    monkeypatch.setattr(xgrammar_engine, "_engines", {})  # no engine built before
    compiled = compiler_for(tokenizer, cache=CompileCache()).compile(json_schema_spec(RECORD))
    assert isinstance(compiled, LLGuidanceCompiled) and compiled.exact is False
    assert any(w.startswith("xgrammar: xgrammar is not installed") for w in compiled.warnings), compiled.warnings
    assert not any(w.startswith("engine: xgrammar") for w in compiled.warnings)


def test_switched_off_or_timed_out_the_ladder_continues(tokenizer, monkeypatch):
    monkeypatch.setenv("STRUCTGEN_XGRAMMAR", "0")
    compiled = compiler_for(tokenizer, cache=CompileCache()).compile(json_schema_spec(RECORD))
    assert isinstance(compiled, LLGuidanceCompiled)
    assert any("switched off" in w for w in compiled.warnings), compiled.warnings
    monkeypatch.delenv("STRUCTGEN_XGRAMMAR")
    monkeypatch.setenv("STRUCTGEN_XGRAMMAR_TIMEOUT", "0")
    compiled = compiler_for(tokenizer, cache=CompileCache()).compile(json_schema_spec(RECORD))
    assert isinstance(compiled, LLGuidanceCompiled)
    assert any(w.startswith("xgrammar: compile timed out") for w in compiled.warnings), compiled.warnings


def test_an_xgrammar_compile_error_is_a_typed_refusal(compiler):
    """XGrammar's own exceptions never escape: the engine refuses (the ladder notes why)."""
    engine, why = compiler.ladder.second_engine()
    assert engine is not None, why
    with pytest.raises(EngineRefusal) as info:
        # built without json_schema_spec, which refuses the malformed schema itself
        engine.compile_schema(JsonSchemaSpec('{"type":5}'), {"type": 5}, {})
    assert "Type should be a string" in info.value.reason


def test_import_structgen_does_not_import_xgrammar():
    code = ("import sys, structgen, structgen.constraints.compiler, structgen.constraints.engines.xgrammar; "
            "print(sorted(m for m in ('xgrammar', 'torch', 'tvm_ffi') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


@pytest.mark.model
def test_embedded_backend_generates_under_the_xgrammar_rung(embedded_backend):
    spec = json_schema_spec(RECORD)
    assert isinstance(embedded_backend.compile(spec), XGrammarCompiled)
    tpl = embedded_backend.chat_template()
    prompt = tpl.render([{"role": "user", "content": "Give a short lowercase name, tags and a digit as JSON."}])
    prompt += tpl.role("assistant", [{"role": "user", "content": "x"}]).prefix
    [res] = embedded_backend.generate([GenerateRequest(prompt, SamplingParams(max_new_tokens=48), spec)])
    assert isinstance(res, GenerateResult), res
    assert res.finish_reason == "stop", res
    value = json.loads(res.text)  # well-formed JSON: the mask guarantees that much
    assert isinstance(value, dict) and set(value) <= {"name", "tags", "n"}, res.text
    with contextlib.suppress(OutputValidationError):  # XGrammar let through what it does not enforce:
        assert validate_output(spec, res.text) == value  # final validation caught it
