"""Start llama-cpp-python's server (its own venv) on 127.0.0.1 with a GGUF model."""

from __future__ import annotations

from pathlib import Path

from tests.servers import engines
from tests.servers.process import ServerProcess, free_port

VENV = engines.venv("llamacpp")


def python() -> Path | None:
    return engines.python("llamacpp")


def start(gguf: str, log_dir: Path, *, alias: str = "smollm2", n_ctx: int = 2048) -> ServerProcess:
    exe = python()
    if exe is None:
        raise RuntimeError(f"llama-cpp-python[server] is not installed in {VENV}")
    port = free_port()
    argv = [str(exe), "-m", "llama_cpp.server", "--model", gguf, "--host", "127.0.0.1", "--port", str(port),
            "--n_ctx", str(n_ctx), "--model_alias", alias, "--n_threads", "2"]
    return ServerProcess(argv, port=port, ready_path="/v1/models", log_path=log_dir / f"llamacpp-{port}.log",
                         startup_timeout=180).start()
