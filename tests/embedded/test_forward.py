"""The owned Llama forward (llama.py, attention.py, kv_pool.py) against transformers.

Kernel tests run on random tensors; the rest use the real SmolLM2 weights (``model``).
"""

from __future__ import annotations

import pytest
import torch

from structgen.backends.embedded.attention import (
    attend_chunks,
    attend_padded,
    attend_shared,
    fused_available,
    merge_partials,
)
from structgen.backends.embedded.kv_pool import KVPool, SlotRange

TOL = 1e-3  # fp32 logits vs transformers

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    # return the n-th Fibonacci number\n",
    "A short list of fruits: apples, pears,",
]


# -- kernels and pool (no model) -----------------------------------------------------------
@pytest.mark.parametrize("fused", [False, True], ids=["matmul", "fused"])
def test_cascade_merge_equals_plain_attention(fused):
    if fused and not fused_available(torch.zeros(1)):
        pytest.skip("this torch has no fused CPU attention kernel")
    g = torch.Generator().manual_seed(0)
    b, h, kvh, d, p, s = 5, 9, 3, 64, 40, 7
    q = torch.randn(b, h, d, generator=g)
    kp, vp = torch.randn(p, kvh, d, generator=g), torch.randn(p, kvh, d, generator=g)
    ks, vs = torch.randn(b, s, kvh, d, generator=g), torch.randn(b, s, kvh, d, generator=g)
    lens = torch.tensor([7, 1, 3, 7, 5])
    mask = torch.arange(s)[None] < lens[:, None]
    full_k = torch.cat([kp.expand(b, -1, -1, -1), ks], 1)
    full_v = torch.cat([vp.expand(b, -1, -1, -1), vs], 1)
    full_mask = torch.cat([torch.ones(b, p, dtype=torch.bool), mask], 1)
    plain, _ = attend_padded(q, full_k, full_v, full_mask, 0.125, fused=fused)
    o1, l1 = attend_shared(q, kp, vp, 0.125, fused=fused)
    o2, l2 = attend_padded(q, ks, vs, mask, 0.125, fused=fused)
    assert l1.dtype == l2.dtype == torch.float32 and l1.shape == l2.shape == (b, h)
    assert (merge_partials(o1, l1, o2, l2) - plain).abs().max() < 1e-5
    # reference: per-sequence softmax with repeat_kv
    for i in range(b):
        k = full_k[i, : p + lens[i]].repeat_interleave(h // kvh, dim=1)
        v = full_v[i, : p + lens[i]].repeat_interleave(h // kvh, dim=1)
        w = torch.softmax(torch.einsum("hd,lhd->hl", q[i], k) * 0.125, -1)
        assert (torch.einsum("hl,lhd->hd", w, v) - plain[i]).abs().max() < 1e-5


def _chunk_case(g: torch.Generator, dtype: torch.dtype = torch.float32):
    """Three entries: (own context, new tokens) = (5, 1), (0, 3), (2, 7), padded to N=7, L=9."""
    h, kvh, d = 9, 3, 64
    ctx, new = [5, 0, 2], [1, 3, 7]
    e, n, length = len(ctx), max(new), max(c + k for c, k in zip(ctx, new, strict=True))
    q = torch.randn(e, n, h, d, generator=g).to(dtype)
    k, v = torch.randn(e, length, kvh, d, generator=g).to(dtype), torch.randn(e, length, kvh, d, generator=g).to(dtype)
    mask = torch.zeros(e, n, length, dtype=torch.bool)
    for i, (c, m) in enumerate(zip(ctx, new, strict=True)):
        for j in range(n):
            if j < m:
                mask[i, j, :c + j + 1] = True
            else:
                mask[i, j, 0] = True  # a padding row
    return q, k, v, mask, ctx, new


@pytest.mark.parametrize("fused", [False, True], ids=["matmul", "fused"])
def test_chunk_attention_equals_per_query_softmax(fused):
    """Each new token of an entry reads the entry's keys up to its own position (causal),
    with GQA as repeat_kv; its log-sum-exp is the scores' own."""
    if fused and not fused_available(torch.zeros(1)):
        pytest.skip("this torch has no fused CPU attention kernel")
    q, k, v, mask, ctx, new = _chunk_case(torch.Generator().manual_seed(2))
    out, lse = attend_chunks(q, k, v, mask, 0.125, fused=fused)
    h, kvh = q.shape[2], k.shape[2]
    assert out.shape == q.shape and lse.shape == q.shape[:3] and lse.dtype == torch.float32
    for i, (c, m) in enumerate(zip(ctx, new, strict=True)):
        for j in range(m):
            kk = k[i, :c + j + 1].repeat_interleave(h // kvh, dim=1)
            vv = v[i, :c + j + 1].repeat_interleave(h // kvh, dim=1)
            s = torch.einsum("hd,lhd->hl", q[i, j], kk) * 0.125
            assert (torch.einsum("hl,lhd->hd", torch.softmax(s, -1), vv) - out[i, j]).abs().max() < 1e-5
            assert (torch.logsumexp(s, -1) - lse[i, j]).abs().max() < 1e-4


def test_fused_and_matmul_kernels_agree_in_bfloat16():
    """The two kernel paths (and their log-sum-exps) agree in the dtype the CPU engine runs."""
    if not fused_available(torch.zeros(1, dtype=torch.bfloat16)):
        pytest.skip("this torch has no fused CPU attention kernel")
    g = torch.Generator().manual_seed(1)
    b, h, kvh, d, p, s = 6, 9, 3, 64, 50, 11
    q = torch.randn(b, h, d, generator=g).bfloat16()
    kp, vp = torch.randn(p, kvh, d, generator=g).bfloat16(), torch.randn(p, kvh, d, generator=g).bfloat16()
    ks, vs = torch.randn(b, s, kvh, d, generator=g).bfloat16(), torch.randn(b, s, kvh, d, generator=g).bfloat16()
    mask = torch.arange(s)[None] < torch.tensor([11, 1, 4, 9, 11, 2])[:, None]
    for args, fn in (((q, kp, vp, 0.125), attend_shared), ((q, ks, vs, mask, 0.125), attend_padded)):
        (o1, l1), (o2, l2) = fn(*args, fused=True), fn(*args, fused=False)  # type: ignore[operator]
        assert o1.dtype == o2.dtype == torch.bfloat16
        assert (o1.float() - o2.float()).abs().max() < 0.05 and (l1 - l2).abs().max() < 0.05
    q, k, v, mask, _, new = _chunk_case(g, torch.bfloat16)
    (o1, l1), (o2, l2) = (attend_chunks(q, k, v, mask, 0.125, fused=f) for f in (True, False))
    real = torch.arange(q.shape[1])[None] < torch.tensor(new)[:, None]  # padding rows aside
    assert o1.dtype == o2.dtype == torch.bfloat16
    assert (o1[real].float() - o2[real].float()).abs().max() < 0.05 and (l1[real] - l2[real]).abs().max() < 0.05


def test_kv_pool_write_read_contiguous_and_gathered():
    pool = KVPool(2, 3, 4, 16)
    k, v = torch.randn(3, 3, 4), torch.randn(3, 3, 4)
    pool.write(1, torch.tensor([9, 2, 5]), k, v)
    rk, rv = pool.read(1, SlotRange.of([9, 2, 5]))
    assert torch.equal(rk, k) and torch.equal(rv, v)
    assert SlotRange.of([4, 5, 6]).contiguous and not SlotRange.of([4, 6]).contiguous
    assert SlotRange.of(torch.tensor([4, 5, 6])).contiguous
    assert pool.k[0].abs().sum() == 0 and pool.k[1, [0, 1, 3]].abs().sum() == 0
    with pytest.raises(ValueError):
        KVPool(0, 3, 4, 16)


# -- the real model -------------------------------------------------------------------------
@pytest.fixture(scope="module", params=["native", "torch"])
def models(request):
    """The model's forward twice: with the fused CPU kernels (``native``) and with its torch
    code only; every test below runs on both."""
    from structgen.backends.embedded.loader import load_model
    from structgen.backends.embedded.model import DecoderModel

    lm = load_model()
    m = DecoderModel.from_hf(lm.model, native=request.param == "native")
    assert (m.kernels is not None) == (request.param == "native")  # the kernels build here
    return lm.model, m, lm.tokenizer


def _ids(tok, text):
    return tok(text)["input_ids"]


def _hf_logits(hf, ids):
    with torch.inference_mode():
        return hf(torch.tensor([ids])).logits[0].float()


@pytest.mark.model
def test_weights_are_shared_not_copied(models):
    hf, m, _ = models
    assert m.embed.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    layer, hf_layer = m.layers[0], hf.model.layers[0]
    a, mlp = hf_layer.self_attn, hf_layer.mlp
    # q, k, v (and gate, up) are fused into one matrix; the transformers modules now view it
    for whole, mods in ((layer.qkv, [a.q_proj, a.k_proj, a.v_proj]), (layer.gate_up, [mlp.gate_proj, mlp.up_proj])):
        row = 0
        for mod in mods:
            assert mod.weight.untyped_storage().data_ptr() == whole.untyped_storage().data_ptr()
            assert torch.equal(mod.weight, whole[row:row + mod.weight.shape[0]])
            row += mod.weight.shape[0]
        assert row == whole.shape[0]
    assert layer.o.data_ptr() == a.o_proj.weight.data_ptr() and layer.down.data_ptr() == mlp.down_proj.weight.data_ptr()


@pytest.mark.model
def test_packed_prefill_matches_transformers(models):
    from structgen.backends.embedded.model import SeqInput

    hf, m, tok = models
    ids = [_ids(tok, p) for p in PROMPTS]
    kv = m.new_kv_pool(256)
    starts = [0, 60, 130]
    batch = m.prepare([SeqInput(x, list(range(s, s + len(x))), logits="all")
                       for x, s in zip(ids, starts, strict=True)])
    out = batch.split(m.forward(batch, kv))
    for x, o in zip(ids, out, strict=True):
        assert o.shape == (len(x), m.lm_head.shape[0])
        assert (o - _hf_logits(hf, x)).abs().max() < TOL


@pytest.mark.model
def test_chunked_prefill_then_decode_matches_transformers(models):
    from structgen.backends.embedded.model import SeqInput

    hf, m, tok = models
    ids = _ids(tok, PROMPTS[1])
    ref = _hf_logits(hf, ids)
    slots = [40 - 2 * i for i in range(len(ids))]  # non-contiguous, descending
    kv = m.new_kv_pool(64)
    h = len(ids) // 2
    m.forward(m.prepare([SeqInput(ids[:h], slots[:h], logits="none")]), kv)
    out = m.forward(m.prepare([SeqInput(ids[h:-3], slots[:-3], logits="all")]), kv)
    assert (out - ref[h:-3]).abs().max() < TOL
    for j in range(len(ids) - 3, len(ids)):  # three decode steps
        out = m.forward(m.prepare([SeqInput(ids[j:j + 1], slots[:j + 1])]), kv)
        assert (out[0] - ref[j]).abs().max() < TOL


@pytest.mark.model
def test_mixed_batch_prefill_chunk_fresh_prefill_and_decodes(models):
    from structgen.backends.embedded.model import SeqInput

    hf, m, tok = models
    a, b, c = (_ids(tok, p) for p in PROMPTS)
    kv = m.new_kv_pool(256)
    sa, sb, sc = list(range(40)), list(range(100, 140)), list(range(200, 240))
    # a: first 4 tokens cached; b: all but the last cached; c: nothing cached
    m.forward(m.prepare([SeqInput(a[:4], sa[:4]), SeqInput(b[:-1], sb[:len(b) - 1])]), kv)
    batch = m.prepare([SeqInput(a[4:], sa[:len(a)], logits="all"),
                       SeqInput(b[-1:], sb[:len(b)]),
                       SeqInput(c, sc[:len(c)], logits="last")])
    oa, ob, oc = batch.split(m.forward(batch, kv))
    assert (oa - _hf_logits(hf, a)[4:]).abs().max() < TOL
    assert (ob[0] - _hf_logits(hf, b)[-1]).abs().max() < TOL
    assert (oc[0] - _hf_logits(hf, c)[-1]).abs().max() < TOL


@pytest.mark.model
def test_cascade_decode_equals_plain_and_transformers(models):
    from structgen.backends.embedded.model import SeqInput

    hf, m, tok = models
    prefix = _ids(tok, "You are a helpful assistant. Answer briefly and precisely. " * 4)
    tails = [_ids(tok, t) for t in (" Cats", " The dog barked", " Why?", " One two three four")]
    p = len(prefix)
    kv = m.new_kv_pool(p + 100)
    m.forward(m.prepare([SeqInput(prefix, list(range(p)), logits="none")]), kv)
    slots = []
    for i, t in enumerate(tails):  # each tail in its own slots after the shared prefix
        own = list(range(p + 20 * i, p + 20 * i + len(t)))
        slots.append(list(range(p)) + own)
        if len(t) > 1:
            m.forward(m.prepare([SeqInput(t[:-1], slots[-1][:-1], logits="none")]), kv)
    inputs = [SeqInput(t[-1:], s) for t, s in zip(tails, slots, strict=True)]
    cascade = m.prepare(inputs, cascade=None)
    plain = m.prepare(inputs, cascade=False)
    assert cascade.plan.decode.cascade and len(cascade.plan.decode.prefix) == p
    assert not plain.plan.decode.cascade
    oc, op = m.forward(cascade, kv), m.forward(plain, kv)
    assert (oc - op).abs().max() < 1e-4
    for t, row in zip(tails, oc, strict=True):
        assert (row - _hf_logits(hf, prefix + t)[-1]).abs().max() < TOL


def test_cascade_groups_split_where_prefixes_diverge():
    from structgen.backends.embedded.attention import AttentionPlan

    a, b = list(range(100)), list(range(40)) + list(range(500, 560))  # share 40 slots
    seqs = [a + [1000 + i] for i in range(3)] + [b + [2000 + i] for i in range(2)]
    seqs.append(list(range(3000, 3050)))  # shares nothing
    rows = [slice(i, i + 1) for i in range(len(seqs))]
    plan = AttentionPlan.build(rows, [torch.tensor(s) for s in seqs], torch.device("cpu"))
    groups = sorted((len(g.prefix), sorted(plan.decode.rows[g.queries].tolist()))
                    for g in plan.decode.groups)
    assert groups == [(100, [0, 1, 2]), (100, [3, 4])]  # two groups, not one of 40
    assert plan.decode.index.shape == (6, 50)  # own suffixes; the loner reads all its 50
    assert plan.decode.in_order  # groups of neighbours, then the loner: rows read in batch order
    mixed = [seqs[i] for i in (0, 3, 1, 4, 2, 5)]  # the groups' rows interleaved
    interleaved = AttentionPlan.build(rows, [torch.tensor(s) for s in mixed], torch.device("cpu"))
    assert sorted(sorted(interleaved.decode.rows[g.queries].tolist()) for g in interleaved.decode.groups) \
        == [[0, 2, 4], [1, 3]]
    assert not interleaved.decode.in_order
    assert interleaved.decode.rows.tolist() == [0, 2, 4, 1, 3, 5]  # each group's members in batch order
    small = AttentionPlan.build(rows[:2], [torch.tensor(s[:20]) for s in seqs[:2]], torch.device("cpu"))
    assert not small.decode.cascade  # 19 shared slots < min_shared


@pytest.mark.model
def test_two_prefix_groups_cascade_equals_plain_and_transformers(models):
    from structgen.backends.embedded.model import SeqInput

    hf, m, tok = models
    prefixes = [_ids(tok, "You are a helpful assistant. Answer briefly and precisely. " * 3),
                _ids(tok, "Translate every sentence into French, keeping names as they are. " * 3)]
    tails = [" Cats", " The dog", " Why?"]
    kv = m.new_kv_pool(600)
    bases, inputs, texts = [0, 300], [], []
    for base, pre in zip(bases, prefixes, strict=True):
        m.forward(m.prepare([SeqInput(pre, list(range(base, base + len(pre))), logits="none")]), kv)
        for i, t in enumerate(tails):
            ids = _ids(tok, t)
            own = list(range(base + 150 + 20 * i, base + 150 + 20 * i + len(ids)))
            slots = list(range(base, base + len(pre))) + own
            if len(ids) > 1:
                m.forward(m.prepare([SeqInput(ids[:-1], slots[:-1], logits="none")]), kv)
            inputs.append(SeqInput(ids[-1:], slots))
            texts.append(pre + ids)
    cascade = m.prepare(inputs, cascade=None)
    assert sorted(len(g.prefix) for g in cascade.plan.decode.groups) == sorted(len(p) for p in prefixes)
    plain = m.prepare(inputs, cascade=False)
    oc, op = m.forward(cascade, kv), m.forward(plain, kv)
    assert (oc - op).abs().max() < 1e-4
    for ids, row in zip(texts, oc, strict=True):
        assert (row - _hf_logits(hf, ids)[-1]).abs().max() < TOL


@pytest.mark.model
def test_cascade_takes_entries_with_a_few_new_tokens(models):
    """Decode entries with several new tokens (forced runs, drafts) read the shared
    prefix with the others, causally over their own tokens; prefill stays apart."""
    from structgen.backends.embedded.model import SeqInput

    hf, m, tok = models
    prefix = _ids(tok, "You are a helpful assistant. Answer briefly and precisely. " * 4)
    tails = [_ids(tok, t) for t in (" Cats", " The dog barked at", " Why not now?")]
    p = len(prefix)
    kv = m.new_kv_pool(p + 200)
    m.forward(m.prepare([SeqInput(prefix, list(range(p)), logits="none")]), kv)
    new = [1, 3, 2]  # new tokens per entry: a decode token, then two short runs
    inputs = []
    for i, (t, k) in enumerate(zip(tails, new, strict=True)):
        slots = list(range(p)) + list(range(p + 30 * i, p + 30 * i + len(t)))
        if len(t) > k:
            m.forward(m.prepare([SeqInput(t[:-k], slots[:len(slots) - k], logits="none")]), kv)
        inputs.append(SeqInput(t[-k:], slots, logits=k))
    fresh = _ids(tok, "A fresh prompt with nothing cached at all")
    fresh_slots = list(range(p + 120, p + 120 + len(fresh)))
    inputs.append(SeqInput(fresh, fresh_slots, logits="last"))
    cascade = m.prepare(inputs, cascade=None)
    plain = m.prepare(inputs, cascade=False)
    assert cascade.plan.decode.cascade and len(cascade.plan.decode.rows) == sum(new)
    assert len(cascade.plan.prefill) == 1  # the fresh prompt
    assert len(plain.plan.prefill) == 3 and not plain.plan.decode.cascade
    oc, op = m.forward(cascade, kv), m.forward(plain, kv)
    assert (oc - op).abs().max() < 1e-4
    for t, k, rows in zip(tails, new, cascade.split(oc)[:3], strict=True):
        assert (rows - _hf_logits(hf, prefix + t)[-k:]).abs().max() < TOL


@pytest.mark.model
def test_cascade_chunks_read_their_own_keys_once(models):
    """Entries with several new tokens in two prefix groups (a prompt's uncached tail, a
    forced run after cached tokens) and one-token decodes beside them: the chunked plan
    (each entry's own keys gathered once, not once per query) equals the plain plan and
    transformers."""
    from structgen.backends.embedded.model import SeqInput

    hf, m, tok = models
    prefixes = [_ids(tok, "You are a helpful assistant. Answer briefly and precisely. " * 3),
                _ids(tok, "Translate every sentence into French, keeping names as they are. " * 3)]
    tails = [(" Cats sleep a lot during the day", 7), (" The dog", 1), (" Why is the sky blue at noon?", 4),
             (" One", 1), (" A longer question about the history of the Roman empire and its roads", 12)]
    kv = m.new_kv_pool(1200)
    inputs, texts, news = [], [], []
    for base, pre in zip((0, 600), prefixes, strict=True):
        m.forward(m.prepare([SeqInput(pre, list(range(base, base + len(pre))), logits="none")]), kv)
        for i, (t, k) in enumerate(tails):
            ids = _ids(tok, t)
            k = min(k, len(ids))
            own = list(range(base + 150 + 40 * i, base + 150 + 40 * i + len(ids)))
            slots = list(range(base, base + len(pre))) + own
            if len(ids) > k:  # the tokens before the new ones are cached
                m.forward(m.prepare([SeqInput(ids[:-k], slots[:-k], logits="none")]), kv)
            inputs.append(SeqInput(ids[-k:], slots, logits=k))
            texts.append(pre + ids)
            news.append(k)
    cascade = m.prepare(inputs, cascade=None)
    dec = cascade.plan.decode
    assert len(dec.groups) == 2 and dec.chunks is not None and not cascade.plan.prefill
    assert dec.chunks.pos.shape[0] == sum(k > 1 for k in news)  # one chunk per several-token entry
    assert dec.index is not None and dec.index.shape[0] == sum(k == 1 for k in news)
    plain = m.prepare(inputs, cascade=False)
    oc, op = m.forward(cascade, kv), m.forward(plain, kv)
    assert (oc - op).abs().max() < 1e-4
    for ids, k, rows in zip(texts, news, cascade.split(oc), strict=True):
        assert (rows - _hf_logits(hf, ids)[-k:]).abs().max() < TOL


@pytest.mark.model
def test_slots_hold_transformers_keys_and_values(models):
    from transformers import DynamicCache

    from structgen.backends.embedded.model import SeqInput

    hf, m, tok = models
    ids = _ids(tok, PROMPTS[0])
    slots = [7 + 3 * i for i in range(len(ids))]
    kv = m.new_kv_pool(64)
    m.forward(m.prepare([SeqInput(ids, slots)]), kv)
    cache = DynamicCache(config=hf.config)
    with torch.inference_mode():
        hf(torch.tensor([ids]), cache=cache, use_cache=True)
    for layer in (0, 15, 29):
        want_k = cache.layers[layer].keys[0].transpose(0, 1)  # [L, kv, d]
        want_v = cache.layers[layer].values[0].transpose(0, 1)
        assert (kv.k[layer, slots] - want_k).abs().max() < 1e-4
        assert (kv.v[layer, slots] - want_v).abs().max() < 1e-4
    untouched = sorted(set(range(64)) - set(slots))
    assert kv.k[:, untouched].abs().sum() == 0 and kv.v[:, untouched].abs().sum() == 0


@pytest.mark.model
def test_batched_greedy_decode_matches_generate(models):
    from structgen.backends.embedded.model import SeqInput

    hf, m, tok = models
    prompts = [_ids(tok, PROMPTS[0]), _ids(tok, PROMPTS[2])]
    kv = m.new_kv_pool(128)
    seqs = [list(p) for p in prompts]
    slots = [list(range(i * 64, i * 64 + len(p))) for i, p in enumerate(prompts)]
    logits = m.forward(m.prepare([SeqInput(s, sl) for s, sl in zip(seqs, slots, strict=True)]), kv)
    for _ in range(20):  # both sequences decode together, one forward per step
        for i, row in enumerate(logits):
            seqs[i].append(int(row.argmax()))
            slots[i].append(slots[i][-1] + 1)
        logits = m.forward(m.prepare([SeqInput(s[-1:], sl) for s, sl in zip(seqs, slots, strict=True)]), kv)
    for p, s in zip(prompts, seqs, strict=True):
        with torch.inference_mode():
            want = hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                               max_new_tokens=20, do_sample=False, pad_token_id=tok.eos_token_id)
        want = want[0].tolist()
        assert len(want) > len(p) + 5 and s[:len(want)] == want
