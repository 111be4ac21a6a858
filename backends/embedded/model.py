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


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class _Layer:
    __slots__ = ("down", "down_b", "gate", "gate_b", "k", "k_b", "k_norm", "ln1", "ln2", "o", "o_b",
                 "q", "q_b", "q_norm", "up", "up_b", "v", "v_b", "window")

    def __init__(self, hf_layer: Any, dtype: torch.dtype, window: int | None) -> None:
        a, m = hf_layer.self_attn, hf_layer.mlp

        def w(mod: Any) -> torch.Tensor:
            weight: torch.Tensor = mod.weight.detach().to(dtype)
            return weight

        def b(mod: Any) -> torch.Tensor | None:
            bias = getattr(mod, "bias", None)
            return None if bias is None else bias.detach().to(dtype)

        self.q, self.k, self.v, self.o = w(a.q_proj), w(a.k_proj), w(a.v_proj), w(a.o_proj)
        self.q_b, self.k_b, self.v_b, self.o_b = b(a.q_proj), b(a.k_proj), b(a.v_proj), b(a.o_proj)
        self.gate, self.up, self.down = w(m.gate_proj), w(m.up_proj), w(m.down_proj)
        self.gate_b, self.up_b, self.down_b = b(m.gate_proj), b(m.up_proj), b(m.down_proj)
        self.q_norm = w(a.q_norm) if hasattr(a, "q_norm") else None
        self.k_norm = w(a.k_norm) if hasattr(a, "k_norm") else None
        self.ln1 = w(hf_layer.input_layernorm)
        self.ln2 = w(hf_layer.post_attention_layernorm)
        self.window = window


class DecoderModel:
    """Decoder weights (taken from a transformers model) and a batched forward."""

    def __init__(self, hf_model: Any, dtype: torch.dtype | None = None) -> None:
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
        self._cos = self._sin = torch.empty(0)
        self._rope_table(min(int(getattr(cfg, "max_position_embeddings", 4096)), 1 << 16))

    @classmethod
    def from_hf(cls, hf_model: Any, dtype: torch.dtype | None = None) -> DecoderModel:
        """Wrap a transformers causal LM of a supported family; its tensors are shared
        when ``dtype`` is its own (the default), converted copies otherwise."""
        return cls(hf_model, dtype)

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
        self._sin = (emb.sin() * self._rope_scale).to(self.dtype)

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
    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv: KVPool) -> torch.Tensor:
        """Run ``batch``; write its K/V into ``kv``; logits ``[R, vocab]`` (float32)."""
        t = batch.input_ids.shape[0]
        h, kvh, d = self.num_heads, self.num_kv_heads, self.head_dim
        x = self.embed.index_select(0, batch.input_ids)
        cos = self._cos.index_select(0, batch.positions)[:, None, :]
        sin = self._sin.index_select(0, batch.positions)[:, None, :]
        for i, layer in enumerate(self.layers):
            y = _rms_norm(x, layer.ln1, self.eps)
            q = F.linear(y, layer.q, layer.q_b).view(t, h, d)
            k = F.linear(y, layer.k, layer.k_b).view(t, kvh, d)
            v = F.linear(y, layer.v, layer.v_b).view(t, kvh, d)
            if layer.q_norm is not None and layer.k_norm is not None:  # Qwen3: per head
                q = _rms_norm(q, layer.q_norm, self.eps)
                k = _rms_norm(k, layer.k_norm, self.eps)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            kv.write(i, batch.write_slots, k, v)
            a = run_attention(q, kv, i, batch.plans[layer.window], self.scale)
            x = x + F.linear(a.reshape(t, h * d), layer.o, layer.o_b)
            y = _rms_norm(x, layer.ln2, self.eps)
            g = F.silu(F.linear(y, layer.gate, layer.gate_b)) * F.linear(y, layer.up, layer.up_b)
            x = x + F.linear(g, layer.down, layer.down_b)
        if batch.logit_rows.numel() == 0:
            return torch.empty(0, self.lm_head.shape[0], device=x.device)
        x = _rms_norm(x.index_select(0, batch.logit_rows), self.norm, self.eps)
        return F.linear(x, self.lm_head).float()

    __call__ = forward
