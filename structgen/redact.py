"""Redaction of secrets from error messages and log lines.

:func:`redact` replaces, in any text structgen is about to show: every API key a backend
was configured with (:func:`register_secret`, called by the HTTP config), and anything
that looks like a credential whatever its source -- ``Bearer``/``Basic`` tokens,
``Authorization: ...`` values, ``api_key=...``-style pairs, ``sk-...`` and ``hf_...`` keys,
``user:password@`` in URLs. Every :class:`~structgen.errors.StructgenError` message goes
through it, and :class:`RedactingFilter` does the same for log records.
"""

from __future__ import annotations

import logging
import re
import threading
from urllib.parse import quote

__all__ = ["MASK", "RedactingFilter", "redact", "register_secret"]

MASK = "[REDACTED]"

_lock = threading.Lock()
_secrets: set[str] = set()
#: shorter values are too likely to occur in ordinary text to be replaced everywhere
_MIN_SECRET_LEN = 4

_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    # Authorization: <scheme> <value>, header-like or JSON-like ("authorization": "...")
    (re.compile(r"""(?i)(\b(?:proxy-)?authorization["']?\s*[:=]\s*["']?)(?:(?:bearer|basic|token|digest)\s+)?"""
                r"""[^\s"',;}]+"""), rf"\1{MASK}"),
    # a bare scheme + token anywhere else
    (re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]{4,}"), rf"\1{MASK}"),
    (re.compile(r"\b(Basic\s+)[A-Za-z0-9+/]{8,}={0,2}"), rf"\1{MASK}"),
    # key = value pairs: query strings, headers, JSON, form bodies
    (re.compile(r"""(?i)(\b(?:x-)?(?:api[_-]?key|access[_-]?token|auth[_-]?token|refresh[_-]?token|"""
                r"""client[_-]?secret|secret[_-]?key|password|passwd)["']?\s*[:=]\s*["']?)"""
                r"""[A-Za-z0-9][^\s"'&,;}]*"""), rf"\1{MASK}"),
    # well-known key shapes
    (re.compile(r"\bsk-[A-Za-z0-9_-]{8,}"), MASK),
    (re.compile(r"\bhf_[A-Za-z0-9]{16,}"), MASK),
    # credentials in a URL
    (re.compile(r"(?<=://)[^/@\s:]+:[^/@\s]+@"), f"{MASK}@"),
]


def register_secret(value: str | None) -> None:
    """Remember ``value`` (an API key, a token) so :func:`redact` removes it everywhere."""
    if value and len(value) >= _MIN_SECRET_LEN:
        with _lock:
            _secrets.add(value)
            quoted = quote(value, safe="")
            if quoted != value:
                _secrets.add(quoted)


def redact(text: str) -> str:
    """``text`` with every registered secret and credential-looking value masked."""
    if not text:
        return text
    with _lock:
        secrets = sorted(_secrets, key=len, reverse=True)
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    for pattern, repl in _PATTERNS:
        text = pattern.sub(repl, text)
    return text


class RedactingFilter(logging.Filter):
    """A logging filter that redacts the formatted message of every record it sees."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: leave it to the handler to report
            return True
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, ()
        return True
