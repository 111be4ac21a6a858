"""The records of a batch extraction: what goes in, what comes out.

One :class:`InputRecord` per document in; exactly one :class:`ExtractResult` per input
record out, carrying either the validated ``data`` or a :class:`RecordError` (type,
message, raw text, JSON path), and its :class:`Usage`. :meth:`ExtractResult.to_json` is
the output line; :meth:`ExtractResult.from_json` reads one back (the progress journal
stores results that way, so a resumed job writes exactly what the first run would have).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["ExtractResult", "InputRecord", "RecordError", "Usage"]


@dataclass(frozen=True)
class InputRecord:
    """One document to extract from.

    ``text`` is the document; ``messages`` (OpenAI batch input) replaces the whole prompt
    when given. ``schema`` is a per-record schema (a name, a path, or a JSON schema dict)
    overriding the job's. ``error`` marks a record that could not be read: it is reported
    as a failed result, never dropped. ``extra`` keeps fields an output format echoes back.
    """

    id: str
    text: str = ""
    messages: tuple[tuple[str, str], ...] = ()
    schema: Any = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass
class Usage:
    """Token and time accounting for one record (all attempts together).

    ``cached_tokens``: prompt tokens reused from the prefix cache. ``forced_tokens``:
    output tokens the constraint forced (appended without sampling).
    """

    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    forced_tokens: int = 0
    ms: float = 0.0
    attempts: int = 0

    def add_meta(self, meta: dict[str, Any]) -> None:
        """Add one generation's counters, as backends report them in ``result.meta``."""
        raw = meta.get("usage")
        usage: dict[str, Any] = raw if isinstance(raw, dict) else {}
        self.prompt_tokens += int(meta.get("prompt_tokens") or usage.get("prompt_tokens") or 0)
        cached = meta.get("cached_tokens")
        if cached is None:
            details = usage.get("prompt_tokens_details") or {}
            cached = details.get("cached_tokens") if isinstance(details, dict) else 0
        self.cached_tokens += int(cached or 0)
        self.generated_tokens += int(meta.get("completion_tokens") or usage.get("completion_tokens") or 0)
        self.forced_tokens += int(meta.get("forced_tokens") or 0)
        self.attempts += 1

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["ms"] = round(self.ms, 1)
        return out


@dataclass(frozen=True)
class RecordError:
    """Why a record has no data. ``type`` is the error class name (``OutputValidationError``,
    ``BackendError``, ``InputError``...); ``raw`` the model's text, if any; ``path`` the JSON
    path of the first failing value, if known; ``errors`` every validator message."""

    type: str
    message: str
    raw: str | None = None
    path: str | None = None
    errors: tuple[str, ...] = ()
    truncated: bool = False

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "message": self.message, "raw": self.raw, "path": self.path}
        if self.errors:
            out["errors"] = list(self.errors)
        if self.truncated:
            out["truncated"] = True
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RecordError:
        return cls(type=d["type"], message=d["message"], raw=d.get("raw"), path=d.get("path"),
                   errors=tuple(d.get("errors") or ()), truncated=bool(d.get("truncated")))


@dataclass
class ExtractResult:
    """The result for one input record: ``data`` (validated; a pydantic model instance when
    the schema is a model) or ``error``; ``usage``; ``confidence`` per leaf JSON path
    (``{"$.total": {"mean": -0.1, "min": -0.4}}``) when asked for."""

    id: str
    data: Any = None
    error: RecordError | None = None
    usage: Usage = field(default_factory=Usage)
    confidence: dict[str, dict[str, Any]] | None = None
    #: the input's extra fields (e.g. an OpenAI batch request's body), for output formats
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def ok(self) -> bool:
        return self.error is None

    def data_json(self) -> Any:
        """``data`` as plain JSON values (a pydantic model dumped in JSON mode)."""
        dump = getattr(self.data, "model_dump", None)
        return dump(mode="json") if callable(dump) else self.data

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id}
        if self.error is None:
            out["data"] = self.data_json()
        else:
            out["error"] = self.error.to_dict()
        if self.confidence is not None:
            out["confidence"] = self.confidence
        out["usage"] = self.usage.to_dict()
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict[str, Any], model: Any = None) -> ExtractResult:
        err = d.get("error")
        data = d.get("data")
        if err is None and model is not None and data is not None:
            data = model.model_validate(data)
        u = d.get("usage") or {}
        usage = Usage(**{k: u[k] for k in ("prompt_tokens", "cached_tokens", "generated_tokens",
                                           "forced_tokens", "ms", "attempts") if k in u})
        return cls(id=d["id"], data=data, error=RecordError.from_dict(err) if err else None,
                   usage=usage, confidence=d.get("confidence"))
