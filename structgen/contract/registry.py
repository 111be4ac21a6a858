"""Finding backends: entry points, names, and the one default.

Backends register in the ``structgen.backends`` entry-point group, so a third-party
package adds one without touching structgen. The default backend (the one a run that
names none uses) is created lazily on first use: the embedded model.
"""

from __future__ import annotations

import threading
from importlib.metadata import entry_points
from typing import Any

from structgen.contract.backend import Backend
from structgen.errors import BackendError
from structgen.extras import missing_dependency

__all__ = ["available_backends", "get_backend", "get_default_backend", "set_default_backend"]

_GROUP = "structgen.backends"
_default: Backend | None = None
_default_lock = threading.Lock()


def available_backends() -> list[str]:
    return sorted(ep.name for ep in entry_points(group=_GROUP))


def get_backend(name: str, **kwargs: Any) -> Backend:
    """Instantiate the backend registered as ``name`` (e.g. ``"embedded"``, ``"vllm"``)."""
    eps = [ep for ep in entry_points(group=_GROUP) if ep.name == name]
    if not eps:
        raise BackendError(f"no backend named {name!r}; installed: {available_backends()}")
    try:
        cls = eps[0].load()
    except ImportError as exc:  # an optional dependency: the message names the pip install that fixes it
        raise BackendError(str(missing_dependency(exc, f"backend {name!r}")), backend=name) from exc
    backend = cls(**kwargs)
    if not isinstance(backend, Backend):
        raise BackendError(f"the entry point {name!r} made {type(backend).__name__}, not a Backend", backend=name)
    return backend


def resolve(backend: Backend | str | None) -> Backend:
    """An explicit backend, a registered name, or the default."""
    if backend is None:
        return get_default_backend()
    if isinstance(backend, str):
        return get_backend(backend)
    if not isinstance(backend, Backend):
        raise BackendError(f"not a structgen backend: {backend!r}")
    return backend


def set_default_backend(backend: Backend | str | None) -> None:
    """Set the backend used by runs that name none (``None`` resets to the embedded one)."""
    global _default
    with _default_lock:
        _default = None if backend is None else resolve(backend)


def get_default_backend() -> Backend:
    global _default
    with _default_lock:
        if _default is None:
            _default = get_backend("embedded")
        return _default
