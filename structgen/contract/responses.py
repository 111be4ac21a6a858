"""Reading engine responses: required fields, generated text, finish reasons.

An engine server that breaks its protocol (a missing field, ``"text": 123``, ``null`` or a
list where text belongs) is a backend failure: these helpers raise
:class:`~structgen.errors.BackendError` naming the field and quoting the body, so the
error never surfaces later as a crash blamed on the user's program.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from structgen.errors import BackendError

__all__ = ["describe", "finish_reason", "require", "text_field"]


def finish_reason(value: Any) -> str:
    """Normalize an engine's finish reason to "stop" or "length"."""
    if isinstance(value, Mapping):
        value = value.get("type")
    return "length" if value in ("length", "max_tokens") else "stop"


def _excerpt(body: Any, limit: int = 300) -> str:
    try:
        text = json.dumps(body, ensure_ascii=False, default=repr)
    except (TypeError, ValueError):
        text = repr(body)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe(value: Any) -> str:
    """``null``, or the type and a short excerpt of ``value``, for error messages."""
    if value is None:
        return "null"
    shown = _excerpt(value, 60)
    return f"{type(value).__name__} {shown}"


def require(body: Any, *keys: Any, backend: str) -> Any:
    """``body[k1][k2]...`` or a BackendError naming the missing field."""
    cur = body
    for k in keys:
        try:
            cur = cur[k]
        except (KeyError, IndexError, TypeError) as exc:
            path = "".join(f"[{k!r}]" for k in keys)
            raise BackendError(f"unexpected response: missing {path} in {_excerpt(body, 200)}",
                               backend=backend) from exc
    return cur


def text_field(value: Any, *, field: str, body: Any, backend: str, allow_null: bool = False) -> str:
    """``value`` -- the generated text a server sent at ``field`` -- if it is a string
    (``None`` counts as ``""`` when ``allow_null``); otherwise a BackendError naming the
    field and quoting the body: a server that breaks its protocol is a backend failure."""
    if isinstance(value, str):
        return value
    if value is None and allow_null:
        return ""
    raise BackendError(f"unexpected response: {field} is {describe(value)}, not a string "
                       f"(response: {_excerpt(body)})", backend=backend)

