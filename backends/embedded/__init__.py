"""The embedded backend: a real small model in-process, on CPU (or CUDA when present)."""

from __future__ import annotations

from typing import Any

__all__ = ["EmbeddedBackend"]


def __getattr__(name: str) -> Any:  # keep torch out of `import structgen.backends.embedded`
    if name == "EmbeddedBackend":
        try:
            from structgen.backends.embedded.adapter import EmbeddedBackend
        except ImportError as exc:  # torch / transformers: the `embedded` extra
            from structgen.extras import missing_dependency

            raise missing_dependency(exc, "the embedded backend") from exc

        return EmbeddedBackend
    raise AttributeError(name)
