"""P4: jump-forward decoding over JSON schemas with many fixed keys (MaskBench Glaiveai2K).

    python bench/jump_forward.py [--schemas 8] [--max-tokens 96] [--task extract|fill]
                                 [--dir ../shared/maskbench]

Workload (``--task extract``, the default): JSON extraction. For each Glaive function
schema (>= 3 required keys, compiled exactly), a short note lists the values of one of
the file's valid test instances as ``key: value`` lines, and the model extracts the
object for the schema from it. ``--task fill`` instead asks for "a realistic JSON object
for this schema" (no source text: the 135M model then writes long free-text values, so
fixed keys are a small share of the tokens).

Each object is generated greedily on the embedded engine with jump-forward on and off
(interleaved, one sequence at a time so forward passes count one sequence's work).
Prints forward passes, tokens (forced by the constraint; drafted and accepted) and wall
time per mode, and whether outputs are identical. Last line:

    RESULT forward_ratio=<on/off passes> wall_speedup=<off/on time> identical=<true|false>
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from structgen.constraints.spec import json_schema_spec
from structgen.contract.backend import GenerateRequest, SamplingParams
from tests.shared_data import shared_dir


def pick_schemas(directory: Path, n: int, backend) -> list[tuple[dict, object]]:
    """Glaive object schemas with at least 3 required properties that compile exactly,
    each with its first valid test instance."""
    out = []
    for path in sorted(directory.glob("Glaiveai2K---*.json")):
        data = json.loads(path.read_text())
        schema = data["schema"]
        props = schema.get("properties") if isinstance(schema, dict) else None
        if not props or len(schema.get("required", [])) < 3 or len(json.dumps(schema)) > 3000:
            continue
        valid = [t["data"] for t in data.get("tests", []) if t.get("valid") and isinstance(t.get("data"), dict)]
        if not valid:
            continue
        try:
            if not backend.compile(json_schema_spec(schema)).exact:
                continue
        except Exception:
            continue
        out.append((schema, valid[0]))
        if len(out) == n:
            break
    return out


def note_lines(value: object, path: str = "") -> list[str]:
    """``key: value`` lines for an instance's leaves (nested keys joined by spaces)."""
    if isinstance(value, dict):
        return [line for k, v in value.items()
                for line in note_lines(v, f"{path} {k}".strip().replace("_", " "))]
    def text(v: object) -> str:
        return v if isinstance(v, str) else json.dumps(v)

    if isinstance(value, list):
        return [f"{path}: {', '.join(text(v) for v in value)}"]
    return [f"{path}: {text(value)}"]


def prompt_for(task: str, schema: dict, instance: object) -> str:
    if task == "fill":
        return "Fill in a realistic JSON object for this schema:\n" + json.dumps(schema)
    return ("Extract the JSON object for this schema from the note.\nSchema: " + json.dumps(schema)
            + "\nNote:\n" + "\n".join(note_lines(instance)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--schemas", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--task", choices=("extract", "fill"), default="extract")
    ap.add_argument("--dir", default=str(shared_dir() / "maskbench"))
    args = ap.parse_args()
    from structgen.backends.embedded import EmbeddedBackend
    from structgen.backends.embedded.engine import Engine, EngineConfig

    be = EmbeddedBackend()  # loads the model; the engines below share its weights
    schemas = pick_schemas(Path(args.dir), args.schemas, be)
    if not schemas:
        raise SystemExit(f"no usable Glaiveai2K schemas under {args.dir}")
    tpl = be.chat_template()
    reqs = []
    for schema, instance in schemas:
        prompt = tpl.render([{"role": "user", "content": prompt_for(args.task, schema, instance)}]) \
            + tpl.role("assistant", [{"role": "user", "content": "x"}]).prefix
        reqs.append(GenerateRequest(prompt, SamplingParams(max_new_tokens=args.max_tokens), json_schema_spec(schema)))
    model = be.hf_model
    engines = {"on": Engine(model, EngineConfig(jump_forward=True)),
               "off": Engine(model, EngineConfig(jump_forward=False))}
    totals = {k: {"passes": 0, "time": 0.0, "forced": 0, "tokens": 0, "drafted": 0, "accepted": 0}
              for k in engines}
    outputs: dict[str, list[str]] = {"on": [], "off": []}
    prefill_time = 0.0  # the same prompts, one token each: what both modes spend before decoding
    for i, req in enumerate(reqs):
        engines["off"].clear_cache()
        first = GenerateRequest(req.prompt, SamplingParams(max_new_tokens=1), req.constraint)
        start = time.perf_counter()
        engines["off"].generate([be._sequence(0, first, None)])
        prefill_time += time.perf_counter() - start
        order = ["on", "off"] if i % 2 == 0 else ["off", "on"]
        for mode in order:
            engine = engines[mode]
            engine.clear_cache()
            seq = be._sequence(0, req, None)
            before = engine.stats()
            start = time.perf_counter()
            [(err, _)] = engine.generate([seq])
            elapsed = time.perf_counter() - start
            if err is not None:
                raise SystemExit(f"schema {i}: {err}")
            after = engine.stats()
            t = totals[mode]
            t["passes"] += after["forward_passes"] - before["forward_passes"]
            t["forced"] += after["forced_tokens"] - before["forced_tokens"]
            t["tokens"] += after["generated_tokens"] - before["generated_tokens"]
            t["drafted"] += after["draft_tokens"] - before["draft_tokens"]
            t["accepted"] += after["draft_accepted"] - before["draft_accepted"]
            t["time"] += elapsed
            outputs[mode].append(seq.text)
    for engine in engines.values():
        engine.close()
    for mode, t in totals.items():
        print(f"jump-forward {mode}: {t['passes']} forward passes, {t['tokens']} tokens "
              f"({t['forced']} forced, {t['accepted']} of {t['drafted']} drafted accepted), "
              f"{t['time']:.2f} s", flush=True)
    identical = outputs["on"] == outputs["off"]
    ratio = totals["on"]["passes"] / totals["off"]["passes"]
    speedup = totals["off"]["time"] / totals["on"]["time"]
    decode = (totals["off"]["time"] - prefill_time) / max(totals["on"]["time"] - prefill_time, 1e-9)
    print(f"prefill (first token) {prefill_time:.2f} s of each mode's time; decode-only speedup {decode:.2f}",
          flush=True)
    print(f"{len(reqs)} schemas, task {args.task}; sample output: {outputs['on'][0][:120]}", flush=True)
    print(f"RESULT forward_ratio={ratio:.3f} wall_speedup={speedup:.2f} identical={str(identical).lower()}",
          flush=True)


if __name__ == "__main__":
    main()
