"""Extraction quality against gold JSON: structgen vs the same prompts unconstrained vs Outlines.

    python bench/extract_quality.py [FILE] [--limit N] [--outlines-limit M] [--max-tokens 512]
        [--skip unconstrained,outlines]

FILE (default ``../shared/extract/deepjsoneval.jsonl`` relative to the project root) is any
JSONL whose lines have ``schema``, ``text`` and ``gold``; nothing else is assumed. One model
(SmolLM2-135M-Instruct), one prompt per record (structgen's extraction prompt: instructions
with the record's schema, the text; rendered with the model's chat template), greedy:

* structgen: ``structgen.extract`` with each record's own schema (``--schema-field``
  style), per-field confidence on, one retry with the validator's feedback;
* unconstrained: the same prompt text, generated without a constraint on the same
  engine; the first JSON object in the output is parsed (nothing parsed = no leaves);
* Outlines + transformers (venv ``$STRUCTGEN_ENGINES/outlines``): the same prompt text
  and schema, on the first ``--outlines-limit`` records.

Leaves are compared by JSON path (list items by index): numbers by value, booleans as
such, strings after normalisation (NFKC, case-folded, whitespace collapsed, surrounding
punctuation stripped); null leaves count as absent. Micro-averaged precision / recall / F1
over all leaves. ``valid_rate``: of structgen's completed outputs (not cut short by
max_tokens), the share that validate against the schema -- invalid output never reaches
the user, it comes back as an error. ``confidence_auc``: how well a leaf's confidence
separates right from wrong leaves (Mann-Whitney AUC), leaves ordered as
:func:`structgen.extract.confidence.rank` orders them for review (not a repeated list value
first, then grounded in the record's text, then by mean token log-probability); the AUCs of
the mean log-probability alone and of the ranking without the repetition mark are printed
beside it. Last line:

    RESULT leaf_f1=<x> leaf_f1_unconstrained=<x> leaf_f1_outlines=<x> valid_rate=<x> confidence_auc=<x>
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import unicodedata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ENGINES = Path(os.environ.get("STRUCTGEN_ENGINES", Path.home() / ".cache" / "structgen" / "engines"))
OUTLINES_VENV = Path(os.environ.get("STRUCTGEN_OUTLINES_VENV", ENGINES / "outlines"))


# -- scoring (pure Python; also used by the tests) ------------------------------------------------

def leaves(value: Any, path: str = "$") -> dict[str, Any]:
    """``{json path: leaf value}``; nulls and empty containers are absent."""
    out: dict[str, Any] = {}
    if isinstance(value, dict):
        for k, v in value.items():
            out.update(leaves(v, f"{path}.{k}"))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.update(leaves(v, f"{path}[{i}]"))
    elif value is not None:
        out[path] = value
    return out


_PUNCT = " \t\n\"'.,;:!?()[]{}“”‘’「」《》，。：；！？（）"


def norm(value: Any) -> Any:
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, (int, float)):
        return ("num", round(float(value), 6))
    text = unicodedata.normalize("NFKC", str(value)).casefold()
    text = re.sub(r"\s+", " ", text).strip(_PUNCT)
    try:  # "92" and 92 are the same number
        return ("num", round(float(text.replace(",", "")), 6))
    except ValueError:
        return ("str", text)


def score(pred: Any, gold: Any) -> tuple[int, int, int, dict[str, bool]]:
    """``(true positives, predicted leaves, gold leaves, {predicted path: right?})``."""
    p, g = leaves(pred), leaves(gold)
    right = {path: path in g and norm(v) == norm(g[path]) for path, v in p.items()}
    return sum(right.values()), len(p), len(g), right


def prf(tp: int, npred: int, ngold: int) -> tuple[float, float, float]:
    prec = tp / npred if npred else 0.0
    rec = tp / ngold if ngold else 0.0
    return prec, rec, (2 * prec * rec / (prec + rec) if prec + rec else 0.0)


def auc(pos: list[Any], neg: list[Any]) -> float:
    """P(a right leaf's confidence > a wrong leaf's), ties counting half."""
    if not pos or not neg:
        return float("nan")
    ranked = sorted([(v, 1) for v in pos] + [(v, 0) for v in neg])
    rank_sum, i = 0.0, 0
    while i < len(ranked):
        j = i
        while j < len(ranked) and ranked[j][0] == ranked[i][0]:
            j += 1
        avg = (i + j + 1) / 2  # 1-based average rank of the tie group
        rank_sum += avg * sum(1 for k in range(i, j) if ranked[k][1])
        i = j
    return (rank_sum - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg))


def first_json(text: str) -> Any:
    """The first JSON object or array in free text (code fences allowed), else None."""
    dec = json.JSONDecoder()
    for m in re.finditer(r"[\[{]", text):
        try:
            return dec.raw_decode(text, m.start())[0]
        except ValueError:
            continue
    return None


class Tally:
    def __init__(self) -> None:
        self.tp = self.npred = self.ngold = 0

    def add(self, pred: Any, gold: Any) -> dict[str, bool]:
        tp, npred, ngold, right = score(pred, gold)
        self.tp += tp
        self.npred += npred
        self.ngold += ngold
        return right

    def f1(self) -> float:
        return prf(self.tp, self.npred, self.ngold)[2]

    def line(self, name: str) -> str:
        p, r, f = prf(self.tp, self.npred, self.ngold)
        return f"{name}: precision {p:.3f} recall {r:.3f} F1 {f:.3f} ({self.tp} right of {self.npred} predicted, " \
               f"{self.ngold} gold leaves)"


# -- the runs --------------------------------------------------------------------------------------

def load(path: Path, limit: int | None) -> list[dict[str, Any]]:
    rows = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            obj = json.loads(line)
            missing = {"schema", "text", "gold"} - set(obj)
            if missing:
                raise SystemExit(f"{path}:{n}: missing {sorted(missing)}")
            obj.setdefault("id", f"line-{n}")
            rows.append(obj)
            if limit is not None and len(rows) >= limit:
                break
    return rows


def run_unconstrained(backend: Any, prompts: list[str], max_tokens: int) -> list[str]:
    from structgen.contract.backend import GenerateRequest, SamplingParams

    reqs = [GenerateRequest(prompt=p, params=SamplingParams(max_new_tokens=max_tokens)) for p in prompts]
    out = []
    for res in backend.generate(reqs):
        out.append(res.text if hasattr(res, "text") else "")
    return out


def run_outlines(prompts: list[str], schemas: list[Any], max_tokens: int, model_dir: str, log: Path) -> tuple[
        list[str], float]:
    exe = OUTLINES_VENV / "bin" / "python"
    if not exe.is_file():
        raise RuntimeError(f"no venv at {OUTLINES_VENV}")
    with tempfile.TemporaryDirectory(prefix="structgen-quality-outlines-") as tmp:
        inp, out = Path(tmp) / "in.json", Path(tmp) / "out.json"
        inp.write_text(json.dumps({"prompts": prompts, "schemas": schemas, "max_tokens": max_tokens,
                                   "model_dir": model_dir}))
        env = {**os.environ, "OMP_NUM_THREADS": "2", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false"}
        env.pop("PYTHONPATH", None)
        with open(log, "w") as fh:
            proc = subprocess.run([str(exe), str(Path(__file__).resolve()), "--outlines-worker", str(inp), str(out)],
                                  stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=tmp, check=False)
        if proc.returncode != 0 or not out.is_file():
            tail = log.read_text(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(f"worker exited {proc.returncode}: " + " | ".join(tail))
        ans = json.loads(out.read_text())
    return ans["outputs"], ans["seconds"]


def _outlines_worker(inp: str, out: str) -> None:
    """Runs in the Outlines venv: one generation per prompt, each under its own schema."""
    import outlines
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(2)
    job = json.loads(Path(inp).read_text())
    hf = AutoModelForCausalLM.from_pretrained(job["model_dir"], dtype=torch.float32)
    model = outlines.from_transformers(hf, AutoTokenizer.from_pretrained(job["model_dir"]))
    outputs = []
    start = time.perf_counter()
    for prompt, schema in zip(job["prompts"], job["schemas"], strict=True):
        try:
            try:
                otype = outlines.types.JsonSchema(json.dumps(schema), whitespace_pattern="")
            except TypeError:
                otype = outlines.types.JsonSchema(json.dumps(schema))
            text = outlines.Generator(model, otype)(prompt, max_new_tokens=job["max_tokens"], do_sample=False)
            outputs.append(text if isinstance(text, str) else json.dumps(text))
        except Exception as exc:  # a schema Outlines cannot compile: no output for it
            print(f"outlines failed on a schema: {type(exc).__name__}: {exc}", flush=True)
            outputs.append("")
    Path(out).write_text(json.dumps({"outputs": outputs, "seconds": time.perf_counter() - start}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file", nargs="?", help="JSONL of schema/text/gold (default: the shared DeepJSONEval file)")
    ap.add_argument("--limit", type=int, default=None, help="first N records (default: all)")
    ap.add_argument("--outlines-limit", type=int, default=20, help="records given to Outlines (one at a time)")
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--skip", default="", help="comma-separated: unconstrained,outlines")
    ap.add_argument("--log", default=str(Path(tempfile.gettempdir()) / "structgen-quality-outlines.log"))
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    sys.path.insert(0, str(ROOT))
    if args.file is None:  # ../shared next to the repository (or next to its main checkout)
        from tests.shared_data import shared_dir

        args.file = str(shared_dir() / "extract" / "deepjsoneval.jsonl")
        if not os.path.isfile(args.file):
            ap.error(f"no DeepJSONEval data at {args.file}: give the JSONL file as FILE")

    import structgen
    from structgen.backends.embedded import EmbeddedBackend
    from structgen.extract import InputRecord, resolve_schema
    from structgen.extract.confidence import rank
    from structgen.extract.prompt import PromptBuilder

    rows = load(Path(args.file), args.limit)
    backend = EmbeddedBackend()
    prompts_b = PromptBuilder(backend)
    records = [InputRecord(str(r["id"]), r["text"], schema=r["schema"]) for r in rows]
    prompts = [prompts_b.render(prompts_b.turns(rec, resolve_schema(rec.schema))) for rec in records]
    print(f"{len(rows)} records from {args.file}; model {backend.model_path}", flush=True)

    start = time.perf_counter()
    results = list(structgen.extract(records, backend=backend, max_tokens=args.max_tokens, retries=1,
                                     confidence=True))
    sg_s = time.perf_counter() - start
    sg, completed, valid, truncated = Tally(), 0, 0, 0
    # rank keys: (not a repeated list value, grounded or n/a, mean log-probability)
    conf_right: list[tuple[bool, bool, float]] = []
    conf_wrong: list[tuple[bool, bool, float]] = []
    for row, res in zip(rows, results, strict=True):
        if res.ok:
            completed += 1
            valid += 1  # validated by structgen before it was returned
            right = sg.add(res.data_json(), row["gold"])
            for path, ok in right.items():
                c = (res.confidence or {}).get(path)
                if c is not None:
                    (conf_right if ok else conf_wrong).append(rank(c))
        else:
            sg.add(None, row["gold"])
            if res.error is not None and res.error.truncated:
                truncated += 1
            elif res.error is not None and res.error.type == "OutputValidationError":
                completed += 1  # a completed output that failed validation: reported, not returned
    print(f"structgen: {len(rows)} records in {sg_s:.1f}s; valid {valid}, cut short {truncated}, "
          f"other errors {len(rows) - valid - truncated}", flush=True)
    print(sg.line("structgen"), flush=True)
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    lp_right, lp_wrong = [c[2] for c in conf_right], [c[2] for c in conf_wrong]
    share = lambda cs, i: mean([float(not c[i]) for c in cs])  # noqa: E731
    print(f"mean leaf confidence: right {mean(lp_right):.3f} ({len(lp_right)}), "
          f"wrong {mean(lp_wrong):.3f} ({len(lp_wrong)}); repeated: right {share(conf_right, 0):.3f}, "
          f"wrong {share(conf_wrong, 0):.3f}; ungrounded: right {share(conf_right, 1):.3f}, "
          f"wrong {share(conf_wrong, 1):.3f}; AUC of the log-probability alone {auc(lp_right, lp_wrong):.3f}, "
          f"without the repetition mark {auc([c[1:] for c in conf_right], [c[1:] for c in conf_wrong]):.3f}",
          flush=True)

    f1_unc = float("nan")
    if "unconstrained" not in skip:
        unc = Tally()
        for row, text in zip(rows, run_unconstrained(backend, prompts, args.max_tokens), strict=True):
            unc.add(first_json(text), row["gold"])
        print(unc.line("unconstrained"), flush=True)
        f1_unc = unc.f1()

    f1_out = float("nan")
    if "outlines" not in skip:
        n = min(args.outlines_limit, len(rows))
        try:
            outs, secs = run_outlines(prompts[:n], [r["schema"] for r in rows[:n]], args.max_tokens,
                                      str(backend.model_path), Path(args.log))
            ol, sg_sub = Tally(), Tally()
            for row, text, res in zip(rows[:n], outs, results[:n], strict=True):
                ol.add(first_json(text), row["gold"])
                sg_sub.add(res.data_json() if res.ok else None, row["gold"])
            print(ol.line(f"outlines (first {n}, {secs:.0f}s)"), flush=True)
            print(sg_sub.line(f"structgen on the same {n}"), flush=True)
            f1_out = ol.f1()
        except Exception as exc:
            print(f"outlines: could not run: {exc}", flush=True)

    with open("/proc/loadavg") as fh:
        print(f"loadavg {fh.read().strip()}")
    fmt = lambda x: "nan" if math.isnan(x) else f"{x:.3f}"  # noqa: E731
    valid_rate = valid / completed if completed else float("nan")
    print(f"RESULT leaf_f1={sg.f1():.3f} leaf_f1_unconstrained={fmt(f1_unc)} leaf_f1_outlines={fmt(f1_out)} "
          f"valid_rate={fmt(valid_rate)} confidence_auc={fmt(auc(conf_right, conf_wrong))}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--outlines-worker":
        _outlines_worker(sys.argv[2], sys.argv[3])
    else:
        main()
