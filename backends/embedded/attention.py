"""Attention over a :class:`~structgen.backends.embedded.kv_pool.KVPool` for a packed batch.

A forward batch packs every sequence's new tokens into one ``[T, heads, head_dim]``
query tensor. :class:`AttentionPlan` (built once per forward, reused by every layer)
says how each part attends:

* **prefill** entries (several new tokens): causal SDPA of the chunk against the
  sequence's slots (reused context + the chunk itself);
* **decode** entries (one new token each), together in one batched product:

  - *plain*: each sequence's slots are gathered (its own copy of any shared prefix)
    into a padded ``[B, L, kv_heads, head_dim]`` tensor;
  - *cascade* (shared prefix, as FlashInfer / Hydragen): when the decode sequences
    start with the same ``P`` slots, all ``B * heads_per_kv`` queries attend to the
    prefix K/V, read once, in one matmul per KV head; then each sequence attends to
    its own suffix; the two partial softmaxes are merged by their log-sum-exp.
    The result equals the plain path up to float rounding. Entries with a few new
    tokens (a prompt's uncached tail, a constraint's forced run, drafted tokens: up to
    ``MAX_SHORT``) join the cascade too: each of their queries is one more row reading the
    prefix with the others, and each such entry reads its own suffix once for all its
    queries (:func:`attend_chunks`, causal by a mask; a ``[E, N, L]`` *chunk* batch), not
    once per query (SmolLM2-135M in bfloat16 on 2 cores, 256 prompts whose last 42 tokens
    are new behind a cached 386-token prefix: one pass took 7.6 s gathered per query, 4.9 s
    chunked).

GQA: query head ``h`` uses KV head ``h // (heads // kv_heads)``, as transformers'
``repeat_kv``. Softmax statistics are float32 whatever the KV dtype.

Kernels: on the CPU (float32, bfloat16, float16) the two partial attentions that need their
log-sum-exp (:func:`attend_padded`, :func:`attend_shared`) run as one call of torch's fused
flash-attention CPU kernel (``aten::_scaled_dot_product_flash_attention_for_cpu``, which
returns the log-sum-exp beside the output); the queries of a KV head's group are rows of
that head, so GQA needs no copy of K/V. Elsewhere (CUDA, other dtypes, a torch without the
kernel) they run as one matmul per KV head with the softmax in float32. Both agree to
float rounding (tested); the fused one reads K/V once and never materialises the scores
in float32. With the native kernels (``kernels``) and a CPU with AMX-BF16, a bfloat16
shared prefix of head_dim 64 runs on AMX tiles instead and is merged in place into the
queries' own attention (``Kernels.shared_attention_``; 0.26 ms against 0.54-0.85 ms for
torch's kernel on 768 query rows a KV head and 389 keys).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from structgen.backends.embedded.kv_pool import KVPool, SlotRange

if TYPE_CHECKING:
    from structgen.backends.embedded.native import Kernels

MAX_SHORT = 64  # new tokens of an entry that may join the cascade group
#: torch's fused CPU attention that also returns the log-sum-exp (None: not in this torch)
_FLASH_CPU: Any = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_FLASH_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def fused_available(q: torch.Tensor) -> bool:
    """Whether :func:`attend_padded` / :func:`attend_shared` run the fused CPU kernel for ``q``."""
    return _FLASH_CPU is not None and q.device.type == "cpu" and q.dtype in _FLASH_DTYPES

__all__ = [
    "MAX_SHORT", "AttentionPlan", "CascadeGroup", "ChunkPlan", "DecodePlan", "PrefillItem", "attend_causal",
    "attend_chunks", "attend_padded", "attend_sdpa", "attend_shared", "chunk_bias", "fused_available",
    "merge_partials", "run_attention",
]


# -- kernels (pure tensor functions) -----------------------------------------------------
def attend_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
                  scale: float, window: int | None = None) -> torch.Tensor:
    """Causal attention of ``q`` ``[n, H, D]`` at positions ``start..start+n-1`` to
    ``k``/``v`` ``[start+n, KV, D]`` (positions ``0..start+n-1``). With ``window``, a
    query at ``p`` sees only keys ``p - window + 1 .. p``. Returns ``[n, H, D]``."""
    n, length = q.shape[0], k.shape[0]
    qh, kh, vh = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    if start == 0 and (window is None or window >= length):
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale,
                                             enable_gqa=True)
    else:
        qpos = torch.arange(start, start + n, device=q.device)[:, None]
        kpos = torch.arange(length, device=q.device)[None, :]
        mask = kpos <= qpos
        if window is not None:
            mask &= kpos > qpos - window
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale,
                                             enable_gqa=True)
    return out[0].transpose(0, 1)


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask (True = attend) as the fused kernel's additive bias: 0 or -inf."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


def _softmax(s: torch.Tensor, scale: float, blocked: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """The unfused kernels' softmax over float32 scores ``s`` (last dim, in place): scaled,
    ``blocked`` keys (True) at -inf; the weights and their log-sum-exp."""
    s.mul_(scale)
    if blocked is not None:
        s.masked_fill_(blocked, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return torch.exp(s.sub_(lse[..., None])), lse


def attend_padded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                  scale: float, *, fused: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One query per sequence against its own keys: ``q`` ``[B, H, D]``, ``k``/``v``
    ``[B, L, KV, D]``, ``mask`` ``[B, L]`` (True = attend) or None.

    Returns the normalized output ``[B, H, D]`` and its log-sum-exp ``[B, H]`` (float32).
    Fused (``fused=None``: where :func:`fused_available`): one kernel call, each sequence's
    ``H/KV`` queries of a KV head as rows of that head. Otherwise one ``bmm`` per KV head
    reads ``k[:, :, j]`` in place (strided, never copied).
    """
    b, h, d = q.shape
    kv = k.shape[2]
    q4 = q.reshape(b, kv, h // kv, d)
    if fused_available(q) if fused is None else fused:
        bias = None if mask is None else _additive(mask, q.dtype)[:, None, None, :]
        out, lse = _FLASH_CPU(q4, k.transpose(1, 2), v.transpose(1, 2), attn_mask=bias, scale=scale)
        return out.reshape(b, h, d), lse.reshape(b, h).float()
    neg = None if mask is None else ~mask[:, None, :]
    outs, lses = [], []
    for j in range(kv):
        p, lse = _softmax(torch.bmm(q4[:, j], k[:, :, j].transpose(1, 2)).float(), scale, neg)  # [B, G, L]
        outs.append(torch.bmm(p.to(v.dtype), v[:, :, j]))                            # [B, G, D]
        lses.append(lse)
    return torch.stack(outs, 1).reshape(b, h, d), torch.stack(lses, 1).reshape(b, h)


def attend_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                scale: float) -> torch.Tensor:
    """As :func:`attend_padded` without the log-sum-exp, through SDPA (GQA in the kernel)."""
    m = None if mask is None else mask[:, None, None, :]
    out = F.scaled_dot_product_attention(q[:, :, None], k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=m, scale=scale, enable_gqa=True)
    return out[:, :, 0]


def attend_shared(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  scale: float, *, fused: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Every query against the same keys (a shared prefix), read once.

    ``q`` ``[B, H, D]``, ``k``/``v`` ``[P, KV, D]``. The queries of all ``B`` sequences
    that use KV head ``j`` are stacked into one ``[B * H/KV, D]`` matrix against that
    head's keys: one fused kernel call for all heads (``fused``, as :func:`attend_padded`),
    else one matmul per KV head, for the whole batch. Returns ``[B, H, D]`` and the
    log-sum-exp ``[B, H]`` (float32).
    """
    b, h, d = q.shape
    kv = k.shape[1]
    g = h // kv
    qs = q.reshape(b, kv, g, d).transpose(0, 1).reshape(kv, b * g, d)    # [KV, B*G, D]
    if fused_available(q) if fused is None else fused:
        out, lse = _FLASH_CPU(qs[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], scale=scale)
        return (out[0].view(kv, b, g, d).transpose(0, 1).reshape(b, h, d),
                lse[0].float().view(kv, b, g).transpose(0, 1).reshape(b, h))
    outs, lses = [], []
    for j in range(kv):
        p, lse = _softmax(torch.mm(qs[j], k[:, j].t()).float(), scale)   # [B*G, P]
        outs.append(torch.mm(p.to(v.dtype), v[:, j]))                                # [B*G, D]
        lses.append(lse)
    out = torch.stack(outs).view(kv, b, g, d).transpose(0, 1).reshape(b, h, d)
    return out, torch.stack(lses).view(kv, b, g).transpose(0, 1).reshape(b, h)


def attend_chunks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                  scale: float, *, fused: bool | None = None,
                  bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Several queries per entry against the entry's own keys: ``q`` ``[E, N, H, D]``,
    ``k``/``v`` ``[E, L, KV, D]``, ``mask`` ``[E, N, L]`` (True = attend; every query row
    must see at least one key). A short entry's new tokens (a prompt's uncached tail, a
    forced run, drafts) read its own keys once for all of them, where one query per row
    (:func:`attend_padded`) would gather them once per row.

    Returns the normalized output ``[E, N, H, D]`` and its log-sum-exp ``[E, N, H]``
    (float32). Fused as :func:`attend_padded`: each entry's ``N * H/KV`` queries of a KV
    head are rows of that head. ``bias``: :func:`chunk_bias` of ``mask`` in ``q``'s dtype,
    when the caller keeps it across layers.
    """
    e, n, h, d = q.shape
    length, kv = k.shape[1], k.shape[2]
    g = h // kv
    qg = q.view(e, n, kv, g, d).permute(0, 2, 1, 3, 4).reshape(e, kv, n * g, d)   # [E, KV, N*G, D]
    kt, vt = k.transpose(1, 2), v.transpose(1, 2)                                   # [E, KV, L, D]
    if fused_available(q) if fused is None else fused:
        if bias is None:
            bias = chunk_bias(mask, g, q.dtype)
        out, lse = _FLASH_CPU(qg, kt, vt, attn_mask=bias, scale=scale)
    else:
        allowed = mask[:, None, :, None, :].expand(e, 1, n, g, length).reshape(e, 1, n * g, length)
        p, lse = _softmax(torch.matmul(qg, kt.transpose(2, 3)).float(), scale, ~allowed)  # [E, KV, N*G, L]
        out = torch.matmul(p.to(v.dtype), vt)                                                   # [E, KV, N*G, D]
    out = out.view(e, kv, n, g, d).permute(0, 2, 1, 3, 4).reshape(e, n, h, d)
    return out, lse.float().view(e, kv, n, g).permute(0, 2, 1, 3).reshape(e, n, h)


def chunk_bias(mask: torch.Tensor, group: int, dtype: torch.dtype) -> torch.Tensor:
    """The fused kernel's additive mask for :func:`attend_chunks`: ``[E, 1, N * group, L]``
    (0 where ``mask`` attends, -inf elsewhere; each query row repeated for its group)."""
    e, n, length = mask.shape
    return _additive(mask, dtype)[:, None, :, None, :].expand(e, 1, n, group, length).reshape(e, 1, n * group, length)


def merge_partials(o1: torch.Tensor, l1: torch.Tensor, o2: torch.Tensor,
                   l2: torch.Tensor) -> torch.Tensor:
    """Merge two normalized partial attentions over disjoint keys by log-sum-exp:
    ``(e^l1 o1 + e^l2 o2) / (e^l1 + e^l2) = o2 + sigmoid(l1 - l2) (o1 - o2)``, one ``lerp``
    (in float inside the kernel; the weight in the outputs' dtype)."""
    return torch.lerp(o2, o1, torch.sigmoid(l1 - l2)[..., None].to(o1.dtype))


# -- the per-forward plan ---------------------------------------------------------------
@dataclass(frozen=True)
class PrefillItem:
    """Queries ``rows`` (a slice of the packed tokens) at positions ``start..``."""

    rows: slice
    start: int
    slots: SlotRange  # the slots read: the sequence's up to the chunk's last token
    window: int | None = None


@dataclass(frozen=True)
class CascadeGroup:
    """Queries (positions in the decode plan's ``rows``) that share a prefix's KV."""

    prefix: SlotRange
    queries: torch.Tensor  # [G] indices into DecodePlan.rows


@dataclass(frozen=True)
class ChunkPlan:
    """The cascade's entries with several new tokens, each reading its own keys once
    (:func:`attend_chunks`): ``E`` entries padded to ``N`` queries and ``L`` keys."""

    pos: torch.Tensor        # [E, N] position in DecodePlan.rows of each query (0 where padded)
    index: torch.Tensor      # [E, L] gather index of each entry's own keys (after its group's prefix)
    mask: torch.Tensor       # [E, N, L] causal: query j of an entry sees its keys up to its own position
    valid: torch.Tensor      # [V] flat indices into E * N of the real queries
    valid_pos: torch.Tensor  # [V] their positions in DecodePlan.rows
    new: torch.Tensor        # [E] int32: each entry's queries (for the native kernel)
    context: torch.Tensor    # [E] int32: each entry's own keys before its first query
    _bias: dict[tuple[torch.dtype, int], torch.Tensor] = field(default_factory=dict, compare=False, repr=False)

    def bias(self, dtype: torch.dtype, group: int) -> torch.Tensor:
        """:func:`chunk_bias` of ``mask``, built once per forward for every layer."""
        key = (dtype, group)
        if key not in self._bias:
            self._bias[key] = chunk_bias(self.mask, group, dtype)
        return self._bias[key]


@dataclass(frozen=True)
class DecodePlan:
    """The decode tokens (``rows`` of the packed batch) and how they read KV."""

    rows: torch.Tensor           # [B] packed row of each decode token
    index: torch.Tensor | None   # [B1, L] gather index of the one-token queries (suffix only when cascading)
    mask: torch.Tensor | None    # [B1, L] valid keys, or None when nothing is padded
    single: SlotRange | None     # B == 1 and no cascade: read this range directly
    groups: tuple[CascadeGroup, ...] = ()  # shared prefixes, each read once for its queries
    chunks: ChunkPlan | None = None  # the cascade's several-token entries, when there are any
    single_pos: torch.Tensor | None = None  # [B1] positions in rows of the one-token queries (None: all)
    lens: torch.Tensor | None = None  # [B1] int32: keys of each one-token query in index (for the native kernel)
    in_order: bool = False  # rows are every packed row, in order (no prefill): no gather, no scatter

    @property
    def cascade(self) -> bool:
        return bool(self.groups)

    @property
    def prefix(self) -> SlotRange | None:
        """The (first) shared prefix, or None."""
        return self.groups[0].prefix if self.groups else None


@dataclass(frozen=True)
class AttentionPlan:
    prefill: tuple[PrefillItem, ...]
    decode: DecodePlan | None

    @classmethod
    def build(cls, rows: list[slice], slots: list[torch.Tensor], device: torch.device,
              cascade: bool | None = None, min_shared: int = 32,
              window: int | None = None) -> AttentionPlan:
        """Plan a batch: entry ``i`` has queries ``rows[i]`` and KV ``slots[i]`` (CPU long
        tensor of all its slots, positions ``0..``). ``cascade``: None = when the decode
        entries (and those with at most ``MAX_SHORT`` new tokens) share at least
        ``min_shared`` leading slots; True/False force it. ``window``: a sliding
        attention window (a query at ``p`` reads keys ``p - window + 1 .. p``); entries
        longer than it read their own window, never a shared prefix."""
        single: list[tuple[slice, torch.Tensor]] = []
        short: list[tuple[slice, torch.Tensor]] = []
        long: list[tuple[slice, torch.Tensor]] = []
        for r, s in zip(rows, slots, strict=True):
            n = r.stop - r.start
            (single if n == 1 else short if n <= MAX_SHORT else long).append((r, s))

        def ctx(e: tuple[slice, torch.Tensor]) -> torch.Tensor:  # + the first new slot
            return e[1][:len(e[1]) - (e[0].stop - e[0].start) + 1]

        # candidates: one-token entries, and short ones with context (not fresh prompts);
        # under a window only those whose every query still sees position 0
        cands = [e for e in single + [e for e in short if len(ctx(e)) > 1]
                 if window is None or len(e[1]) <= window]
        groups: list[tuple[int, list[tuple[slice, torch.Tensor]]]] = []
        if cascade is not False and len(cands) > 1:
            found = _cascade_groups([ctx(e) for e in cands], 1 if cascade else min_shared)
            # members in batch order: a batch of one group's decodes reads its rows in order
            groups = [(n, sorted((cands[i] for i in members), key=lambda e: e[0].start))
                      for n, members in found]
        in_group = {id(e) for _, members in groups for e in members}
        long += [e for e in short if id(e) not in in_group]
        q_rows: list[int] = []
        keys: list[torch.Tensor] = []       # the one-token queries' own keys ...
        single_pos: list[int] = []          # ... and their positions in q_rows
        chunks: list[tuple[int, torch.Tensor, int]] = []  # (first position, own keys, own context)
        cascade_groups: list[CascadeGroup] = []

        def add(e: tuple[slice, torch.Tensor], shared: int) -> None:
            r, sl = e
            n = r.stop - r.start
            c = len(sl) - n
            if n > 1 and shared:  # a cascade member with several new tokens: its keys read once
                assert window is None or len(sl) <= window  # (candidates under a window see position 0)
                chunks.append((len(q_rows), sl[shared:], c - shared))
                q_rows.extend(range(r.start, r.stop))
                return
            for j in range(n):  # one query row per new token, reading its own keys causally
                lo = shared if window is None else max(shared, c + j + 1 - window)
                single_pos.append(len(q_rows))
                q_rows.append(r.start + j)
                keys.append(sl[lo:c + j + 1])

        for shared, members in groups:
            first = len(q_rows)
            for e in members:
                add(e, shared)
            cascade_groups.append(CascadeGroup(
                SlotRange.of(members[0][1][:shared].to(device)),
                torch.arange(first, len(q_rows), device=device)))
        for e in single:
            if id(e) not in in_group:
                add(e, 0)
        prefill = []
        for r, sl in long:
            start = len(sl) - (r.stop - r.start)
            off = 0 if window is None else max(0, start - window + 1)  # keys no query sees
            prefill.append(PrefillItem(r, start - off, SlotRange.of(sl[off:].to(device)), window))
        in_order = not prefill and q_rows == list(range(sum(r.stop - r.start for r in rows)))
        return cls(tuple(prefill), cls._plan_decode(q_rows, keys, single_pos, chunks, device,
                                                    tuple(cascade_groups), in_order))

    @staticmethod
    def _plan_decode(rows: list[int], own: list[torch.Tensor], single_pos: list[int],
                     chunks: list[tuple[int, torch.Tensor, int]], device: torch.device,
                     groups: tuple[CascadeGroup, ...], in_order: bool = False) -> DecodePlan | None:
        """Query ``rows[single_pos[i]]`` reads its group's prefix (if any) and its own keys
        ``own[i]``; a chunk's queries read its group's prefix and, causally, its own keys."""
        if not rows:
            return None
        b = len(rows)
        row_t = torch.tensor(rows, dtype=torch.long, device=device)
        if b == 1 and not groups:
            return DecodePlan(row_t, None, None, SlotRange.of(own[0].to(device)))
        index = mask = lens_t = None
        if own:
            lens = [len(s) for s in own]
            width = max(lens)
            index = torch.zeros(len(own), width, dtype=torch.long)
            for i, s in enumerate(own):
                index[i, :len(s)] = s
            index = index.to(device)
            if min(lens) != width:
                mask = (torch.arange(width)[None, :] < torch.tensor(lens)[:, None]).to(device)
            lens_t = torch.tensor(lens, dtype=torch.int32, device=device)
        if not chunks:
            return DecodePlan(row_t, index, mask, None, groups, lens=lens_t, in_order=in_order)
        return DecodePlan(row_t, index, mask, None, groups, _plan_chunks(chunks, device),
                          torch.tensor(single_pos, dtype=torch.long, device=device), lens_t, in_order)


def _plan_chunks(chunks: list[tuple[int, torch.Tensor, int]], device: torch.device) -> ChunkPlan:
    """Pad the chunks (first position in the decode rows, own keys, own context before the
    first new token) to ``[E, N]`` queries and ``[E, L]`` keys."""
    first = torch.tensor([f for f, _, _ in chunks], dtype=torch.long)
    lens = torch.tensor([len(k) for _, k, _ in chunks], dtype=torch.long)
    ctx = torch.tensor([c for _, _, c in chunks], dtype=torch.long)
    nq = lens - ctx
    n, length = int(nq.max()), int(lens.max())
    index = torch.zeros(len(chunks), length, dtype=torch.long)
    for i, (_, k, _) in enumerate(chunks):
        index[i, :len(k)] = k
    j = torch.arange(n)[None, :]
    real = j < nq[:, None]                                                     # [E, N]
    mask = torch.arange(length)[None, None, :] <= (ctx[:, None] + j)[:, :, None]  # [E, N, L]
    mask &= real[:, :, None]
    mask[:, :, 0] |= ~real  # a padding row sees one key (its output is never read)
    pos = torch.where(real, first[:, None] + j, 0)
    valid = real.reshape(-1).nonzero().squeeze(1)
    return ChunkPlan(pos.to(device), index.to(device), mask.to(device), valid.to(device),
                     pos.reshape(-1)[valid].to(device), nq.to(torch.int32).to(device),
                     ctx.to(torch.int32).to(device))


def _cascade_groups(contexts: list[torch.Tensor], min_shared: int) -> list[tuple[int, list[int]]]:
    """Partition sequences (their context slots, each ending with its first new slot,
    which is never shared) into groups that read a common prefix once: ``[(shared
    length, member indices)]``, groups of two or more only.

    Sorted by slots, neighbours' common prefixes (LCP) decide: a run of sequences is one
    group sharing its smallest LCP, or is split at that LCP, whichever reads fewer
    prefix slots in total (a shared prefix of ``n`` slots saves ``n * (members - 1)``
    reads); prefixes shorter than ``min_shared`` are not worth a group.
    """
    # sorted as lists of slots, compared as big-endian bytes (memcmp; slots are >= 0)
    arrays = [c.numpy() for c in contexts]
    keys = [a.astype(">i8").tobytes() for a in arrays]
    order = sorted(range(len(contexts)), key=keys.__getitem__)

    def lcp(a: np.ndarray, b: np.ndarray) -> int:
        n = min(len(a), len(b)) - 1
        if n <= 0:
            return 0
        diff = np.flatnonzero(a[:n] != b[:n])
        return n if diff.size == 0 else int(diff[0])

    links = [lcp(arrays[order[i]], arrays[order[i + 1]]) for i in range(len(order) - 1)]

    def best(lo: int, hi: int) -> tuple[int, list[tuple[int, list[int]]]]:
        """Members order[lo..hi] (inclusive): (slots saved, groups)."""
        if lo == hi:
            return 0, []
        k = min(range(lo, hi), key=lambda i: links[i])
        m = links[k]
        whole = (m * (hi - lo), [(m, order[lo:hi + 1])]) if m >= min_shared else (0, [])
        left, right = best(lo, k), best(k + 1, hi)
        split = (left[0] + right[0], left[1] + right[1])
        return whole if whole[0] >= split[0] and whole[1] else split

    return best(0, len(order) - 1)[1] if order else []


def run_attention(q: torch.Tensor, pool: KVPool, layer: int, plan: AttentionPlan,
                  scale: float, *, kernels: Kernels | None = None) -> torch.Tensor:
    """Attention output ``[T, H, D]`` for the packed queries ``q`` ``[T, H, D]``.

    The new tokens' K/V must already be written to ``pool`` at their slots. ``kernels``
    (:mod:`~structgen.backends.embedded.native`): one-token decode queries read their own
    keys in place through the plan's index, one kernel call, instead of a gather and
    :func:`attend_padded` (the caller checks that they suit ``q``'s dtype and shape).
    """
    dec = plan.decode
    if dec is not None and dec.in_order and len(dec.rows) == q.shape[0] and dec.single is None:
        return _attend_decode(q.contiguous(), pool, layer, dec, scale, kernels)
    out = torch.empty_like(q)
    for item in plan.prefill:
        k, v = pool.read(layer, item.slots)
        out[item.rows] = attend_causal(q[item.rows], k, v, item.start, scale, item.window)
    if dec is None:
        return out
    qd = q.index_select(0, dec.rows)
    if dec.single is not None:
        k, v = pool.read(layer, dec.single)
        o, _ = attend_padded(qd, k[None], v[None], None, scale)
    else:
        o = _attend_decode(qd, pool, layer, dec, scale, kernels)
    out.index_copy_(0, dec.rows, o)
    return out


def _attend_decode(qd: torch.Tensor, pool: KVPool, layer: int, dec: DecodePlan, scale: float,
                   kernels: Kernels | None) -> torch.Tensor:
    """The decode queries ``qd`` (``dec.rows`` of the batch) against their prefixes and own keys."""
    if dec.groups:
        o, lse = _attend_own(qd, pool, layer, dec, scale, kernels)
        for g in dec.groups:
            kp, vp = pool.read(layer, g.prefix)
            every = len(g.queries) == len(dec.rows)  # the one group, every query (rows in order)
            if kernels is not None and kernels.shared_fits(qd, kp):  # AMX tiles, merged in place
                kernels.shared_attention_(qd, kp, vp, scale, o, lse, rows=None if every else g.queries)
                continue
            if every:  # no gather
                op, lsep = attend_shared(qd, kp, vp, scale)
                o = merge_partials(op, lsep, o, lse)
                continue
            qg = qd.index_select(0, g.queries)
            op, lsep = attend_shared(qg, kp, vp, scale)
            o.index_copy_(0, g.queries, merge_partials(
                op, lsep, o.index_select(0, g.queries), lse.index_select(0, g.queries)))
        return o
    if kernels is not None:
        return _own_native(qd, pool, layer, dec, scale, kernels)[0]
    k, v = _gather(pool, layer, dec.index)  # no statistics needed: SDPA is faster on the long padded keys
    return attend_sdpa(qd, k, v, dec.mask, scale)


def _gather(pool: KVPool, layer: int, index: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys and values at ``index`` ``[B, L]``: ``[B, L, KV, D]`` each."""
    assert index is not None  # built by AttentionPlan._plan_decode
    b, width = index.shape
    flat = index.reshape(-1)
    return (pool.k[layer].index_select(0, flat).view(b, width, pool.num_kv_heads, pool.head_dim),
            pool.v[layer].index_select(0, flat).view(b, width, pool.num_kv_heads, pool.head_dim))


def _own_native(q: torch.Tensor, pool: KVPool, layer: int, dec: DecodePlan, scale: float,
                kernels: Kernels) -> tuple[torch.Tensor, torch.Tensor]:
    """The one-token queries ``q`` against their own keys (``dec.index``), read in place."""
    assert dec.index is not None and dec.lens is not None  # built together by _plan_decode
    return kernels.decode_attention(q, pool.k[layer], pool.v[layer], dec.index, dec.lens, scale)


def _attend_own(qd: torch.Tensor, pool: KVPool, layer: int, dec: DecodePlan,
                scale: float, kernels: Kernels | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The decode queries against their own keys (a cascade's suffixes): output and
    log-sum-exp per query, one-token queries padded, several-token entries chunked."""
    ch = dec.chunks
    if ch is None:
        if kernels is not None:
            return _own_native(qd, pool, layer, dec, scale, kernels)
        k, v = _gather(pool, layer, dec.index)
        return attend_padded(qd, k, v, dec.mask, scale)
    b, h, d = qd.shape
    o = torch.empty_like(qd)
    lse = torch.empty(b, h, dtype=torch.float32, device=qd.device)
    if dec.index is not None and dec.single_pos is not None:
        qs = qd.index_select(0, dec.single_pos)
        if kernels is not None:
            os_, ls = _own_native(qs, pool, layer, dec, scale, kernels)
        else:
            k, v = _gather(pool, layer, dec.index)
            os_, ls = attend_padded(qs, k, v, dec.mask, scale)
        o.index_copy_(0, dec.single_pos, os_)
        lse.index_copy_(0, dec.single_pos, ls)
    e, n = ch.pos.shape
    if kernels is not None:  # keys read in place
        kernels.chunk_attention_(qd, pool.k[layer], pool.v[layer], ch.index, ch.pos, ch.new,
                                 ch.context, scale, o, lse)
        return o, lse
    k, v = _gather(pool, layer, ch.index)
    qc = qd.index_select(0, ch.pos.reshape(-1)).view(e, n, h, d)
    fused = fused_available(qc)
    oc, lc = attend_chunks(qc, k, v, ch.mask, scale, fused=fused,
                           bias=ch.bias(qc.dtype, h // k.shape[2]) if fused else None)
    o.index_copy_(0, ch.valid_pos, oc.reshape(e * n, h, d).index_select(0, ch.valid))
    lse.index_copy_(0, ch.valid_pos, lc.reshape(e * n, h).index_select(0, ch.valid))
    return o, lse
