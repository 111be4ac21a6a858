"""The fused CPU kernels (backends/embedded/native.py, cpu_kernels.c) against the torch code
they replace: random tensors in float32 and bfloat16, then the real model's forward."""

from __future__ import annotations

import logging
import os
import shutil

import pytest
import torch
import torch.nn.functional as F

from structgen.backends.embedded import native
from structgen.backends.embedded.attention import attend_padded
from structgen.backends.embedded.model import _rms_norm

DTYPES = [torch.float32, torch.bfloat16]
IDS = ["f32", "bf16"]


@pytest.fixture(scope="module")
def nk():
    if shutil.which("cc") is None and not os.environ.get("CC"):
        pytest.fail("no C compiler: the kernels cannot be built on this machine")
    k = native.kernels()
    assert k is not None, "the native kernels did not build (see the log)"
    return k


@pytest.fixture(scope="module")
def hf_model():
    from structgen.backends.embedded.loader import load_model

    return load_model().model


def _ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many steps of the storage dtype apart ``a`` and ``b`` are, elementwise."""
    eps = torch.finfo(a.dtype).eps
    scale = torch.maximum(a.float().abs(), b.float().abs()).clamp_min(1e-30)
    return (a.float() - b.float()).abs() / (scale * eps)


# (query heads, KV heads, head_dim, keys): bf16 heads of 64 run the AVX-512 BF16 loop where
# the CPU has it, 4 query heads at a time (9/3: one group of 3; 10/2: 4 + 1; 8/1: 4 + 4;
# 2/2: one), in blocks of 16 keys (23: a block and a part; 40: two and a part); 128: the
# generic loop
SHAPES = [(9, 3, 64, 23), (10, 2, 64, 40), (8, 1, 64, 16), (2, 2, 64, 5), (4, 2, 128, 23)]


def test_the_bf16_attention_is_built_where_the_cpu_has_avx512_bf16(nk):
    flags = native._cpu_flags().split()
    assert nk.bf16_attention == ("avx512_bf16" in flags and "avx512f" in flags)


@pytest.mark.parametrize("shape", SHAPES, ids=[f"h{h}kv{k}d{d}n{n}" for h, k, d, n in SHAPES])
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_decode_attention_reads_the_pool_in_place_as_gather_then_attend(nk, dtype, shape):
    g = torch.Generator().manual_seed(0)
    h, kvh, d, width = shape
    b, slots = 37, 2000
    k_pool = torch.randn(slots, kvh, d, generator=g).to(dtype)
    v_pool = torch.randn(slots, kvh, d, generator=g).to(dtype)
    q = torch.randn(b, h, d, generator=g).to(dtype)
    lens = torch.randint(1, width + 1, (b,), generator=g, dtype=torch.int32)
    lens[0], lens[1] = 1, width
    index = torch.zeros(b, width, dtype=torch.long)
    perm = torch.randperm(slots, generator=g)
    for i in range(b):
        index[i, :lens[i]] = perm[i * width:i * width + int(lens[i])]
    mask = torch.arange(width)[None] < lens[:, None].long()
    # the reference in float32 on the same (rounded) values: the kernel computes in float32
    ref_o, ref_l = attend_padded(q.float(), k_pool[index].float(), v_pool[index].float(), mask, d ** -0.5, fused=False)
    out, lse = nk.decode_attention(q, k_pool, v_pool, index, lens, d ** -0.5)
    assert out.dtype == dtype and lse.dtype == torch.float32 and out.shape == q.shape
    assert (lse - ref_l).abs().max() < 1e-4  # its exp is a polynomial (~2 ulp)
    tol = 1e-5 if dtype == torch.float32 else 2 ** -7  # bf16: the output's own rounding
    assert ((out.float() - ref_o.float()).abs() <= tol * (1 + ref_o.float().abs())).all()
    # a sequence with one key returns that key's value exactly
    assert torch.equal(out[0], v_pool[index[0, 0]].repeat_interleave(h // kvh, 0))


def test_the_amx_attention_is_built_where_the_cpu_has_amx_bf16(nk):
    flags = native._cpu_flags().split()
    assert nk.features & 2 == (2 if "amx_bf16" in flags and "amx_tile" in flags else 0)
    assert nk.amx_attention == bool(nk.features & 2)  # Linux lent the tiles where built


needs_amx = pytest.mark.skipif("amx_bf16" not in native._cpu_flags().split(),
                               reason="no AMX-BF16 on this CPU: the torch kernel runs the shared prefix")

# (rows, query heads, KV heads, prefix keys): 111 query rows a KV head (blocks of 16 and a part),
# keys in blocks of 32 and a part, a prefix of one key, one KV head, a long prefix
SHARED = [(37, 9, 3, 389), (6, 10, 2, 40), (17, 4, 2, 1), (3, 8, 1, 33), (9, 9, 3, 2500)]


@needs_amx
@pytest.mark.parametrize("shape", SHARED, ids=[f"b{b}h{h}kv{k}p{p}" for b, h, k, p in SHARED])
def test_shared_attention_on_amx_equals_attend_shared_and_the_merge(nk, shape):
    from structgen.backends.embedded.attention import attend_shared, merge_partials

    g = torch.Generator().manual_seed(3)
    b, h, kvh, p = shape
    r = b + 5  # rows of q that are not attended: left as they were
    q = torch.randn(r, h, 64, generator=g).bfloat16()
    pool_k = torch.randn(p + 7, kvh, 64, generator=g).bfloat16()
    pool_v = torch.randn(p + 7, kvh, 64, generator=g).bfloat16()
    k, v = pool_k[3:3 + p], pool_v[3:3 + p]  # a view of the pool, as KVPool.read gives
    rows = torch.randperm(r, generator=g)[:b]
    ref_o, ref_l = attend_shared(q.float()[rows], k.float(), v.float(), 0.125, fused=False)
    tol = 2 ** -7  # the output's bf16 rounding
    # alone: as attend_shared
    out, lse = torch.full_like(q, 7.0), torch.full((r, h), 7.0)
    nk.shared_attention_(q, k, v, 0.125, out, lse, rows=rows, merge=False)
    assert ((out[rows].float() - ref_o).abs() <= tol * (1 + ref_o.abs())).all()
    assert (lse[rows] - ref_l).abs().max() < 1e-4
    rest = torch.ones(r, dtype=torch.bool)
    rest[rows] = False
    assert (out[rest] == 7.0).all() and (lse[rest] == 7.0).all()
    # merged into the rows' own partial attention, as merge_partials
    own_o, own_l = torch.randn(r, h, 64, generator=g).bfloat16(), torch.randn(r, h, generator=g) * 4
    out, lse = own_o.clone(), own_l.clone()
    nk.shared_attention_(q, k, v, 0.125, out, lse, rows=rows)
    want = merge_partials(ref_o, ref_l, own_o.float()[rows], own_l[rows])
    assert ((out[rows].float() - want).abs() <= tol * (1 + want.abs())).all()
    assert (lse[rows] - torch.logaddexp(ref_l, own_l[rows])).abs().max() < 1e-4
    assert torch.equal(out[rest], own_o[rest]) and torch.equal(lse[rest], own_l[rest])
    # every row, in order (rows=None)
    out, lse = torch.empty_like(q), torch.empty(r, h)
    nk.shared_attention_(q, k, v, 0.125, out, lse, merge=False)
    all_o, _ = attend_shared(q.float(), k.float(), v.float(), 0.125, fused=False)
    assert ((out.float() - all_o).abs() <= tol * (1 + all_o.abs())).all()


@needs_amx
def test_shared_attention_leaves_torchs_amx_users_working(nk):
    """oneDNN's matmuls and torch's flash attention use AMX tiles on the same threads, and
    may keep their tile configuration between calls: after the kernel, each still gives
    the results it gave before it (the kernel gives back the configuration it found)."""
    g = torch.Generator().manual_seed(4)
    x, w = torch.randn(300, 576, generator=g).bfloat16(), torch.randn(1536, 576, generator=g).bfloat16()
    qa, ka = torch.randn(1, 9, 200, 64, generator=g).bfloat16(), torch.randn(1, 9, 200, 64, generator=g).bfloat16()

    def torch_amx():
        return F.linear(x, w), F.scaled_dot_product_attention(qa, ka, ka, is_causal=True)

    want = torch_amx()
    q, k = torch.randn(64, 9, 64, generator=g).bfloat16(), torch.randn(100, 3, 64, generator=g).bfloat16()
    out, lse = torch.empty_like(q), torch.empty(64, 9)
    for _ in range(3):
        nk.shared_attention_(q, k, k, 0.125, out, lse, merge=False)
        got = torch_amx()
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


@needs_amx
def test_shared_attention_refuses_what_it_cannot_take(nk):
    q, out, lse = torch.randn(4, 9, 64).bfloat16(), torch.empty(4, 9, 64).bfloat16(), torch.empty(4, 9)
    k = torch.randn(10, 3, 64).bfloat16()
    with pytest.raises(ValueError, match=r"row outside 0\.\.3"):
        nk.shared_attention_(q, k, k, 0.125, out, lse, rows=torch.tensor([0, 4]))
    long = torch.zeros(native.MAX_SHARED + 1, 3, 64).bfloat16()
    assert not nk.shared_fits(q, long) and not nk.shared_fits(q.float(), k)
    assert not nk.shared_fits(torch.randn(4, 9, 128).bfloat16(), k)
    with pytest.raises(ValueError, match=r"1\.\.16384 keys"):
        nk.shared_attention_(q, long, long, 0.125, out, lse)


@needs_amx
def test_run_attention_with_two_prefix_groups_on_amx_equals_the_torch_code(nk):
    """A bfloat16 batch in two cascade groups (each a part of the rows: the kernel's rows
    path) and a loner between them: with the kernels (AMX for the prefixes) as without,
    each within bf16 rounding of the float32 code."""
    from structgen.backends.embedded.attention import AttentionPlan, run_attention
    from structgen.backends.embedded.kv_pool import KVPool

    g = torch.Generator().manual_seed(11)
    pool = KVPool(1, 3, 64, 2000, torch.bfloat16)
    pool.k[0] = torch.randn(2000, 3, 64, generator=g).bfloat16()
    pool.v[0] = torch.randn(2000, 3, 64, generator=g).bfloat16()
    a, b = list(range(100)), list(range(200, 270))
    seqs = [a + list(range(1000 + 10 * i, 1004 + 10 * i)) for i in range(3)]
    seqs += [b + list(range(1500 + 10 * i, 1502 + 10 * i)) for i in range(4)]
    seqs.insert(2, list(range(1800, 1850)))  # the loner, between group a's rows
    rows = [slice(i, i + 1) for i in range(len(seqs))]
    plan = AttentionPlan.build(rows, [torch.tensor(s) for s in seqs], torch.device("cpu"))
    assert plan.decode is not None and len(plan.decode.groups) == 2
    q = torch.randn(len(seqs), 9, 64, generator=g).bfloat16()
    pool32 = KVPool(1, 3, 64, 2000, torch.float32)
    pool32.k[0], pool32.v[0] = pool.k[0].float(), pool.v[0].float()
    ref = run_attention(q.float(), pool32, 0, plan, 0.125)
    for out in (run_attention(q, pool, 0, plan, 0.125, kernels=nk), run_attention(q, pool, 0, plan, 0.125)):
        assert ((out.float() - ref).abs() <= 2 ** -7 * (1 + ref.abs())).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_chunk_attention_reads_the_pool_in_place_as_attend_chunks(nk, dtype):
    """Entries of several new tokens (own context, new) = (5, 1), (0, 3), (2, 7), (30, 4),
    their queries scattered among other rows: each query reads its entry's keys up to its
    own position; rows of no entry are left as they were."""
    from structgen.backends.embedded.attention import attend_chunks

    g = torch.Generator().manual_seed(7)
    h, kvh, d, slots, rows = 9, 3, 64, 500, 30
    ctx, new = [5, 0, 2, 30], [1, 3, 7, 4]
    e, n, width = len(ctx), max(new), max(c + k for c, k in zip(ctx, new, strict=True))
    k_pool = torch.randn(slots, kvh, d, generator=g).to(dtype)
    v_pool = torch.randn(slots, kvh, d, generator=g).to(dtype)
    q = torch.randn(rows, h, d, generator=g).to(dtype)
    index = torch.zeros(e, width, dtype=torch.long)
    pos = torch.zeros(e, n, dtype=torch.long)
    free_rows = torch.randperm(rows, generator=g)
    perm = torch.randperm(slots, generator=g)
    mask = torch.zeros(e, n, width, dtype=torch.bool)
    used = 0
    for i, (c, m) in enumerate(zip(ctx, new, strict=True)):
        index[i, :c + m] = perm[i * width:i * width + c + m]
        pos[i, :m] = free_rows[used:used + m]
        used += m
        for j in range(n):
            if j < m:
                mask[i, j, :c + j + 1] = True
            else:
                mask[i, j, 0] = True
    qc = q.float()[pos.reshape(-1)].view(e, n, h, d)
    ref_o, ref_l = attend_chunks(qc, k_pool[index].float(), v_pool[index].float(), mask, 0.125, fused=False)
    out = torch.full_like(q, 7.0)
    lse = torch.full((rows, h), 7.0)
    nk.chunk_attention_(q, k_pool, v_pool, index, pos, torch.tensor(new, dtype=torch.int32),
                        torch.tensor(ctx, dtype=torch.int32), 0.125, out, lse)
    tol = 1e-5 if dtype == torch.float32 else 2 ** -7
    for i, m in enumerate(new):
        for j in range(m):
            r = pos[i, j]
            assert (lse[r] - ref_l[i, j]).abs().max() < 1e-4
            assert ((out[r].float() - ref_o[i, j]).abs() <= tol * (1 + ref_o[i, j].abs())).all()
    untouched = free_rows[used:]
    assert (out[untouched] == 7.0).all() and (lse[untouched] == 7.0).all()
    with pytest.raises(ValueError, match="outside its keys"):
        nk.chunk_attention_(q, k_pool, v_pool, index, pos, torch.tensor(new, dtype=torch.int32),
                            torch.tensor([5, 0, 2, 31], dtype=torch.int32), 0.125, out, lse)


def test_decode_attention_refuses_bad_lengths_and_shapes(nk):
    q = torch.randn(2, 9, 64)
    pool = torch.randn(10, 3, 64)
    index = torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"outside 1\.\.L"):
        nk.decode_attention(q, pool, pool, index, torch.tensor([0, 4], dtype=torch.int32), 1.0)
    with pytest.raises(ValueError, match="int32"):
        nk.decode_attention(q, pool, pool, index, torch.tensor([1, 4]), 1.0)
    with pytest.raises(ValueError, match="contiguous CPU tensors of one dtype"):
        nk.decode_attention(q, pool.bfloat16(), pool, index, torch.tensor([1, 4], dtype=torch.int32), 1.0)
    with pytest.raises(ValueError, match="head_dim"):
        nk.decode_attention(q, pool[..., :32].contiguous(), pool[..., :32].contiguous(), index,
                            torch.tensor([1, 4], dtype=torch.int32), 1.0)


def test_elementwise_kernels_refuse_mismatched_shapes_and_dtypes(nk):
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match="residual like x"):
        nk.rms_norm(x, torch.ones(8), 1e-5, residual=torch.randn(3, 8))
    with pytest.raises(ValueError, match="weight"):
        nk.rms_norm(x, torch.ones(7), 1e-5)
    with pytest.raises(ValueError, match=r"gate_up \[T, 2 I\]"):
        nk.silu_mul(torch.randn(4, 7))
    qk = torch.randn(4, 3, 8)
    with pytest.raises(ValueError, match="cos's dtype"):
        nk.rope_(qk, 3, torch.randn(4, 8).bfloat16(), torch.randn(4, 8).bfloat16())
    with pytest.raises(ValueError, match=r"\[T, D\]"):
        nk.rope_(qk, 3, torch.randn(5, 8), torch.randn(5, 8))


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_kv_write_stores_strided_views_as_index_copy(nk, dtype):
    g = torch.Generator().manual_seed(2)
    qkv = torch.randn(50, 15, 64, generator=g).to(dtype)  # 9 q, 3 k, 3 v heads a row
    k, v = qkv[:, 9:12], qkv[:, 12:]
    slots = torch.randperm(400, generator=g)[:50]
    pool_k, pool_v = torch.randn(400, 3, 64, generator=g).to(dtype), torch.randn(400, 3, 64, generator=g).to(dtype)
    want_k, want_v = pool_k.clone().index_copy_(0, slots, k), pool_v.clone().index_copy_(0, slots, v)
    nk.kv_write_(pool_k, pool_v, slots, k, v)
    assert torch.equal(pool_k, want_k) and torch.equal(pool_v, want_v)
    bad = slots.clone()
    bad[-1] = 400
    before = pool_k.clone()
    with pytest.raises(ValueError, match="outside the pool"):
        nk.kv_write_(pool_k, pool_v, bad, k, v)
    assert torch.equal(pool_k, before)
    with pytest.raises(ValueError, match="dense rows"):
        nk.kv_write_(pool_k, pool_v, slots, k.transpose(1, 2), v)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize(("rows", "width"), [(1, 576), (7, 576), (300, 576), (5, 100)])
def test_rms_norm_with_and_without_the_residual_add(nk, dtype, rows, width):
    # 100: a row of 6 blocks of 16 and a part (the AVX-512 loop's masked tail)
    g = torch.Generator().manual_seed(rows)
    x = (torch.randn(rows, width, generator=g) * 3).to(dtype)
    res = torch.randn(rows, width, generator=g).to(dtype)
    w = torch.randn(width, generator=g).to(dtype)
    ulps = 1.0 if dtype == torch.bfloat16 else 8.0  # bf16: one rounding step; f32: the sum's order
    want = _rms_norm(x, w, 1e-5)
    got = nk.rms_norm(x.clone(), w, 1e-5)
    assert got.dtype == dtype and _ulps(got, want).max() <= ulps
    summed = x + res
    x2 = x.clone()
    got = nk.rms_norm(x2, w, 1e-5, residual=res)
    assert torch.equal(x2, summed)  # the residual add is written back, rounded as torch rounds it
    assert _ulps(got, _rms_norm(summed, w, 1e-5)).max() <= ulps


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("width", [1536, 1500])
def test_silu_mul_equals_torch(nk, dtype, width):
    # 1500: rows end in a part of a block of 16 (the AVX-512 loop's masked tail)
    g = torch.Generator().manual_seed(3)
    gu = (torch.randn(65, 2 * width, generator=g) * 4).to(dtype)
    gu[0, :4] = torch.tensor([0.0, -100.0, 100.0, 1e-3])  # saturating and tiny inputs
    want = F.silu(gu[:, :width]) * gu[:, width:]
    got = nk.silu_mul(gu)
    assert got.shape == want.shape and got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2 ** -7
    close = (got.float() - want.float()).abs() <= tol * (1 + want.float().abs())
    assert close.all()
    assert torch.isnan(nk.silu_mul(torch.full((1, 4), float("nan"), dtype=dtype))).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_rope_in_place_on_a_strided_view_leaves_the_other_heads(nk, dtype):
    g = torch.Generator().manual_seed(4)
    t, heads, extra, d = 11, 12, 3, 64
    qkv = torch.randn(t, heads + extra, d, generator=g).to(dtype)
    cos = torch.randn(t, d, generator=g).to(dtype)
    sin = torch.randn(t, d, generator=g).to(dtype)
    qk = qkv[:, :heads]
    rot = torch.cat((qk[..., d // 2:], qk[..., :d // 2]), -1)
    want = torch.addcmul(qk * cos[:, None], rot, sin[:, None])
    # within two steps of the dtype at the terms' size (a sum that cancels is exact to that)
    bound = 2 * torch.finfo(dtype).eps * (qk.float().abs() * cos[:, None].float().abs()
                                          + rot.float().abs() * sin[:, None].float().abs())
    v_before = qkv[:, heads:].clone()
    nk.rope_(qk, heads, cos, sin)
    assert torch.equal(qkv[:, heads:], v_before)
    assert ((qkv[:, :heads].float() - want.float()).abs() <= bound).all()


@pytest.mark.model
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_model_forward_native_equals_torch_code(nk, hf_model, dtype):
    """A mixed batch (a fresh prefill, decodes of different lengths behind a shared prefix in
    a cascade group) gives the torch code's logits and KV with the kernels: equal to float
    rounding in float32; in bfloat16 no further from the float32 model than the torch code."""
    from structgen.backends.embedded.model import DecoderModel, SeqInput

    def run(m):
        g = torch.Generator().manual_seed(5)
        prefix = torch.randint(0, 49152, (40,), generator=g).tolist()
        kv = m.new_kv_pool(400)
        m.forward(m.prepare([SeqInput(prefix, list(range(40)), logits="none")]), kv)
        inputs = []
        for i in range(5):  # decodes sharing the prefix, own tails of different lengths
            own = torch.randint(0, 49152, (3 + 2 * i,), generator=g).tolist()
            slots = list(range(40)) + list(range(100 + 30 * i, 100 + 30 * i + len(own)))
            m.forward(m.prepare([SeqInput(own[:-1], slots[:-1], logits="none")]), kv)
            inputs.append(SeqInput(own[-1:], slots))
        inputs.append(SeqInput(prefix[:9], list(range(300, 309)), logits="all"))  # a fresh prompt
        fb = m.prepare(inputs)
        assert fb.plan.decode is not None and fb.plan.decode.groups and fb.plan.prefill
        return m.forward(fb, kv), kv

    with_k = DecoderModel.from_hf(hf_model, dtype=dtype)
    without = DecoderModel.from_hf(hf_model, dtype=dtype, native=False)
    assert with_k.kernels is nk and without.kernels is None
    (a, kv_a), (b, kv_b) = run(with_k), run(without)
    assert a.shape == b.shape == (5 + 9, 49152)
    if dtype == torch.float32:
        assert (a - b).abs().max() < 1e-3
        assert (kv_a.k - kv_b.k).abs().max() < 1e-4 and (kv_a.v - kv_b.v).abs().max() < 1e-4
        return
    ref, _ = run(DecoderModel.from_hf(hf_model, dtype=torch.float32, native=False))
    err_native, err_torch = (a - ref).abs().max(), (b - ref).abs().max()
    assert err_native <= 1.5 * err_torch + 0.125, (err_native, err_torch)
    assert (a.argmax(-1) == ref.argmax(-1)).sum() >= (b.argmax(-1) == ref.argmax(-1)).sum() - 1


def test_build_is_cached_by_content_and_machine(tmp_path, nk):
    first = native.build(tmp_path)
    mtime = first.stat().st_mtime_ns
    assert native.build(tmp_path) == first and first.stat().st_mtime_ns == mtime  # not rebuilt
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary file left


def test_no_compiler_falls_back_to_torch_with_the_reason_logged(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("STRUCTGEN_CACHE", str(tmp_path))
    with pytest.raises(RuntimeError, match="no C compiler"):
        native.build()
    monkeypatch.setattr(native, "_loaded", [])
    with caplog.at_level(logging.INFO, logger="structgen.embedded"):
        assert native.kernels() is None
    assert "no C compiler" in caplog.text and "torch code runs instead" in caplog.text


def test_a_failing_compiler_is_reported(tmp_path, monkeypatch):
    cc = tmp_path / "cc"
    cc.write_text("#!/bin/sh\n[ \"$1\" = --version ] && echo fake-cc 1.0 && exit 0\n"
                  "echo 'boom: cannot compile' >&2\nexit 3\n")
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    with pytest.raises(RuntimeError, match="failed \\(3\\): boom: cannot compile"):
        native.build(tmp_path / "k")
    assert list((tmp_path / "k").iterdir()) == []


@pytest.mark.model
def test_switched_off_by_the_environment(monkeypatch, nk, hf_model):
    from structgen.backends.embedded.model import DecoderModel

    monkeypatch.setenv(native.ENV, "0")
    assert native.kernels() is None
    assert DecoderModel.from_hf(hf_model).kernels is None
    monkeypatch.setenv(native.ENV, "1")
    assert native.kernels() is nk


def test_not_used_beside_a_second_openmp_runtime(monkeypatch, caplog):
    monkeypatch.setattr(native, "_loaded", [])
    monkeypatch.setattr(native, "_openmp_runtimes", lambda: ["/a/libgomp.so.1", "/b/libgomp-x.so.1"])
    with caplog.at_level(logging.INFO, logger="structgen.embedded"):
        assert native.kernels() is None
    assert "two OpenMP runtimes" in caplog.text
