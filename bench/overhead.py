"""Overhead benchmarks. Run: ``python bench/overhead.py``; the last line is
``RESULT gen_overhead_us=<float> constrained_ratio=<float>``.

(a) ``gen_overhead_us``: the interpreter's own cost per ``gen`` (building the node, the
    request, the capability check, delivering and recording the result), against a
    backend that answers instantly. Measured as (a program with N gens - the same
    program with the gens' text only) / N, best of several interleaved rounds. Goal: <= 50 us.

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


def gen_overhead_us(*, gens: int = 50, reps: int = 100, rounds: int = 7, verbose: bool = False) -> float:
    """Microseconds the interpreter adds per ``gen`` (scripted backend, no model)."""
    import structgen as sg
    from structgen.backends.fake import FakeBackend
    from structgen.contract.backend import GenerateResult

    result = GenerateResult("x")

    class Instant(FakeBackend):
        def generate(self, requests, *, on_text=None):  # type: ignore[override]
            return [result for _ in requests]

    backend = Instant()

    @sg.program
    def with_gens(s):
        for _ in range(gens):
            s += "q" + sg.gen("a", max_tokens=4)

    @sg.program
    def text_only(s):
        for _ in range(gens):
            s += "q" + "x"

    def best(program: Any) -> float:
        start = time.perf_counter()
        for _ in range(reps):
            program.run(backend=backend)
        return (time.perf_counter() - start) / reps

    a: list[float] = []
    b: list[float] = []
    for i in range(rounds):
        for bucket, program in ([(a, with_gens), (b, text_only)] if i % 2 == 0
                                else [(b, text_only), (a, with_gens)]):
            bucket.append(best(program))
    per_gen = (min(a) - min(b)) / gens * 1e6
    if verbose:
        median_based = (statistics.median(a) - statistics.median(b)) / gens * 1e6
        print(f"program with {gens} gens {1e6 * min(a):.0f} us, text only {1e6 * min(b):.0f} us: "
              f"{per_gen:.1f} us per gen (median-based {median_based:.1f})")
    return per_gen


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
    from structgen.constraints.spec import json_schema_spec
    from structgen.contract.backend import GenerateRequest, SamplingParams

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

    overhead = gen_overhead_us(verbose=True)
    backend = EmbeddedBackend()
    ratio = constrained_ratio(backend, verbose=True)
    backend.close()
    print(f"RESULT gen_overhead_us={overhead:.2f} constrained_ratio={ratio:.4f}", flush=True)


if __name__ == "__main__":
    main()
