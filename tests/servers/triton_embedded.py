"""A real tritonserver (PyTriton's bundled 2.51) serving structgen's embedded model.

Run with the PyTriton venv's python (``$STRUCTGEN_ENGINES/triton``, see tests/servers/engines.py); structgen, torch and
transformers come from structgen's own venv, added as a site directory (``--site``).
The model speaks the TensorRT-LLM ensemble's generate-endpoint names: ``text_input``,
``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``random_seed``, ``stop_words``,
``guided_decoding_guide_type`` / ``guided_decoding_guide``; it answers ``text_output``
and ``finish_reason``.

    python triton_embedded.py --site .venv/lib/python3.11/site-packages --port 8000 [--model DIR]
"""

from __future__ import annotations

import argparse
import os
import site
import sys
import sysconfig


def main() -> None:
    # This script lives next to tests/servers/triton.py, which would shadow the `triton`
    # package torch probes for ("module 'triton' has no attribute 'language'").
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    ap = argparse.ArgumentParser()
    ap.add_argument("--site", required=True, help="structgen venv's site-packages")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--model", default=None, help="model dir for the embedded backend (default SmolLM2)")
    ap.add_argument("--name", default="structgen")
    args = ap.parse_args()
    site.addsitedir(args.site)  # processes .pth files: structgen's editable install
    libdir = sysconfig.get_config_var("LIBDIR")
    if libdir and libdir not in os.environ.get("LD_LIBRARY_PATH", ""):
        # tritonserver needs libpython from this interpreter's lib directory
        os.environ["LD_LIBRARY_PATH"] = f"{libdir}:{os.environ.get('LD_LIBRARY_PATH', '')}"
        os.execv(sys.executable, [sys.executable, *sys.argv])

    import numpy as np
    from pytriton.model_config import ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    from structgen.backends.embedded import EmbeddedBackend
    from structgen.constraints.spec import RegexSpec, json_schema_spec
    from structgen.contract.backend import GenerateRequest, GenerateResult, SamplingParams

    backend = EmbeddedBackend(args.model) if args.model else EmbeddedBackend()

    def scalar(req, name, default=None):
        if name not in req:
            return default
        value = np.asarray(req[name]).reshape(-1)
        if value.size == 0:
            return default
        v = value[0]
        return v.decode() if isinstance(v, bytes) else v.item() if hasattr(v, "item") else v

    def infer(requests):
        gens = []
        for req in requests:
            kind = scalar(req, "guided_decoding_guide_type")
            guide = scalar(req, "guided_decoding_guide")
            constraint = None
            if kind in ("json_schema", "json"):
                constraint = json_schema_spec(guide or "{}")
            elif kind == "regex":
                constraint = RegexSpec(guide)
            elif kind:
                raise ValueError(f"unsupported guided_decoding_guide_type {kind!r}")
            stops = ()
            if "stop_words" in req:
                stops = tuple(s.decode() if isinstance(s, bytes) else str(s)
                              for s in np.asarray(req["stop_words"]).reshape(-1) if s)
            top_k = scalar(req, "top_k")
            params = SamplingParams(max_new_tokens=int(scalar(req, "max_tokens", 64)),
                                    temperature=float(scalar(req, "temperature", 0.0)),
                                    top_p=scalar(req, "top_p"), top_k=int(top_k) if top_k else None,
                                    seed=scalar(req, "random_seed"), stop=stops)
            gens.append(GenerateRequest(prompt=scalar(req, "text_input"), params=params, constraint=constraint))
        results = backend.generate(gens)
        out = []
        for r in results:
            if not isinstance(r, GenerateResult):
                raise RuntimeError(str(r))
            out.append({"text_output": np.array([r.text.encode()], dtype=object),
                        "finish_reason": np.array([r.finish_reason.encode()], dtype=object)})
        return out

    opt = {"optional": True}
    inputs = [Tensor(name="text_input", dtype=bytes, shape=(1,)),
              Tensor(name="max_tokens", dtype=np.int32, shape=(1,), **opt),
              Tensor(name="temperature", dtype=np.float32, shape=(1,), **opt),
              Tensor(name="top_p", dtype=np.float32, shape=(1,), **opt),
              Tensor(name="top_k", dtype=np.int32, shape=(1,), **opt),
              Tensor(name="random_seed", dtype=np.int64, shape=(1,), **opt),
              Tensor(name="stop_words", dtype=bytes, shape=(-1,), **opt),
              Tensor(name="guided_decoding_guide_type", dtype=bytes, shape=(1,), **opt),
              Tensor(name="guided_decoding_guide", dtype=bytes, shape=(1,), **opt)]
    outputs = [Tensor(name="text_output", dtype=bytes, shape=(1,)),
               Tensor(name="finish_reason", dtype=bytes, shape=(1,))]
    config = TritonConfig(http_address="127.0.0.1", http_port=args.port, allow_grpc=False,
                          allow_metrics=False, exit_on_error=True)
    with Triton(config=config) as triton:
        triton.bind(model_name=args.name, infer_func=infer, inputs=inputs, outputs=outputs,
                    config=ModelConfig(batching=False), strict=False)
        triton.serve()


if __name__ == "__main__":
    main()
