"""Start llama-cpp-python's server (its own venv) on 127.0.0.1 with a GGUF model."""

from __future__ import annotations

import os
from pathlib import Path

from tests.servers.process import ServerProcess, free_port

VENV = Path(os.environ.get("STRUCTGEN_LLAMACPP_VENV", "/work/venvs/llamacpp"))


def python() -> Path | None:
    exe = VENV / "bin" / "python"
    if not exe.is_file() or not list(VENV.glob("lib/python*/site-packages/llama_cpp/server")):
        return None
    return exe


def start(gguf: str, log_dir: Path, *, alias: str = "smollm2", n_ctx: int = 2048) -> ServerProcess:
    exe = python()
    if exe is None:
        raise RuntimeError(f"llama-cpp-python[server] is not installed in {VENV}")
    port = free_port()
    argv = [str(exe), "-m", "llama_cpp.server", "--model", gguf, "--host", "127.0.0.1", "--port", str(port),
            "--n_ctx", str(n_ctx), "--model_alias", alias, "--n_threads", "2"]
    return ServerProcess(argv, port=port, ready_path="/v1/models", log_path=log_dir / f"llamacpp-{port}.log",
                         startup_timeout=180).start()
