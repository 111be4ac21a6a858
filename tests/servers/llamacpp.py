"""Start llama.cpp's own server (``llama-server``) on 127.0.0.1 with a GGUF model.

The server is Debian's build, unpacked into the llamacpp engine folder by
``tests/servers/install_engines.sh llamacpp`` (``backends/llamacpp/install_server.py``).
"""

from __future__ import annotations

from pathlib import Path

from tests.servers import engines
from tests.servers.process import ServerProcess, free_port


def start(gguf: str, log_dir: Path, *, alias: str = "smollm2", n_ctx: int = 2048,
          parallel: int = 4) -> ServerProcess:
    """``parallel`` slots, each with ``n_ctx`` tokens of context (a unified KV cache of
    ``parallel * n_ctx``); two threads, as the machine has."""
    exe = engines.llama_server()
    if exe is None:
        raise RuntimeError(engines.skip_reason("llamacpp"))
    port = free_port()
    argv = [str(exe), "--model", gguf, "--host", "127.0.0.1", "--port", str(port), "--alias", alias,
            "--ctx-size", str(n_ctx * parallel), "--parallel", str(parallel), "--threads", "2",
            "--no-webui"]
    return ServerProcess(argv, port=port, ready_path="/v1/models", log_path=log_dir / f"llamacpp-{port}.log",
                         startup_timeout=180).start()
