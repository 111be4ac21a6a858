"""Decode step time with a shared prefix: transformers vs the owned forward (plain, cascade).

B sequences share a ``--prefix``-token prompt and each has ``--own`` tokens of its own;
one step decodes one token for each. Three ways, timed interleaved in this process:

* ``hf``: transformers' ``LlamaForCausalLM`` with a ``DynamicCache`` holding a copy of
  the prefix per sequence (what batching through transformers does);
* ``plain``: :class:`DecoderModel` where each sequence gathers its slots (prefix included);
* ``cascade``: :class:`DecoderModel` with shared-prefix attention (prefix KV read once).

    .venv/bin/python bench/decode_attention.py [--batches 1,8,32] [--reps 5]

Last line: ``RESULT cascade_vs_hf_b32=<x> cascade_vs_plain_b32=<x> step_ms_b32=<x>``
(ratios are speedups: hf time / cascade time, plain time / cascade time).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import DynamicCache

from structgen.backends.embedded.loader import load_model
from structgen.backends.embedded.model import DecoderModel, SeqInput


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--prefix", type=int, default=1000)
    ap.add_argument("--own", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    lm = load_model(dtype=dtype)
    hf = lm.model
    model = DecoderModel.from_hf(hf)
    vocab = hf.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(100, vocab, (args.prefix,), generator=gen).tolist()
    batches = [int(b) for b in args.batches.split(",")]
    maxb = max(batches)
    own = torch.randint(100, vocab, (maxb, args.own), generator=gen).tolist()
    nxt = torch.randint(100, vocab, (maxb,), generator=gen).tolist()

    # Owned model: prefix once in slots 0..P-1, then each sequence's own tokens.
    p, o = args.prefix, args.own
    kv = model.new_kv_pool(p + maxb * (o + 1))
    model.forward(model.prepare([SeqInput(prefix, list(range(p)))]), kv)
    seq_slots = [list(range(p)) + list(range(p + i * (o + 1), p + (i + 1) * (o + 1)))
                 for i in range(maxb)]
    model.forward(model.prepare([SeqInput(own[i], seq_slots[i][:-1]) for i in range(maxb)]), kv)

    # transformers: prefix KV computed once, then copied per sequence.
    with torch.inference_mode():
        pre = DynamicCache(config=hf.config)
        hf(input_ids=torch.tensor([prefix]), cache=pre, use_cache=True)

    def hf_step(b: int):
        with torch.inference_mode():
            cache = DynamicCache(config=hf.config)
            for layer, src in zip(cache.layers, pre.layers, strict=True):
                k = src.keys.expand(b, -1, -1, -1).contiguous()
                v = src.values.expand(b, -1, -1, -1).contiguous()
                layer.lazy_initialization(k, v)
                layer.keys, layer.values = k, v
            hf(input_ids=torch.tensor(own[:b]), cache=cache, use_cache=True)
        ids = torch.tensor(nxt[:b])[:, None]

        def step() -> None:
            with torch.inference_mode():
                hf(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
                for layer in cache.layers:  # keep the length fixed across reps
                    layer.keys, layer.values = layer.keys[:, :, :-1], layer.values[:, :, :-1]
        return step

    def ours_step(b: int, cascade: bool):
        batch = model.prepare([SeqInput([nxt[i]], seq_slots[i]) for i in range(b)],
                              cascade=cascade)
        return lambda: model.forward(batch, kv)

    def timed(fn) -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1000

    rows = []
    print(f"dtype={args.dtype} prefix={p} own={o} threads={torch.get_num_threads()} reps={args.reps}")
    print(f"{'batch':>5} {'hf_ms':>9} {'plain_ms':>9} {'cascade_ms':>10} {'hf/casc':>8} {'plain/casc':>10}")
    for b in batches:
        fns = {"hf": hf_step(b), "plain": ours_step(b, False), "cascade": ours_step(b, True)}
        times: dict[str, list[float]] = {k: [] for k in fns}
        for fn in fns.values():  # warm-up
            fn()
        for _ in range(args.reps):
            for name, fn in fns.items():
                times[name].append(timed(fn))
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append((b, med))
        print(f"{b:>5} {med['hf']:>9.1f} {med['plain']:>9.1f} {med['cascade']:>10.1f} "
              f"{med['hf'] / med['cascade']:>8.2f} {med['plain'] / med['cascade']:>10.2f}",
              flush=True)
    b, med = rows[-1]
    print(f"RESULT cascade_vs_hf_b{b}={med['hf'] / med['cascade']:.2f} "
          f"cascade_vs_plain_b{b}={med['plain'] / med['cascade']:.2f} step_ms_b{b}={med['cascade']:.1f}")


if __name__ == "__main__":
    main()
