"""The embedded backend: a real small model in-process, on CPU (or CUDA when present)."""

from __future__ import annotations

from typing import Any

__all__ = ["EmbeddedBackend", "EngineConfig"]


def __getattr__(name: str) -> Any:  # keep torch out of `import structgen.backends.embedded`
    if name in __all__:
        try:
            from structgen.backends.embedded import adapter, engine
        except ImportError as exc:  # torch / transformers: the `embedded` extra
            from structgen.extras import missing_dependency

            raise missing_dependency(exc, "the embedded backend") from exc

        return adapter.EmbeddedBackend if name == "EmbeddedBackend" else engine.EngineConfig
    raise AttributeError(name)
