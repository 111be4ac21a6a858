"""Overhead benchmarks. Run: ``python bench/overhead.py`` (prints ``RESULT name=value`` lines).

(b) ``constrained_ratio``: time per output token of JSON-schema-constrained decoding over
    unconstrained decoding on the embedded model. Same prompt, same number of tokens
    (the schema requires a long string so the constraint never ends first; the free run
    uses ``min_new_tokens`` + ``ignore_eos``), prompt KV cached for both so only decode
    steps are timed, A/B runs interleaved. Goal: <= 1.03 (the mask is computed in a
    worker thread while the model runs).

Each part is one function returning a number, plus a line in :func:`main`.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: a schema whose shortest document is longer than any run here: the constraint stays active
_LONG_SCHEMA = {"type": "object", "required": ["story"],
                "properties": {"story": {"type": "string", "minLength": 400}}}


def _per_token(backend: Any, request: Any) -> float:
    start = time.perf_counter()
    [res] = backend.generate([request])
    elapsed = time.perf_counter() - start
    if isinstance(res, Exception):
        raise res
    return elapsed / max(1, res.meta["completion_tokens"])


def constrained_ratio(backend: Any = None, *, tokens: int = 24, rounds: int = 4,
                      overlap: bool = True, verbose: bool = False) -> float:
    """Constrained / unconstrained seconds per output token (> 1 = constrained is slower).

    The ratio of the fastest run of each kind: on a shared machine, load from other
    processes only ever adds time, so the minimum is the least noisy estimate of each
    cost (the verbose line also shows the ratio of medians).
    """
    from structgen.backend import GenerateRequest, SamplingParams
    from structgen.constraints.spec import json_schema_spec

    if backend is None:
        from structgen.backends.embedded import EmbeddedBackend

        backend = EmbeddedBackend()
    template = backend.chat_template()
    prompt = (template.render([{"role": "user", "content": "Tell me a long story about a lighthouse, as JSON."}])
              if template is not None else "Tell me a long story about a lighthouse, as JSON.\n")
    free = GenerateRequest(prompt, SamplingParams(max_new_tokens=tokens, min_new_tokens=tokens, ignore_eos=True))
    constrained = GenerateRequest(prompt, SamplingParams(max_new_tokens=tokens),
                                  constraint=json_schema_spec(_LONG_SCHEMA))
    saved = getattr(backend, "overlap_mask", None)
    if saved is not None:
        backend.overlap_mask = overlap
    try:
        _per_token(backend, free)  # warm-up: load, compile the schema, cache the prompt KV
        _per_token(backend, constrained)
        a: list[float] = []
        b: list[float] = []
        for i in range(rounds):  # interleaved, alternating which goes first
            pair = [(a, free), (b, constrained)] if i % 2 == 0 else [(b, constrained), (a, free)]
            for bucket, request in pair:
                bucket.append(_per_token(backend, request))
    finally:
        if saved is not None:
            backend.overlap_mask = saved
    ratio = min(b) / min(a)
    if verbose:
        print(f"unconstrained {1e3 * min(a):.1f} ms/token (median {1e3 * statistics.median(a):.1f}), "
              f"constrained {1e3 * min(b):.1f} ms/token (median {1e3 * statistics.median(b):.1f}); "
              f"{tokens} tokens x {rounds} rounds, overlap={overlap}: ratio {ratio:.3f} "
              f"(of medians {statistics.median(b) / statistics.median(a):.3f})")
    return ratio


def main() -> None:
    from structgen.backends.embedded import EmbeddedBackend

    backend = EmbeddedBackend()
    print(f"RESULT constrained_ratio={constrained_ratio(backend, verbose=True):.4f}", flush=True)
    if "--no-overlap" in sys.argv:
        ratio = constrained_ratio(backend, overlap=False, verbose=True)
        print(f"RESULT constrained_ratio_no_overlap={ratio:.4f}", flush=True)
    backend.close()


if __name__ == "__main__":
    main()
