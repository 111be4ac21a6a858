"""P1: few-shot JSON extraction behind a shared ~1,000-token prefix, prefix cache on vs off.

    python bench/prefix_sharing.py [--docs 64] [--rounds 1]
        [--competitors outlines,llamacpp,vllm] [--competitor-docs N] [--skip-cache-off]
        [--dtype auto|float32|bfloat16]

Same program, same 64 documents, same model (SmolLM2-135M on the embedded backend); the
only difference is the engine's prefix cache. Prints docs/s for each (rounds interleaved),
the throughput ratio, and the prefill tokens computed with the cache against the
unique-token minimum (the size of the token trie of all prompts). Last line:

    RESULT cache_speedup=<x> prefill_vs_minimum=<x> vs_outlines=<x> vs_llamacpp=<x> vs_vllm=<x>

The vs_* figures compare against other tools run in the same script; a tool that is not
installed here is reported as ``nan`` (see the closing note of issue 3 for which ran).
P2: ``--competitors`` names the tools to run (default none; see bench/competitors.py), on the
same traced prompts, model, schema and max tokens; ``--competitor-docs N`` gives Outlines and
llama.cpp only the first N documents (vLLM always gets all). Ratios compare docs/s, so a
subset compares fairly: vs_<tool> = structgen docs/s (cache on) / the tool's docs/s.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pydantic import BaseModel

import structgen as sg
from structgen.lang.tracer import trace_first_prompt

NAMES = ["Ada", "Bruno", "Chloe", "Dario", "Elena", "Farid", "Greta", "Hugo", "Ines", "Jonas", "Keiko",
         "Liam", "Maya", "Nils", "Olga", "Pavel", "Quinn", "Rosa", "Sven", "Tara", "Umar", "Vera"]
CITIES = ["Lyon", "Porto", "Graz", "Turku", "Bergen", "Split", "Ghent", "Malmo", "Bilbao", "Trieste",
          "Leeds", "Aarhus", "Brno", "Cork", "Basel", "Lille", "Namur", "Parma", "Kaunas", "Tartu"]


class Person(BaseModel):
    name: str
    age: int
    city: str


def build_prefix(tokenizer, target_tokens: int = 1000) -> str:
    head = ("You read short texts about people and extract each person's name, age and city as "
            "compact JSON with the keys name, age and city. Use the exact spelling from the text. "
            "Ages are whole numbers. If a text mentions several places, use the one the person lives in.\n"
            "Examples:\n")
    lines = []
    i = 0
    while len(tokenizer(head + "".join(lines)).input_ids) < target_tokens:
        n, c, a = NAMES[i % len(NAMES)], CITIES[(i * 7) % len(CITIES)], 19 + (i * 13) % 60
        lines.append(f"Text: {n} is {a} years old and has lived in {c} since childhood.\n"
                     f'JSON: {{"name":"{n}","age":{a},"city":"{c}"}}\n')
        i += 1
    return head + "".join(lines)


def documents(n: int) -> list[str]:
    out = []
    for i in range(n):
        name = f"{NAMES[i % len(NAMES)]} {chr(65 + i % 26)}."
        out.append(f"Doc {i}: {name} turned {20 + (i * 7) % 50} this spring; home is {CITIES[i % len(CITIES)]}.")
    return out


@sg.program
def extract(s, prefix, doc):
    s += sg.system(prefix)
    s += sg.user(doc)
    s += sg.assistant(sg.gen("person", json_schema=Person, max_tokens=40))


def trie_size(seqs: list[list[int]]) -> int:
    """Distinct prefixes over all sequences: the fewest positions any cache must compute."""
    root: dict = {}
    count = 0
    for seq in seqs:
        node = root
        for tok in seq:
            if tok not in node:
                node[tok] = {}
                count += 1
            node = node[tok]
    return count


def run(backend, items) -> tuple[float, dict]:
    backend.clear_prefix_cache()
    before = backend.stats()
    start = time.perf_counter()
    states = extract.run_batch(items, backend=backend)
    elapsed = time.perf_counter() - start
    after = backend.stats()
    # a document whose output fails validation (the small model can ramble inside a string
    # until max_tokens) is still served: the user gets a typed error with the raw text
    valid = 0
    for st in states:
        err = st.error()
        if err is None:
            assert isinstance(st.value("person"), Person)
            valid += 1
        elif not isinstance(err, sg.OutputValidationError):
            raise SystemExit(f"item failed: {err}")
    delta = {k: after[k] - before[k] for k in ("computed_tokens", "cached_tokens", "prompt_tokens",
                                               "forward_passes")}
    delta["valid"] = valid
    return len(items) / elapsed, delta


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--competitors", default="",
                    help="comma-separated subset of outlines,llamacpp,vllm (default: none)")
    ap.add_argument("--competitor-docs", type=int, default=None,
                    help="documents for outlines and llama.cpp (default: all)")
    ap.add_argument("--competitor-logs", default=str(Path(tempfile.gettempdir()) / "structgen-p2-logs"))
    ap.add_argument("--dtype", default="auto",
                    help="the embedded model's dtype (default auto: bfloat16 where the CPU has a bf16 "
                         "instruction set and a probe measures it faster, else float32; vLLM runs "
                         "in the same one)")
    ap.add_argument("--skip-cache-off", action="store_true",
                    help="skip the cache-off runs (cache_speedup=nan); for P2-only runs")
    args = ap.parse_args()
    from structgen.backends.embedded import EmbeddedBackend
    from structgen.backends.embedded.engine import EngineConfig

    on = EmbeddedBackend(dtype=args.dtype)
    print(f"structgen dtype {on.dtype_choice.describe() if on.dtype_choice else on.hf_model.dtype}", flush=True)
    off = EmbeddedBackend(engine=EngineConfig(prefix_cache=False), dtype=args.dtype)
    prefix = build_prefix(on.tokenizer)
    items = [{"prefix": prefix, "doc": d} for d in documents(args.docs)]
    prompts = [on.encode(trace_first_prompt(extract, it, on)) for it in items]
    minimum = trie_size(prompts)
    print(f"prefix {len(on.encode(prefix))} tokens, {args.docs} documents, prompts "
          f"{sum(map(len, prompts))} tokens, unique-token minimum {minimum}", flush=True)
    extract.run_batch(items[:2], backend=on)  # warm-up: schema compile, threads
    rates_on, rates_off = [], []
    computed = None
    for r in range(args.rounds):
        for name, backend, rates in ([("off", off, rates_off), ("on", on, rates_on)] if r % 2 == 0
                                     else [("on", on, rates_on), ("off", off, rates_off)]):
            if name == "off" and args.skip_cache_off:
                continue
            rate, delta = run(backend, items)
            rates.append(rate)
            if name == "on":
                computed = delta["computed_tokens"]
            print(f"round {r} cache {name}: {rate:.2f} docs/s {delta}", flush=True)
    speedup = max(rates_on) / max(rates_off) if rates_off else float("nan")
    ratio = computed / minimum
    off_rate = max(rates_off) if rates_off else float("nan")
    print(f"cache on {max(rates_on):.2f} docs/s vs off {off_rate:.2f} docs/s: {speedup:.2f}x; "
          f"prefill computed {computed} vs minimum {minimum}: {ratio:.3f}x", flush=True)
    vs = {name: float("nan") for name in ("outlines", "llamacpp", "vllm")}
    names = [n.strip() for n in args.competitors.split(",") if n.strip()]
    if names:
        from bench.competitors import ratio as tool_ratio
        from bench.competitors import run_competitors
        from structgen.backends.embedded.loader import default_gguf_path, resolve_model_dir

        texts = [trace_first_prompt(extract, it, on) for it in items]
        schema = Person.model_json_schema()
        results = run_competitors(names, texts, schema, 40, subset=args.competitor_docs,
                                  model_dir=str(resolve_model_dir()), gguf=str(default_gguf_path()),
                                  log_dir=Path(args.competitor_logs),
                                  vllm_dtype=str(on.hf_model.dtype).removeprefix("torch."))
        rate = max(rates_on)
        for name, res in results.items():
            if name in vs:
                vs[name] = tool_ratio(rate, res)
                print(f"structgen {rate:.2f} docs/s vs {name} {res.docs_per_s:.3f} docs/s: {vs[name]:.2f}x "
                      f"({res.valid}/{res.docs} valid)" if res.error is None else
                      f"vs_{name}=nan: {res.error}", flush=True)
    print(f"RESULT cache_speedup={speedup:.2f} prefill_vs_minimum={ratio:.3f} "
          f"vs_outlines={vs['outlines']:.2f} vs_llamacpp={vs['llamacpp']:.2f} vs_vllm={vs['vllm']:.2f}",
          flush=True)


if __name__ == "__main__":
    main()
