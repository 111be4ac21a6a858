"""The families the engine runs (Llama 2/3, Qwen2/2.5, Qwen3, Mistral), each against
transformers' own logits on a tiny random model built here (2 layers; nothing downloaded),
through the forward (packed and chunked prefill, plain and cascade decode) and through the
whole engine (its scheduler, prefix cache and cascade batches). A model it cannot run
raises a BackendError naming what is missing."""

from __future__ import annotations

import random

import pytest
import torch

import structgen as sg
from structgen.backends.embedded.engine import Engine, EngineConfig
from structgen.backends.embedded.generation import GenSequence
from structgen.backends.embedded.model import DecoderModel, SeqInput
from structgen.contract.backend import GenerateRequest, SamplingParams

TOL = 1e-3  # fp32 logits vs transformers
VOCAB = 256
COMMON = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
          "max_position_embeddings": 512, "initializer_range": 0.2}  # peaked logits


def _build(family: str):
    import transformers as tf

    if family == "llama2":
        cfg, cls = tf.LlamaConfig(**COMMON), tf.LlamaForCausalLM
    elif family == "llama3":  # Llama 3's rope scaling (frequencies rescaled by band)
        cfg = tf.LlamaConfig(**COMMON, rope_parameters={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32, "rope_theta": 500000.0})
        cls = tf.LlamaForCausalLM
    elif family == "llama-bias":  # attention_bias / mlp_bias
        cfg, cls = tf.LlamaConfig(**COMMON, attention_bias=True, mlp_bias=True), tf.LlamaForCausalLM
    elif family == "qwen2":  # q/k/v bias, tied embeddings
        cfg, cls = tf.Qwen2Config(**COMMON, tie_word_embeddings=True), tf.Qwen2ForCausalLM
    elif family == "qwen2-window":  # the second layer slides (use_sliding_window)
        cfg = tf.Qwen2Config(**COMMON, use_sliding_window=True, sliding_window=16, max_window_layers=1)
        cls = tf.Qwen2ForCausalLM
    elif family == "qwen3":  # RMSNorm of each q / k head
        cfg, cls = tf.Qwen3Config(**COMMON), tf.Qwen3ForCausalLM
    elif family == "mistral":  # every layer slides
        cfg, cls = tf.MistralConfig(**COMMON, sliding_window=16), tf.MistralForCausalLM
    else:
        raise AssertionError(family)
    torch.manual_seed(0)
    model = cls(cfg).eval()
    if cfg.model_type == "qwen2" and not family.endswith("window"):
        assert model.model.layers[0].self_attn.q_proj.bias is not None
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


FAMILIES = ["llama2", "llama3", "llama-bias", "qwen2", "qwen2-window", "qwen3", "mistral"]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    hf = _build(request.param)
    return request.param, hf, DecoderModel.from_hf(hf)


def _hf_logits(hf, ids):
    with torch.inference_mode():
        return hf(torch.tensor([ids])).logits[0].float()


def _ids(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(n)]


def test_family_prefill_chunks_and_decode_match_transformers(family):
    name, hf, m = family
    ids = _ids(1, 48)  # longer than the 16-token windows
    ref = _hf_logits(hf, ids)
    kv = m.new_kv_pool(128)
    slots = [100 - 2 * i for i in range(len(ids))]  # non-contiguous, descending
    out = m.forward(m.prepare([SeqInput(ids, slots, logits="all")]), kv)
    assert (out - ref).abs().max() < TOL, name
    kv = m.new_kv_pool(128)
    m.forward(m.prepare([SeqInput(ids[:20], slots[:20], logits="none")]), kv)
    out = m.forward(m.prepare([SeqInput(ids[20:-3], slots[:-3], logits="all")]), kv)
    assert (out - ref[20:-3]).abs().max() < TOL, name
    for j in range(len(ids) - 3, len(ids)):  # three decode steps
        out = m.forward(m.prepare([SeqInput(ids[j:j + 1], slots[:j + 1])]), kv)
        assert (out[0] - ref[j]).abs().max() < TOL, name


def test_family_cascade_decode_matches_plain_and_transformers(family):
    name, hf, m = family
    prefix = _ids(2, 40)
    tails = [_ids(10 + i, n) for i, n in enumerate((1, 3, 5, 2))]
    p = len(prefix)
    kv = m.new_kv_pool(p + 100)
    m.forward(m.prepare([SeqInput(prefix, list(range(p)), logits="none")]), kv)
    inputs = []
    for i, t in enumerate(tails):
        slots = list(range(p)) + list(range(p + 20 * i, p + 20 * i + len(t)))
        if len(t) > 1:
            m.forward(m.prepare([SeqInput(t[:-1], slots[:-1], logits="none")]), kv)
        inputs.append(SeqInput(t[-1:], slots))
    cascade, plain = m.prepare(inputs, cascade=None), m.prepare(inputs, cascade=False)
    oc, op = m.forward(cascade, kv), m.forward(plain, kv)
    assert (oc - op).abs().max() < 1e-4, name
    for t, row in zip(tails, oc, strict=True):
        assert (row - _hf_logits(hf, prefix + t)[-1]).abs().max() < TOL, name
    full = [w for w in m.windows if w is None]
    if full:  # layers with full attention read the 40-token prefix once
        assert cascade.plans[None].decode.cascade
    if 16 in m.windows:  # past the window nothing is shared: each reads its own window
        assert not cascade.plans[16].decode.cascade


def _flag_free_seq(req: GenerateRequest, prompt: list[int]) -> GenSequence:
    return GenSequence(req, prompt, decode=lambda ids: "".join(chr(0x100 + i) for i in ids),
                       eos_ids=frozenset(), vocab=VOCAB)


def test_family_runs_through_the_engine_like_transformers(family):
    """Greedy decoding in the engine (prefix cache, one batch, cascade over the shared
    prompt): every token is transformers' argmax and its logprob transformers' own."""
    name, hf, _ = family
    prefix = _ids(3, 40)
    prompts = [prefix + _ids(20 + i, 2 + i) for i in range(4)]
    engine = Engine(hf, EngineConfig(kv_tokens=1024))
    try:
        params = SamplingParams(max_new_tokens=8, return_logprob=True)
        seqs = [_flag_free_seq(GenerateRequest("", params), p) for p in prompts]
        outcomes = engine.generate(seqs)
        assert all(o.error is None for o in outcomes), outcomes
        stats = engine.stats()
        assert stats["cached_tokens"] > 0 and stats["decode_steps"] >= 7
        for prompt, seq in zip(prompts, seqs, strict=True):
            assert len(seq.out_ids) == 8
            logp = torch.log_softmax(_hf_logits(hf, prompt + seq.out_ids), dim=-1)
            for j, (lp, tok, _) in enumerate(seq.logprobs):
                row = logp[len(prompt) - 1 + j]
                assert abs(lp - float(row[tok])) < TOL, name
                assert float(row[tok]) >= float(row.max()) - TOL, name  # greedy = HF's argmax
    finally:
        engine.close()


# -- what the engine cannot run -------------------------------------------------------------
def _tiny(cfg_cls, model_cls, **kw):
    torch.manual_seed(0)
    return model_cls(cfg_cls(**{**COMMON, **kw})).eval()


def test_an_unsupported_model_type_is_named():
    import transformers as tf

    gpt2 = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2))
    with pytest.raises(sg.BackendError, match="model_type 'gpt2'"):
        DecoderModel.from_hf(gpt2)


@pytest.mark.parametrize(("kw", "named"), [
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}},
     "rope_type='dynamic'"),
])
def test_an_unsupported_config_field_is_named(kw, named):
    import transformers as tf

    with pytest.raises(sg.BackendError, match=named):
        DecoderModel.from_hf(_tiny(tf.LlamaConfig, tf.LlamaForCausalLM, **kw))
