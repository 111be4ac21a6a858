"""A byte-level BPE written with byte-fallback parts (what transformers 5.17 writes when it
converts the default model's GGUF) gets the same token bytes, and so the same masks, as
the plain byte-level one. Seen on a GPU machine with transformers 5.17: ``Ġ"`` read as the
bytes C4 A0 22, and a forced token rejected by its own grammar."""

from __future__ import annotations

import json

import pytest

from structgen.constraints.engines.hf_tokenizer import is_byte_level, normalize_tokenizer_json
from structgen.constraints.engines.llguidance import LLGuidanceEngine
from structgen.constraints.spec import regex_spec

# transformers 5.17's conversion of SmolLM2's GGUF tokenizer, as read on that machine
_FALLBACK_DECODER = {"type": "Sequence", "decoders": [
    {"type": "ByteFallback"}, {"type": "Fuse"},
    {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
    {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}]}


def _with_fallback_parts(tokenizer):
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    spec["model"]["byte_fallback"] = True
    spec["decoder"] = _FALLBACK_DECODER
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
                                   eos_token=tokenizer.eos_token)


@pytest.fixture(scope="module")
def engines(tokenizer):
    return LLGuidanceEngine(tokenizer), LLGuidanceEngine(_with_fallback_parts(tokenizer))


def test_every_token_has_the_same_bytes_as_in_the_plain_byte_level_tokenizer(engines, tokenizer):
    plain, written = (e.token_table() for e in engines)
    assert plain.size == written.size
    differ = [i for i in range(plain.size) if plain.tokens[i] != written.tokens[i]]
    assert differ == []
    space_quote = tokenizer.convert_tokens_to_ids('Ġ"')
    assert written.tokens[space_quote] == b' "'


@pytest.mark.parametrize("make", [
    lambda: regex_spec(r'say "yes", then stop'),
    lambda: regex_spec(r'\{"note": "a b c", "n": \[1, 2\]\}'),
])
def test_forced_tokens_are_accepted_by_their_own_grammar(engines, make):
    _, written = engines
    m = written.compile_spec(make()).matcher()
    steps = 0
    while not m.is_accepting() and steps < 64:
        forced = m.forced_tokens()
        assert forced, "a grammar with one answer forces every token"
        for tok in forced:
            assert m.consume(tok), m.error()
        steps += 1
    assert m.is_accepting()


def test_a_text_with_spaces_is_allowed_token_by_token(engines, tokenizer):
    _, written = engines
    m = written.compile_spec(regex_spec(r'[a-z]+( "[a-z]+")+')).matcher()
    for tok in tokenizer.encode('ab "cd" "ef"', add_special_tokens=False):
        assert m.consume(tok), m.error()
    assert m.is_accepting()


def _bpe(vocab, *, pre="ByteLevel", fallback=True):
    return {"model": {"type": "BPE", "vocab": vocab, "merges": [], "byte_fallback": fallback},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": pre}]},
            "decoder": dict(_FALLBACK_DECODER)}


def test_only_a_byte_level_bpe_without_byte_tokens_is_rewritten():
    rewritten = _bpe({"a": 0, "Ġa": 1})
    assert is_byte_level(rewritten) and normalize_tokenizer_json(rewritten)
    assert rewritten["model"]["byte_fallback"] is False
    assert rewritten["decoder"]["type"] == "ByteLevel"
    assert not normalize_tokenizer_json(rewritten)  # idempotent
    sentencepiece = _bpe({"a": 0, "<0x20>": 1})  # real byte fallback: left alone
    metaspace = _bpe({"a": 0, "▁a": 1}, pre="Metaspace")
    for spec in (sentencepiece, metaspace):
        before = json.dumps(spec)
        assert not normalize_tokenizer_json(spec)
        assert json.dumps(spec) == before
