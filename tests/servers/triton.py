"""Start a real tritonserver (PyTriton 0.7.0's bundled 2.51) serving structgen's embedded model."""

from __future__ import annotations

import os
import site
import sysconfig
from pathlib import Path

from tests.servers import engines
from tests.servers.process import ServerProcess, free_port

VENV = engines.venv("triton")
SCRIPT = Path(__file__).with_name("triton_embedded.py")


def python() -> Path | None:
    return engines.python("triton")


def start(log_dir: Path, *, model: str | None = None, name: str = "structgen") -> ServerProcess:
    exe = python()
    if exe is None:
        raise RuntimeError(f"nvidia-pytriton is not installed in {VENV}")
    port = free_port()
    argv = [str(exe), str(SCRIPT), "--site", site.getsitepackages()[0], "--port", str(port), "--name", name]
    if model:
        argv += ["--model", model]
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    env = {"LD_LIBRARY_PATH": f"{libdir}:{os.environ.get('LD_LIBRARY_PATH', '')}", "OMP_NUM_THREADS": "2",
           "TOKENIZERS_PARALLELISM": "false"}
    return ServerProcess(argv, port=port, ready_path=f"/v2/models/{name}/ready",
                         log_path=log_dir / f"triton-{port}.log", env=env, startup_timeout=240).start()
