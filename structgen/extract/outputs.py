"""Writing results as they come: JSONL (or stdout), Parquet, OpenAI batch output JSONL.

A writer takes one output line at a time (the record's JSON, as the journal stores it)
and writes it at once (Parquet: in row groups of a bounded size), so memory stays flat
whatever the job's size. :func:`open_writer` picks the format from ``output_format`` or
the file's suffix.

OpenAI batch output follows the Batch API's result lines (``id``, ``custom_id``,
``response`` with a chat-completion ``body`` whose message content is the JSON, or
``error``), so results go back to tools that read ``vllm run-batch`` or hosted batch output.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Protocol, TextIO

from structgen.errors import InputError

__all__ = ["Writer", "open_writer", "openai_batch_line"]

FORMATS = ("jsonl", "parquet", "openai-batch")


class Writer(Protocol):
    def write(self, line: str, extra: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


class JsonlWriter:
    def __init__(self, path: str | Path, *, openai: bool = False):
        self.openai = openai
        self._own = str(path) != "-"
        self._fh: TextIO = open(path, "w", encoding="utf-8") if self._own else sys.stdout  # noqa: SIM115

    def write(self, line: str, extra: dict[str, Any]) -> None:
        if self.openai:
            line = openai_batch_line(json.loads(line), extra)
        self._fh.write(line + "\n")
        self._fh.flush()

    def close(self) -> None:
        if self._own:
            self._fh.close()


class ParquetWriter:
    """Columns: id, data (JSON text), error_type, error_message, error_raw, error_path,
    confidence (JSON text), and the usage counters."""

    ROWS = 1024

    def __init__(self, path: str | Path):
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise InputError("writing Parquet needs pyarrow: pip install 'structgen-lm[extract]'",
                             source=str(path)) from exc
        self._pa = pa
        self.schema = pa.schema([
            ("id", pa.string()), ("data", pa.string()), ("error_type", pa.string()),
            ("error_message", pa.string()), ("error_raw", pa.string()), ("error_path", pa.string()),
            ("confidence", pa.string()), ("prompt_tokens", pa.int64()), ("cached_tokens", pa.int64()),
            ("generated_tokens", pa.int64()), ("forced_tokens", pa.int64()), ("ms", pa.float64()),
            ("attempts", pa.int64())])
        self._writer = pq.ParquetWriter(str(path), self.schema)
        self._rows: list[dict[str, Any]] = []

    def write(self, line: str, extra: dict[str, Any]) -> None:
        self._rows.append(flat_row(json.loads(line)))
        if len(self._rows) >= self.ROWS:
            self._flush()

    def _flush(self) -> None:
        if self._rows:
            self._writer.write_table(self._pa.Table.from_pylist(self._rows, schema=self.schema))
            self._rows = []

    def close(self) -> None:
        self._flush()
        self._writer.close()


def flat_row(rec: dict[str, Any]) -> dict[str, Any]:
    """One output record as a flat table row (JSON text for the nested parts)."""
    err = rec.get("error") or {}
    usage = rec.get("usage") or {}
    return {"id": rec["id"], "data": dump(rec.get("data")) if "data" in rec else None,
            "error_type": err.get("type"), "error_message": err.get("message"), "error_raw": err.get("raw"),
            "error_path": err.get("path"), "confidence": dump(rec.get("confidence")),
            **{k: usage.get(k, 0) for k in ("prompt_tokens", "cached_tokens", "generated_tokens",
                                            "forced_tokens", "ms", "attempts")}}


def dump(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def openai_batch_line(rec: dict[str, Any], extra: dict[str, Any]) -> str:
    """An output record as an OpenAI Batch API result line."""
    rid = rec["id"]
    usage = rec.get("usage") or {}
    out: dict[str, Any] = {"id": f"batch_req_{rid}", "custom_id": rid, "response": None, "error": None}
    if "error" in rec:
        err = rec["error"]
        out["error"] = {"code": err.get("type"), "message": err.get("message")}
    else:
        content = json.dumps(rec.get("data"), ensure_ascii=False, separators=(",", ":"))
        out["response"] = {"status_code": 200, "request_id": f"req_{rid}", "body": {
            "id": f"chatcmpl-{rid}", "object": "chat.completion",
            "model": (extra.get("openai_body") or {}).get("model"),
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": usage.get("prompt_tokens", 0),
                      "completion_tokens": usage.get("generated_tokens", 0),
                      "total_tokens": usage.get("prompt_tokens", 0) + usage.get("generated_tokens", 0),
                      "prompt_tokens_details": {"cached_tokens": usage.get("cached_tokens", 0)}}}}
    return json.dumps(out, ensure_ascii=False, separators=(",", ":"))


def output_format(path: str | Path, fmt: str | None) -> str:
    if fmt is not None:
        if fmt not in FORMATS:
            raise InputError(f"unknown output format {fmt!r}; use one of {', '.join(FORMATS)}")
        return fmt
    return "parquet" if str(path).lower().endswith((".parquet", ".pq")) else "jsonl"


def open_writer(path: str | Path, fmt: str | None = None) -> Writer:
    fmt = output_format(path, fmt)
    if fmt == "parquet":
        if str(path) == "-":
            raise InputError("Parquet output needs a file, not stdout")
        return ParquetWriter(path)
    return JsonlWriter(path, openai=fmt == "openai-batch")
