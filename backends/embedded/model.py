"""The owned forward pass over a slot-addressed KV pool, for batched decoding.

One :meth:`DecoderModel.forward` runs a whole scheduler step: prefill chunks of several
sequences (packed, variable length) and decode tokens (one per sequence) together.
New K/V are written into a :class:`KVPool` at the slots the caller gives; logits come
back only for the positions asked. Decode sequences that share leading slots (a radix
tree prefix) use cascade attention: the prefix KV is read once for the whole batch.
It runs the decoder families of :mod:`~structgen.backends.embedded.families` (Llama,
Mistral, Qwen2, Qwen3), matching transformers' logits (fp32, < 1e-3). Device-agnostic.

How the embedded engine drives it with the runtime (``page_size`` p)::

    from structgen.backends.embedded.model import DecoderModel, SeqInput
    from structgen.runtime import BlockPool, RadixCache, Scheduler

    model = DecoderModel.from_hf(load_model().model)        # shares the HF weights
    pool = BlockPool(num_blocks, page_size=p)
    kv = model.new_kv_pool(num_slots=num_blocks * p)        # slot = block * p + offset
    sched = Scheduler(pool, RadixCache(p))
    sched.add(seq)
    while sched.has_work:
        batch = sched.schedule()                            # allocates blocks per entry
        inputs = [SeqInput(token_ids=e.seq.token_ids[e.start:e.end],
                           slots=pool.slot_mapping(e.seq.blocks, 0, e.end))
                  for e in batch.entries]                   # slots of positions 0..end-1
        logits = model.forward(model.prepare(inputs), kv)   # [len(inputs), vocab] fp32
        for e, row in zip(batch.entries, logits):
            sched.append(e.seq, sample(row))                # or sched.finish(e.seq)

``SeqInput(..., logits="all")`` returns every position's logits (scoring choices);
``ForwardBatch.split(logits)`` cuts the output per input. ``prepare(..., cascade=False)``
forces the plain path (each sequence reads its own copy of the prefix).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

from structgen.backends.embedded.attention import AttentionPlan, run_attention
from structgen.backends.embedded.families import ModelSpec, model_spec
from structgen.backends.embedded.kv_pool import KVPool
from structgen.backends.embedded.native import MAX_GROUP, MAX_HEAD_DIM, Kernels
from structgen.backends.embedded.native import kernels as native_kernels

__all__ = ["DecoderModel", "ForwardBatch", "SeqInput"]


@dataclass(frozen=True)
class SeqInput:
    """New tokens of one sequence and the KV slots of all its positions.

    ``slots[i]`` holds position ``i``; ``len(slots) - len(token_ids)`` positions are
    already in the pool (reused context), the rest are written by this forward.
    ``logits``: ``"last"`` (next-token), ``"all"`` (one row per new token), ``"none"``,
    or an int ``k``: the last ``k`` new tokens' rows (verifying ``k - 1`` drafted tokens).
    """

    token_ids: Sequence[int]
    slots: Sequence[int] | torch.Tensor
    logits: Literal["last", "all", "none"] | int = "last"


@dataclass(frozen=True)
class ForwardBatch:
    """Device tensors for one forward pass; build with :meth:`DecoderModel.prepare`."""

    input_ids: torch.Tensor     # [T]
    positions: torch.Tensor     # [T]
    write_slots: torch.Tensor   # [T]
    logit_rows: torch.Tensor    # [R] packed rows whose logits are returned
    counts: tuple[int, ...]     # logit rows per input
    #: the attention plan of each distinct window (None: full attention)
    plans: dict[int | None, AttentionPlan]

    @property
    def plan(self) -> AttentionPlan:
        """The full-attention plan (or the only one)."""
        return self.plans[None] if None in self.plans else next(iter(self.plans.values()))

    def split(self, logits: torch.Tensor) -> list[torch.Tensor]:
        """The forward's logits cut per input (``[0|1|n, vocab]`` each)."""
        return list(torch.split(logits, list(self.counts)))


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


class _Layer:
    """One decoder layer's weights, the projections that read the same input fused: q, k and
    v as one ``[(H + 2 KV) * D, hidden]`` matrix, gate and up as one ``[2 * I, hidden]`` (one
    matrix product each instead of three and two). Where the model's dtype and device are the
    engine's, the transformers modules are rebound to views of the fused tensors, so the
    weights stay in memory once."""

    __slots__ = ("down", "down_b", "gate_up", "gate_up_b", "k_norm", "ln1", "ln2", "o", "o_b",
                 "q_norm", "qkv", "qkv_b", "window")

    def __init__(self, hf_layer: Any, dtype: torch.dtype, window: int | None) -> None:
        a, m = hf_layer.self_attn, hf_layer.mlp

        def w(mod: Any) -> torch.Tensor:
            weight: torch.Tensor = mod.weight.detach().to(dtype)
            return weight

        def b(mod: Any) -> torch.Tensor | None:
            bias = getattr(mod, "bias", None)
            return None if bias is None else bias.detach().to(dtype)

        self.qkv, self.qkv_b = _fuse([a.q_proj, a.k_proj, a.v_proj], dtype)
        self.gate_up, self.gate_up_b = _fuse([m.gate_proj, m.up_proj], dtype)
        self.o, self.down = w(a.o_proj), w(m.down_proj)
        self.o_b, self.down_b = b(a.o_proj), b(m.down_proj)
        self.q_norm = w(a.q_norm) if hasattr(a, "q_norm") else None
        self.k_norm = w(a.k_norm) if hasattr(a, "k_norm") else None
        self.ln1 = w(hf_layer.input_layernorm)
        self.ln2 = w(hf_layer.post_attention_layernorm)
        self.window = window


def _fuse(mods: list[Any], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The modules' weights stacked by rows (and their biases, None if none has one; a zero
    bias for one without). Modules already in ``dtype`` are rebound to views of the stack."""
    weight = torch.cat([mod.weight.detach().to(dtype) for mod in mods])
    biases = [getattr(mod, "bias", None) for mod in mods]
    bias = None
    if any(x is not None for x in biases):
        bias = torch.cat([x.detach().to(dtype) if x is not None else
                          torch.zeros(mod.weight.shape[0], dtype=dtype, device=weight.device)
                          for x, mod in zip(biases, mods, strict=True)])
    row = 0
    for mod in mods:
        n = mod.weight.shape[0]
        if mod.weight.dtype == dtype and mod.weight.device == weight.device:
            mod.weight.data = weight[row:row + n]
            if bias is not None and mod.bias is not None:
                mod.bias.data = bias[row:row + n]
        row += n
    return weight, bias


class DecoderModel:
    """Decoder weights (taken from a transformers model) and a batched forward."""

    def __init__(self, hf_model: Any, dtype: torch.dtype | None = None, *, native: bool = True) -> None:
        spec: ModelSpec = model_spec(hf_model)  # BackendError naming what it cannot run
        cfg = hf_model.config
        inner = hf_model.model
        self.spec = spec
        self.config = cfg
        self.context_length = spec.context_length
        self.dtype = dtype or inner.embed_tokens.weight.dtype
        self.device = inner.embed_tokens.weight.device
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.num_heads
        self.eps = cfg.rms_norm_eps
        self.scale = self.head_dim ** -0.5
        self.embed = inner.embed_tokens.weight.detach().to(self.dtype)
        self.layers = [_Layer(layer, self.dtype, win) for layer, win in
                       zip(inner.layers, spec.windows, strict=True)]
        self.windows = tuple(dict.fromkeys(spec.windows))  # distinct, in layer order
        self.norm = inner.norm.weight.detach().to(self.dtype)
        self.lm_head = hf_model.lm_head.weight.detach().to(self.dtype)
        self._inv_freq = inner.rotary_emb.inv_freq.detach().float().to(self.device)
        self._rope_scale = float(getattr(inner.rotary_emb, "attention_scaling", 1.0))
        self._cos = self._sin_signed = torch.empty(0)
        self._rope_table(min(int(getattr(cfg, "max_position_embeddings", 4096)), 1 << 16))
        #: the fused CPU kernels this model's forward uses (None: its torch code only)
        self.kernels: Kernels | None = None
        if native and self.device.type == "cpu" and self.dtype in Kernels.dtypes \
                and self.head_dim <= MAX_HEAD_DIM and self.head_dim % 2 == 0 \
                and self.num_heads % self.num_kv_heads == 0 \
                and self.num_heads // self.num_kv_heads <= MAX_GROUP:
            self.kernels = native_kernels()

    @classmethod
    def from_hf(cls, hf_model: Any, dtype: torch.dtype | None = None, *,
                native: bool = True) -> DecoderModel:
        """Wrap a transformers causal LM of a supported family; its tensors are shared
        when ``dtype`` is its own (the default), converted copies otherwise. ``native``:
        run the fused CPU kernels of :mod:`~structgen.backends.embedded.native` where they
        build and suit the model (False: torch code only)."""
        return cls(hf_model, dtype, native=native)

    @property
    def bytes_per_token(self) -> int:
        """KV memory one token takes (K and V, every layer) in this model's dtype."""
        return int(2 * len(self.layers) * self.num_kv_heads * self.head_dim * self.embed.element_size())

    def new_kv_pool(self, num_slots: int) -> KVPool:
        """An empty pool of ``num_slots`` slots in this model's dtype and device."""
        return KVPool(len(self.layers), self.num_kv_heads, self.head_dim, num_slots,
                      self.dtype, self.device)

    def _rope_table(self, n: int) -> None:
        # As transformers: freqs = pos * inv_freq in fp32, emb = cat(freqs, freqs).
        pos = torch.arange(n, device=self.device, dtype=torch.float32)
        freqs = pos[:, None] * self._inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self._cos = (emb.cos() * self._rope_scale).to(self.dtype)
        sin = (emb.sin() * self._rope_scale).to(self.dtype)
        half = sin.shape[-1] // 2  # rotate_half(x) * sin == cat(x2, x1) * sin_signed
        self._sin_signed = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)

    # -- batch building -------------------------------------------------------------------
    def prepare(self, inputs: Sequence[SeqInput], *, cascade: bool | None = None,
                min_shared: int = 32) -> ForwardBatch:
        """Pack ``inputs`` into one forward. ``cascade``: None = use shared-prefix attention
        when the decode inputs share >= ``min_shared`` leading slots; True/False force it."""
        if not inputs:
            raise ValueError("a forward batch needs at least one input")
        ids: list[int] = []
        pos: list[int] = []
        write: list[torch.Tensor] = []
        rows: list[slice] = []
        slots: list[torch.Tensor] = []
        logit_rows: list[int] = []
        counts: list[int] = []
        for x in inputs:
            n = len(x.token_ids)
            s = torch.as_tensor(x.slots, dtype=torch.long).cpu()
            if n == 0 or len(s) < n:
                raise ValueError(f"an input needs >= 1 new token and a slot per position "
                                 f"(got {n} tokens, {len(s)} slots)")
            start, t0 = len(s) - n, len(ids)
            ids.extend(x.token_ids)
            pos.extend(range(start, start + n))
            write.append(s[start:])
            rows.append(slice(t0, t0 + n))
            slots.append(s)
            k = x.logits if isinstance(x.logits, int) else {"last": 1, "all": n, "none": 0}.get(x.logits)
            if not isinstance(k, int) or not 0 <= k <= n:
                raise ValueError(f"logits={x.logits!r} rows asked of an input of {n} new tokens")
            picked = list(range(t0 + n - k, t0 + n))  # the last k new tokens
            logit_rows.extend(picked)
            counts.append(len(picked))
        if pos and max(pos) >= self._cos.shape[0]:
            self._rope_table(2 * max(pos))
        dev = self.device
        return ForwardBatch(
            input_ids=torch.tensor(ids, dtype=torch.long, device=dev),
            positions=torch.tensor(pos, dtype=torch.long, device=dev),
            write_slots=torch.cat(write).to(dev),
            logit_rows=torch.tensor(logit_rows, dtype=torch.long, device=dev),
            counts=tuple(counts),
            plans={w: AttentionPlan.build(rows, slots, dev, cascade, min_shared, w)
                   for w in self.windows},
        )

    # -- the forward ------------------------------------------------------------------
    def _qk_v(self, layer: _Layer, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's q and k heads ``[T, H + KV, D]`` (a view of the fused projection,
        or Qwen3's per-head normed copy) and v heads ``[T, KV, D]`` for the normed input ``y``."""
        h, kvh, d = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = F.linear(y, layer.qkv, layer.qkv_b).view(y.shape[0], h + 2 * kvh, d)
        qk, v = qkv[:, :h + kvh], qkv[:, h + kvh:]
        if layer.q_norm is not None and layer.k_norm is not None:  # Qwen3: per head
            qk = torch.cat((_rms_norm(qk[:, :h], layer.q_norm, self.eps),
                            _rms_norm(qk[:, h:], layer.k_norm, self.eps)), dim=1)
        return qk, v

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv: KVPool) -> torch.Tensor:
        """Run ``batch``; write its K/V into ``kv``; logits ``[R, vocab]`` (float32)."""
        if self.kernels is not None:
            return self._forward_native(batch, kv, self.kernels)
        t = batch.input_ids.shape[0]
        h, d = self.num_heads, self.head_dim
        x = self.embed.index_select(0, batch.input_ids)
        cos = self._cos.index_select(0, batch.positions)[:, None, :]
        sin = self._sin_signed.index_select(0, batch.positions)[:, None, :]
        half = d // 2
        for i, layer in enumerate(self.layers):
            qk, v = self._qk_v(layer, _rms_norm(x, layer.ln1, self.eps))
            # RoPE: x * cos + rotate_half(x) * sin, with rotate_half's sign folded into sin
            qk = torch.addcmul(qk * cos, torch.cat((qk[..., half:], qk[..., :half]), dim=-1), sin)
            q, k = qk[:, :h], qk[:, h:]
            kv.write(i, batch.write_slots, k, v)
            a = run_attention(q, kv, i, batch.plans[layer.window], self.scale)
            x = x + F.linear(a.reshape(t, h * d), layer.o, layer.o_b)
            y = _rms_norm(x, layer.ln2, self.eps)
            gu = F.linear(y, layer.gate_up, layer.gate_up_b)
            inter = gu.shape[-1] // 2
            x = x + F.linear(F.silu(gu[:, :inter]) * gu[:, inter:], layer.down, layer.down_b)
        if batch.logit_rows.numel() == 0:
            return torch.empty(0, self.lm_head.shape[0], device=x.device)
        x = _rms_norm(x.index_select(0, batch.logit_rows), self.norm, self.eps)
        return F.linear(x, self.lm_head).float()

    def _forward_native(self, batch: ForwardBatch, kv: KVPool, nk: Kernels) -> torch.Tensor:
        """:meth:`forward` with the fused CPU kernels: each residual add joins the next
        RMSNorm, SiLU-times-up and RoPE are one pass each, and one-token queries read their
        own keys in place (:func:`run_attention` with ``kernels``)."""
        t = batch.input_ids.shape[0]
        h, d = self.num_heads, self.head_dim
        x = self.embed.index_select(0, batch.input_ids)
        cos = self._cos.index_select(0, batch.positions)
        sin = self._sin_signed.index_select(0, batch.positions)
        hq = h + self.num_kv_heads  # q and k heads: rotated together
        pending: torch.Tensor | None = None  # the last MLP's output, not yet added to x
        for i, layer in enumerate(self.layers):
            qk, v = self._qk_v(layer, nk.rms_norm(x, layer.ln1, self.eps, residual=pending))  # x += pending
            nk.rope_(qk, hq, cos, sin)
            q, k = qk[:, :h], qk[:, h:]
            if kv.k.dtype == k.dtype:
                nk.kv_write_(kv.k[i], kv.v[i], batch.write_slots, k, v)
            else:
                kv.write(i, batch.write_slots, k, v)
            a = run_attention(q, kv, i, batch.plans[layer.window], self.scale, kernels=nk)
            y = nk.rms_norm(x, layer.ln2, self.eps, residual=F.linear(a.reshape(t, h * d), layer.o, layer.o_b))
            gu = F.linear(y, layer.gate_up, layer.gate_up_b)
            pending = F.linear(nk.silu_mul(gu), layer.down, layer.down_b)
        if batch.logit_rows.numel() == 0:
            return torch.empty(0, self.lm_head.shape[0], device=x.device)
        assert pending is not None  # a model has layers
        rows = batch.logit_rows
        x = nk.rms_norm(x.index_select(0, rows), self.norm, self.eps,
                        residual=pending.index_select(0, rows))
        return F.linear(x, self.lm_head).float()

    __call__ = forward
