"""The embedded backend: a real small model in-process, on CPU (or CUDA when present)."""

from __future__ import annotations

from typing import Any

__all__ = ["EmbeddedBackend"]


def __getattr__(name: str) -> Any:  # keep torch out of `import structgen.backends.embedded`
    if name == "EmbeddedBackend":
        from structgen.backends.embedded.adapter import EmbeddedBackend

        return EmbeddedBackend
    raise AttributeError(name)
