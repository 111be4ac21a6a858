"""HTTP client settings: the backend's server, timeouts, the request deadline, retries.

:class:`HttpConfig` is one backend's settings (validated when made; an API key given here
is registered for redaction); :class:`RetryPolicy` says how often and how long to back off;
:class:`Deadline` is one request's time budget, shared by every HTTP call of the request.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import httpx

from structgen.errors import BackendError
from structgen.redact import register_secret

__all__ = ["DEFAULT_DEADLINE", "DEFAULT_MAX_RESPONSE_BYTES", "Deadline", "HttpConfig", "RetryPolicy"]

#: seconds one request may take in all (connect, reads, retries, waits), unless overridden
DEFAULT_DEADLINE = 300.0
#: the largest response body read (bytes, after content decoding)
DEFAULT_MAX_RESPONSE_BYTES = 32 << 20
_SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "x-api-key", "api-key", "cookie"})


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries with exponential backoff for retryable failures only."""

    max_retries: int = 3
    backoff_base: float = 0.2
    backoff_max: float = 5.0
    retry_after_max: float = 10.0

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        if self.backoff_base < 0 or self.backoff_max < 0:
            raise ValueError("backoff times must be >= 0")

    def delay(self, attempt: int, error: BackendError) -> float:
        """Seconds to wait before retry number ``attempt`` (1-based)."""
        retry_after = getattr(error, "retry_after", None)
        if retry_after is not None:
            return min(float(retry_after), self.retry_after_max)
        base = min(self.backoff_base * 2.0 ** (attempt - 1), self.backoff_max)
        return float(base * (0.5 + random.random() / 2))


def _check_seconds(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number of seconds, not {value!r}")


@dataclass(frozen=True)
class Deadline:
    """A request's time budget: ``seconds`` counted from ``start`` (``time.monotonic()``).

    One is made per request; a request made of several HTTP calls (a backend's flow)
    passes the same one to each, so the calls share the budget.
    """

    seconds: float
    start: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        _check_seconds("deadline", self.seconds)

    def remaining(self) -> float:
        return self.start + self.seconds - time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start


@dataclass(frozen=True)
class HttpConfig:
    base_url: str
    api_key: str | None = field(default=None, repr=False)
    #: seconds to wait for a connection, and for any one read (a stall: retried)
    connect_timeout: float = 5.0
    read_timeout: float = 120.0
    #: seconds for a whole request: connect + reads + retries + waits (DeadlineExceededError)
    deadline: float = DEFAULT_DEADLINE
    #: the largest response body accepted, in bytes (ResponseTooLargeError)
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    max_connections: int = 64
    retry: RetryPolicy = RetryPolicy()
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, not {self.base_url!r}")
        if self.connect_timeout <= 0 or self.read_timeout <= 0:
            raise ValueError("timeouts must be positive")
        _check_seconds("deadline", self.deadline)
        if not isinstance(self.max_response_bytes, int) or self.max_response_bytes < 1:
            raise ValueError(f"max_response_bytes must be a positive int, not {self.max_response_bytes!r}")
        if self.max_connections < 1:
            raise ValueError("max_connections must be >= 1")
        register_secret(self.api_key)
        for name, value in self.headers.items():
            if name.lower() in _SECRET_HEADERS:
                register_secret(value)
                register_secret(value.partition(" ")[2])  # "Bearer <token>": the token alone too

    def timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self.read_timeout, connect=self.connect_timeout, pool=self.read_timeout)

    def all_headers(self) -> dict[str, str]:
        out = {"Accept": "application/json", **self.headers}
        if self.api_key:
            out["Authorization"] = f"Bearer {self.api_key}"
        return out

    def url(self, path: str) -> str:
        return self.base_url.rstrip("/") + (path if path.startswith("/") else "/" + path)
