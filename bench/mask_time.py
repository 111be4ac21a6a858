"""Mask time per token on JSON-schema random walks with the SmolLM2 tokenizer.

    .venv/bin/python bench/mask_time.py [--walks 40] [--seed 0] [--threads 1]

Reports p50 / p90 / p99 / max of ``Matcher.fill_bitmask`` (one row, torch int32 CPU
bitmask), of ``consume``, and of ``apply_token_bitmask_inplace`` on a [1, vocab] float32
logits row, plus the compile time (cold, then cached).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import numpy as np
from pydantic import BaseModel, ConfigDict, Field


class Address(BaseModel):
    model_config = ConfigDict(extra="forbid")
    street: str = Field(max_length=40)
    city: str
    zip: str = Field(pattern=r"^[0-9]{5}$")


class Person(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=30)
    age: int = Field(ge=0, le=150)
    email: str | None = None
    tags: list[str] = Field(max_length=5)
    address: Address
    scores: list[float] = Field(max_length=8)


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values), q))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--walks", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from structgen.backends.embedded.loader import load_tokenizer
    from structgen.constraints.bitmask import allocate_token_bitmask, allowed_token_ids, apply_token_bitmask_inplace
    from structgen.constraints.compiler import CompileCache, compiler_for
    from structgen.constraints.spec import json_schema_spec

    tokenizer = load_tokenizer()
    t0 = time.perf_counter()
    compiler = compiler_for(tokenizer, cache=CompileCache())
    t1 = time.perf_counter()
    spec = json_schema_spec(Person, strict=False)  # the schema as before closing existed
    compiled = compiler.compile(spec)
    t2 = time.perf_counter()
    compiler.compile(spec)
    t3 = time.perf_counter()
    print(f"llguidance tokenizer: {(t1 - t0) * 1e3:.0f} ms; compile cold {(t2 - t1) * 1e3:.1f} ms, "
          f"cached {(t3 - t2) * 1e6:.1f} us")

    lltok = compiler.ladder.llguidance_tokenizer
    closers = np.array([t for t in range(compiler.vocab_size)
                        if t != compiler.eos_token_id and lltok.decode_bytes([t])
                        and all(chr(b) in '"}]' for b in lltok.decode_bytes([t]))])
    eos = compiler.eos_token_id
    bitmask = allocate_token_bitmask(1, compiler.vocab_size)
    logits = torch.randn(1, compiler.vocab_size)
    fill: list[float] = []
    consume: list[float] = []
    apply: list[float] = []
    tokens_total = 0
    rng = random.Random(args.seed)
    for _ in range(args.walks):
        matcher = compiled.matcher()
        for step in range(400):
            a = time.perf_counter_ns()
            matcher.fill_bitmask(bitmask, 0)
            b = time.perf_counter_ns()
            fill.append((b - a) / 1e3)
            row = logits.clone()
            a = time.perf_counter_ns()
            apply_token_bitmask_inplace(row, bitmask)
            b = time.perf_counter_ns()
            apply.append((b - a) / 1e3)
            allowed = allowed_token_ids(bitmask, 0, compiler.vocab_size)
            if matcher.is_stopped() or (eos in allowed and rng.random() < 0.5):
                break
            choices = allowed[allowed != eos]
            if step > 100:
                late = np.intersect1d(choices, closers, assume_unique=True)
                choices = late if len(late) else choices
            token = int(choices[rng.randrange(len(choices))])
            a = time.perf_counter_ns()
            ok = matcher.consume(token)
            b = time.perf_counter_ns()
            consume.append((b - a) / 1e3)
            assert ok, matcher.error()
            tokens_total += 1

    for name, values in (("fill_bitmask", fill), ("consume", consume), ("apply_bitmask", apply)):
        print(f"{name:14s} n={len(values):5d}  p50={pct(values, 50):8.1f} us  p90={pct(values, 90):8.1f} us  "
              f"p99={pct(values, 99):8.1f} us  max={max(values):8.1f} us  mean={statistics.fmean(values):8.1f} us")
    print(f"{args.walks} walks, {tokens_total} tokens, vocab {compiler.vocab_size}, "
          f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
