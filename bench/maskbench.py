"""MaskBench: structgen's constraint layer vs raw grammar engines on real JSON schemas.

    python bench/maskbench.py [DIR] --limit 600 --seed 0    (DIR: ../shared/maskbench from the repo root)
    python bench/maskbench.py DIR --engines structgen,llguidance,xgrammar,outlines --timeout 60

Each file holds a ``schema`` and ``tests`` (instances labelled valid / invalid). For every
file and every engine, in that engine's own worker process (a crash or hang costs one
file, never the run; per-schema timeout): compile the schema for the SmolLM2 tokenizer on
one thread, then for each test instance tokenize its compact JSON and walk it token by
token -- compute the mask at every step (timed), check the token is allowed, consume it --
and at the end check that EOS is allowed. A file *passes* when it compiles, every valid
instance is accepted and every invalid one rejected (mask only, no post-validation).

structgen also reports coverage (every schema jsonschema accepts yields a constraint,
exact or looser), how many constraints were looser, and ``invalid_to_user``: invalid
instances the mask lets through that the final validation
(:func:`structgen.constraints.validation.validate_output`) also accepts -- what a user could receive.

structgen refuses a schema that provably admits no value (a ``ConstraintError``); such
schemas are counted apart (``unsatisfiable``), not against coverage.

The last line is ``RESULT passing_rate=... coverage=... looser=... mask_only_passing=...
llguidance_passing=... invalid_to_user=... mask_p99_ratio=... compile_p50_ratio=...
cached_compile_ms=... unsatisfiable=...``.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import random
import re
import select
import subprocess
import sys
import time
from collections import Counter
from typing import Any

ENGINES = ("structgen", "llguidance", "xgrammar", "outlines")
_ONE_THREAD = {"RAYON_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "TOKENIZERS_PARALLELISM": "false", "TVM_NUM_THREADS": "1"}


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# ---------------------------------------------------------------- engines (worker side)


class _Engine:
    """compile(schema) -> handle (raises on failure); walk(handle, ids) -> (accepted, mask_ns)."""

    name = ""

    def __init__(self, tok: Any):
        self.tok = tok
        self.eos = int(tok.eos_token_id)

    def extra(self, schema: Any, handle: Any) -> dict:
        return {}


def _bit(mask_row: Any, token: int) -> bool:
    return bool((int(mask_row[token >> 5]) >> (token & 31)) & 1)


class StructgenEngine(_Engine):
    name = "structgen"

    def __init__(self, tok: Any):
        super().__init__(tok)
        import numpy as np

        from structgen.constraints.bitmask import allocate_token_bitmask
        from structgen.constraints.compiler import CompileCache, compiler_for
        from structgen.constraints.spec import json_schema_spec
        from structgen.constraints.validation import validate_output

        self.compiler = compiler_for(tok, cache=CompileCache(maxsize=64))
        # the schema as written (open objects): MaskBench's tests follow JSON Schema's default
        self.spec_of = functools.partial(json_schema_spec, strict=False)
        self.validate = validate_output
        self.mask = allocate_token_bitmask(1, self.compiler.vocab_size, kind="numpy")
        self.np = np

    def compile(self, schema: Any) -> Any:
        return self.compiler.compile(self.spec_of(schema))

    def extra(self, schema: Any, handle: Any) -> dict:
        from structgen.constraints.schema import check_schema
        from structgen.errors import StructgenError

        out: dict[str, Any] = {"exact": bool(handle.exact) if handle is not None else None}
        if handle is not None:
            spec = self.spec_of(schema)  # an equal spec, built anew: a cache hit costs its hash
            t0 = time.perf_counter_ns()
            again = self.compiler.compile(spec)
            out["cached_ns"] = time.perf_counter_ns() - t0
            out["cache_same"] = again is handle
            out["rung"] = _rung(handle)
            # Empty the cache outside the timed window: the next compile then never pays an
            # eviction (freeing an old grammar), as raw engines free their handles untimed.
            self.compiler.cache.clear()
        try:
            check_schema(schema)
            out["schema_ok"] = True
        except StructgenError:
            out["schema_ok"] = False
        return out

    def walk(self, handle: Any, ids: list[int]) -> tuple[bool, list[int]]:
        m = handle.matcher()
        row = self.mask[0]
        times = []
        for t in ids:
            t0 = time.perf_counter_ns()
            m.fill_bitmask(self.mask, 0)
            times.append(time.perf_counter_ns() - t0)
            if not _bit(row, t) or not m.consume(t):
                return False, times
        t0 = time.perf_counter_ns()
        m.fill_bitmask(self.mask, 0)
        times.append(time.perf_counter_ns() - t0)
        return _bit(row, self.eos), times

    def final_ok(self, schema: Any, text: str) -> bool:
        from structgen.errors import StructgenError

        try:
            self.validate(self.spec_of(schema), text)
            return True
        except StructgenError:
            return False


def _rung(compiled: Any) -> str:
    """Which rung of the fallback ladder compiled."""
    return str(getattr(compiled, "rung", "?"))


class LLGuidanceEngine(_Engine):
    name = "llguidance"

    def __init__(self, tok: Any):
        super().__init__(tok)
        import llguidance
        import numpy as np

        from structgen.constraints.engines.llguidance import llguidance_tokenizer

        self.llg = llguidance
        self.lltok = llguidance_tokenizer(tok)
        self.words = (int(self.lltok.vocab_size) + 31) // 32
        self.mask = np.zeros(self.words, dtype=np.int32)

    def compile(self, schema: Any) -> Any:
        g = self.llg.LLMatcher.grammar_from_json_schema(schema, overrides={"whitespace_flexible": False})
        m = self.llg.LLMatcher(self.lltok, g, log_level=0)
        if m.is_error():
            raise RuntimeError(m.get_error().split("\n")[0][:300])
        return m

    def walk(self, handle: Any, ids: list[int]) -> tuple[bool, list[int]]:
        m = handle.deep_copy()
        ptr, size = self.mask.ctypes.data, self.mask.nbytes
        times = []
        for t in ids:
            t0 = time.perf_counter_ns()
            m.unsafe_compute_mask_ptr(ptr, size)
            times.append(time.perf_counter_ns() - t0)
            if not _bit(self.mask, t) or not m.consume_token(t):
                return False, times
        t0 = time.perf_counter_ns()
        m.unsafe_compute_mask_ptr(ptr, size)
        times.append(time.perf_counter_ns() - t0)
        return _bit(self.mask, self.eos), times


class XGrammarEngine(_Engine):
    name = "xgrammar"

    def __init__(self, tok: Any):
        super().__init__(tok)
        import xgrammar as xgr

        self.xgr = xgr
        self.info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok))
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        self.mask = xgr.allocate_token_bitmask(1, self.info.vocab_size)

    def compile(self, schema: Any) -> Any:
        return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False,
                                                 separators=(",", ":"))

    def walk(self, handle: Any, ids: list[int]) -> tuple[bool, list[int]]:
        m = self.xgr.GrammarMatcher(handle)
        row = self.mask[0]
        times = []
        for t in ids:
            t0 = time.perf_counter_ns()
            m.fill_next_token_bitmask(self.mask)
            times.append(time.perf_counter_ns() - t0)
            if not _bit(row, t) or not m.accept_token(t):
                return False, times
        t0 = time.perf_counter_ns()
        m.fill_next_token_bitmask(self.mask)
        times.append(time.perf_counter_ns() - t0)
        return _bit(row, self.eos), times


class OutlinesEngine(_Engine):
    name = "outlines"

    def __init__(self, tok: Any):
        super().__init__(tok)
        import torch
        from outlines_core import Guide, Index, Vocabulary
        from outlines_core.json_schema import build_regex_from_schema
        from transformers.convert_slow_tokenizer import bytes_to_unicode  # GPT-2's byte map

        decoder = {c: b for b, c in bytes_to_unicode().items()}
        special = set(tok.all_special_ids)
        vocab: dict[bytes, list[int]] = {}
        for token, idx in tok.get_vocab().items():
            if idx in special:
                continue
            try:
                raw = bytes(decoder[c] for c in token)
            except KeyError:
                raw = token.encode()
            vocab.setdefault(raw, []).append(idx)
        self.vocabulary = Vocabulary(self.eos, vocab)
        self.Index, self.Guide, self.build = Index, Guide, build_regex_from_schema
        self.mask = torch.zeros((len(tok) + 31) // 32, dtype=torch.int32)

    def compile(self, schema: Any) -> Any:
        regex = self.build(json.dumps(schema), None)
        return self.Index(regex, self.vocabulary)

    def walk(self, handle: Any, ids: list[int]) -> tuple[bool, list[int]]:
        g = self.Guide(handle)
        ptr, numel = self.mask.data_ptr(), self.mask.numel()
        row = self.mask
        times = []
        for t in ids:
            t0 = time.perf_counter_ns()
            g.write_mask_into(ptr, numel, 4)
            times.append(time.perf_counter_ns() - t0)
            if not _bit(row, t):
                return False, times
            try:
                g.advance(t, False)
            except Exception:
                return False, times
        t0 = time.perf_counter_ns()
        g.write_mask_into(ptr, numel, 4)
        times.append(time.perf_counter_ns() - t0)
        return _bit(row, self.eos), times


_ENGINE_CLASSES = {"structgen": StructgenEngine, "llguidance": LLGuidanceEngine,
                   "xgrammar": XGrammarEngine, "outlines": OutlinesEngine}


def run_file(engine: _Engine, path: str) -> dict:
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    schema, tests = data["schema"], data.get("tests") or []
    res: dict[str, Any] = {"file": os.path.basename(path), "tests": len(tests)}
    # Every engine compiles with the cyclic GC paused: a collection triggered by the harness's
    # own garbage (JSON loading, jsonschema checks) would otherwise land on a random compile.
    gc.collect(1)
    gc.disable()
    t0 = time.perf_counter_ns()
    try:
        handle = engine.compile(schema)
        res["compile_ns"] = time.perf_counter_ns() - t0
    except Exception as exc:
        handle = None
        res["compile_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    finally:
        gc.enable()
    res.update(engine.extra(schema, handle))
    if handle is None:
        return res
    valid_rejected = invalid_accepted = to_user = 0
    times: list[int] = []
    for test in tests:
        text = compact(test["data"])
        ids = engine.tok.encode(text, add_special_tokens=False)
        accepted, ts = engine.walk(handle, ids)
        times.extend(ts)
        if test["valid"] and not accepted:
            valid_rejected += 1
        elif not test["valid"] and accepted:
            invalid_accepted += 1
            if isinstance(engine, StructgenEngine) and engine.final_ok(schema, text):
                to_user += 1
    res.update(valid_rejected=valid_rejected, invalid_accepted=invalid_accepted,
               invalid_to_user=to_user, mask_ns=times)
    return res


def worker(engine_name: str) -> None:
    for k, v in _ONE_THREAD.items():
        os.environ.setdefault(k, v)
    from structgen.backends.embedded.loader import load_tokenizer

    tok = load_tokenizer()
    engine = _ENGINE_CLASSES[engine_name](tok)
    out = sys.stdout
    out.write(json.dumps({"ready": engine_name}) + "\n")
    out.flush()
    for line in sys.stdin:
        path = line.strip()
        if not path:
            continue
        try:
            res = run_file(engine, path)
        except Exception as exc:
            res = {"file": os.path.basename(path), "crash": f"{type(exc).__name__}: {exc}"[:300]}
        out.write(json.dumps(res) + "\n")
        out.flush()


# ------------------------------------------------------------------- parent side


class Worker:
    """One engine's worker process; restarted after a crash or a timeout."""

    def __init__(self, engine: str, start_timeout: float = 300.0):
        self.engine = engine
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen[str] | None = None

    def _start(self) -> None:
        env = dict(os.environ, **_ONE_THREAD)
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", self.engine],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env=env, bufsize=1)
        line = self._read(self.start_timeout)
        if line is None or "ready" not in line:
            self.kill()
            raise RuntimeError(f"worker for {self.engine} did not start")

    def _read(self, timeout: float) -> str | None:
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if ready:
                line = self.proc.stdout.readline()
                return line or ""  # "" = EOF: the worker died

    def run(self, path: str, timeout: float) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(path + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            self.kill()
            return {"file": os.path.basename(path), "crash": "worker pipe closed"}
        line = self._read(timeout)
        if line is None:
            self.kill()
            return {"file": os.path.basename(path), "timeout": True}
        if line == "":
            rc = self.proc.wait()
            self.proc = None
            return {"file": os.path.basename(path), "crash": f"worker exited with {rc}"}
        return json.loads(line)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = min(len(s) - 1, max(0, round(p / 100.0 * (len(s) - 1))))
    return s[k]


def source_of(name: str) -> str:
    """The data source a file name starts with (``Github_easy---o1.json``, ``BFCL_java_3.json``)."""
    if "---" in name:
        return name.split("---", maxsplit=1)[0]
    return re.sub(r"_\d+\.json$", "", name)


def summarize(engine: str, rows: list[dict]) -> dict:
    s: dict[str, Any] = Counter()
    masks: list[float] = []
    compiles: list[float] = []
    cached: list[float] = []
    for r in rows:
        s["files"] += 1
        has_tests = r.get("tests", 0) > 0
        s["with_tests"] += has_tests
        if r.get("timeout"):
            s["timeouts"] += 1
            continue
        if "crash" in r:
            s["crashes"] += 1
            continue
        if "compile_error" in r:
            s["compile_errors"] += 1
            continue
        compiles.append(r["compile_ns"] / 1e6)
        if "cached_ns" in r:
            cached.append(r["cached_ns"] / 1e6)
        if r.get("exact") is False:
            s["looser"] += 1
        masks.extend(t / 1e3 for t in r.get("mask_ns", ()))
        s["valid_rejected"] += r.get("valid_rejected", 0)
        s["invalid_accepted"] += r.get("invalid_accepted", 0)
        s["invalid_to_user"] += r.get("invalid_to_user", 0)
        s["files_valid_rejected"] += r.get("valid_rejected", 0) > 0
        s["files_invalid_accepted"] += r.get("invalid_accepted", 0) > 0
        if has_tests and r.get("valid_rejected", 0) == 0 and r.get("invalid_accepted", 0) == 0:
            s["passing"] += 1
    out = dict(s)
    out["engine"] = engine
    out["mask_us"] = {"avg": sum(masks) / len(masks) if masks else float("nan"), "p50": pct(masks, 50),
                      "p99": pct(masks, 99), "p99.9": pct(masks, 99.9), "n": len(masks)}
    out["compile_ms"] = {"p50": pct(compiles, 50), "p75": pct(compiles, 75), "p99": pct(compiles, 99)}
    out["cached_ms"] = {"p50": pct(cached, 50), "p99": pct(cached, 99), "max": max(cached) if cached else None}
    return out


def print_table(summaries: list[dict]) -> None:
    head = ("engine", "passing", "compile err", "valid rej (files)", "invalid acc (files)", "crash/timeout",
            "mask us avg/p50/p99/p99.9", "compile ms p50/p75/p99", "cache hit ms p50/p99")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for s in summaries:
        m, c, h = s["mask_us"], s["compile_ms"], s["cached_ms"]
        hit = f"{h['p50']:.4f} / {h['p99']:.4f}" if h.get("max") is not None else "n/a"
        print("| " + " | ".join([
            s["engine"], f"{s.get('passing', 0)}/{s.get('with_tests', 0)}", str(s.get("compile_errors", 0)),
            f"{s.get('valid_rejected', 0)} ({s.get('files_valid_rejected', 0)})",
            f"{s.get('invalid_accepted', 0)} ({s.get('files_invalid_accepted', 0)})",
            f"{s.get('crashes', 0)}/{s.get('timeouts', 0)}",
            f"{m['avg']:.1f} / {m['p50']:.1f} / {m['p99']:.1f} / {m['p99.9']:.1f}",
            f"{c['p50']:.3f} / {c['p75']:.3f} / {c['p99']:.3f}", hit]) + " |")


def generate_on_looser(dir_: str, names: list[str], n: int, max_tokens: int) -> None:
    """The embedded model (greedy) under each looser constraint: how often does its
    output then pass the final validation? What the user sees when it does not."""
    from structgen.backends.embedded import EmbeddedBackend
    from structgen.constraints.spec import json_schema_spec
    from structgen.constraints.validation import validate_output
    from structgen.contract.backend import GenerateRequest, SamplingParams
    from structgen.errors import OutputValidationError, StructgenError

    backend = EmbeddedBackend()
    ok = bad = cut = failed = 0
    shown = 0
    try:
        for name in names[:n]:
            with open(os.path.join(dir_, name), encoding="utf-8") as fh:
                schema = json.load(fh)["schema"]
            spec = json_schema_spec(schema, strict=False)
            prompt = ("<|im_start|>user\nWrite one JSON value valid against this JSON schema:\n"
                      + compact(schema)[:1500] + "<|im_end|>\n<|im_start|>assistant\n")
            res = backend.generate([GenerateRequest(prompt, SamplingParams(max_new_tokens=max_tokens),
                                                    constraint=spec)])[0]
            if isinstance(res, StructgenError):
                failed += 1
                continue
            try:
                validate_output(spec, res.text, truncated=res.finish_reason == "length")
                ok += 1
            except OutputValidationError as exc:
                bad += 1
                cut += bool(exc.truncated)
                if shown < 2:
                    shown += 1
                    print(f"  {name}: OutputValidationError: {str(exc)[:300]}")
            except StructgenError as exc:
                failed += 1
                print(f"  {name}: {type(exc).__name__}: {str(exc)[:200]}")
    finally:
        backend.close()
    print(f"embedded model on {min(n, len(names))} looser constraints (greedy, max {max_tokens} tokens): "
          f"{ok} pass the final validation, {bad} rejected by it (OutputValidationError: {cut} cut short "
          f"by max_tokens, {bad - cut} complete but invalid), {failed} errors")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", nargs="?", help="MaskBench's folder of .json files (default: ../shared/maskbench)")
    ap.add_argument("--limit", type=int, default=0, help="a random sample of N files (0 = all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--files", help="a file listing the file names to run (one a line)")
    ap.add_argument("--engines", default="structgen,llguidance",
                    help=f"comma-separated, from {','.join(ENGINES)}")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per schema and engine")
    ap.add_argument("--out", help="write every per-file result (JSON lines) here")
    ap.add_argument("--generate", type=int, default=0, metavar="N",
                    help="also run the embedded model on N looser structgen constraints")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker)
        return 0
    if not args.dir:  # ../shared/maskbench next to the repository
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from tests.shared_data import shared_dir

        args.dir = str(shared_dir() / "maskbench")
        if not os.path.isdir(args.dir):
            ap.error(f"no MaskBench data at {args.dir}: give its folder as DIR")
    engines = [e for e in args.engines.split(",") if e]
    for e in engines:
        if e not in ENGINES:
            ap.error(f"unknown engine {e!r}")
    names = sorted(n for n in os.listdir(args.dir) if n.endswith(".json"))
    if args.files:
        with open(args.files, encoding="utf-8") as fh:
            wanted = [ln.strip() for ln in fh if ln.strip() and not ln.startswith("#")]
        names = [n for n in wanted if n in set(names)]
    elif args.limit and args.limit < len(names):
        names = sorted(random.Random(args.seed).sample(names, args.limit))
    workers = {e: Worker(e) for e in engines}
    rows: dict[str, list[dict]] = {e: [] for e in engines}
    out = open(args.out, "w", encoding="utf-8") if args.out else None  # noqa: SIM115 - closed below
    t_start = time.monotonic()
    try:
        for i, name in enumerate(names):
            path = os.path.join(args.dir, name)
            for e in engines:
                try:
                    r = workers[e].run(path, args.timeout)
                except RuntimeError as exc:
                    r = {"file": name, "crash": str(exc)}
                r["engine"] = e
                if out is not None:
                    slim = {k: v for k, v in r.items() if k != "mask_ns"}
                    ms = r.get("mask_ns") or []
                    slim["mask_tokens"] = len(ms)
                    slim["mask_max_us"] = max(ms) / 1e3 if ms else None
                    slim["mask_sum_us"] = sum(ms) / 1e3
                    out.write(json.dumps(slim) + "\n")
                rows[e].append(r)
            if (i + 1) % 50 == 0:
                print(f"# {i + 1}/{len(names)} files, {time.monotonic() - t_start:.0f}s", file=sys.stderr)
    finally:
        for w in workers.values():
            w.kill()
        if out is not None:
            out.close()
    summaries = [summarize(e, rows[e]) for e in engines]
    print(f"# maskbench: {len(names)} files from {args.dir} (limit={args.limit or 'all'}, seed={args.seed}), "
          f"engines {','.join(engines)}, timeout {args.timeout:.0f}s, one thread each, "
          f"{time.monotonic() - t_start:.0f}s")
    print_table(summaries)
    by = {s["engine"]: s for s in summaries}
    ours = by.get("structgen")
    raw = by.get("llguidance")
    if ours is not None:
        # per source, structgen's layer
        print("\nstructgen per source (passing / files with tests):")
        src: dict[str, Counter] = {}
        for r in rows["structgen"]:
            c = src.setdefault(source_of(r["file"]), Counter())
            if r.get("tests", 0) == 0:
                continue
            c["n"] += 1
            if "compile_ns" in r and not r.get("valid_rejected") and not r.get("invalid_accepted"):
                c["pass"] += 1
            if r.get("exact") is False:
                c["looser"] += 1
        for k in sorted(src):
            c = src[k]
            print(f"  {k:24s} {c['pass']:5d} / {c['n']:5d}   looser {c['looser']}")
        rung = Counter(r.get("rung") for r in rows["structgen"] if "compile_ns" in r)
        print("structgen rungs:", dict(rung))
        accepted = [r for r in rows["structgen"] if r.get("schema_ok")]
        # a schema proven to admit no value is refused with a ConstraintError, as it should be
        empty = [r for r in accepted if "admits no value" in r.get("compile_error", "")]
        accepted = [r for r in accepted if r not in empty]
        covered = [r for r in accepted if "compile_ns" in r]
        coverage = len(covered) / len(accepted) if accepted else float("nan")
        print(f"structgen coverage: {len(covered)}/{len(accepted)} satisfiable schemas that jsonschema accepts "
              f"compile ({len(rows['structgen']) - len(accepted) - len(empty)} rejected by jsonschema's "
              f"meta-schema check, {len(empty)} refused as unsatisfiable: "
              f"{', '.join(r['file'] for r in empty[:3])}{' ...' if len(empty) > 3 else ''})")
        same = sum(1 for r in rows["structgen"] if r.get("cache_same"))
        print(f"structgen cache: {same}/{len(covered)} repeated compiles returned the cached object")
        if raw is not None:
            failed = raw.get("with_tests", 0) - raw.get("passing", 0)
            goal = raw.get("passing", 0) + 0.25 * failed
            print(f"goal: mask-only passing >= {goal:.1f} (llguidance {raw.get('passing', 0)} + 25% of {failed})")
        if args.generate:
            looser = [r["file"] for r in rows["structgen"] if r.get("exact") is False]
            # a seeded random sample across sources (the rows are in file-name order)
            looser = random.Random(args.seed).sample(looser, min(args.generate, len(looser)))
            generate_on_looser(args.dir, looser, args.generate, args.max_tokens)
        if raw is not None:
            # the same statistics on the files both compile (structgen also walks the
            # schemas raw llguidance cannot compile, often the heavier ones)
            both = {r["file"] for r in rows["llguidance"] if "compile_ns" in r}
            common = [summarize(e, [r for r in rows[e] if r["file"] in both]) for e in ("structgen", "llguidance")]
            print("on the {} files both compile: mask p99 {:.1f} / {:.1f} us (ratio {:.3f}), compile p50 "
                  "{:.3f} / {:.3f} ms (ratio {:.3f})".format(
                      len(both), common[0]["mask_us"]["p99"], common[1]["mask_us"]["p99"],
                      common[0]["mask_us"]["p99"] / common[1]["mask_us"]["p99"], common[0]["compile_ms"]["p50"],
                      common[1]["compile_ms"]["p50"], common[0]["compile_ms"]["p50"] / common[1]["compile_ms"]["p50"]))
        mask_ratio = ours["mask_us"]["p99"] / raw["mask_us"]["p99"] if raw else float("nan")
        comp_ratio = ours["compile_ms"]["p50"] / raw["compile_ms"]["p50"] if raw else float("nan")
        with_tests = ours.get("with_tests", 0)
        print(f"RESULT passing_rate={ours.get('passing', 0) / with_tests if with_tests else float('nan'):.4f} "
              f"coverage={coverage:.4f} looser={ours.get('looser', 0)} "
              f"mask_only_passing={ours.get('passing', 0)} "
              f"llguidance_passing={raw.get('passing', 0) if raw else 'nan'} "
              f"invalid_to_user={ours.get('invalid_to_user', 0)} "
              f"mask_p99_ratio={mask_ratio:.3f} compile_p50_ratio={comp_ratio:.3f} "
              f"cached_compile_ms={ours['cached_ms']['p50']:.4f} unsatisfiable={len(empty)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
