"""Reading documents lazily: JSONL, CSV, Parquet, a glob of text files, OpenAI batch JSONL.

:func:`read_records` yields one :class:`~structgen.extract.records.InputRecord` at a time
(Parquet in row batches), so a file of any size streams through in constant memory. A
line or row that cannot be read becomes a record carrying its ``error`` -- reported in
the output like any failed record, never dropped. A file that cannot be opened at all
raises :class:`~structgen.errors.InputError`.

OpenAI batch input (``{"custom_id", "method", "url", "body"}`` lines, recognised by
``custom_id`` and ``body``): the id is ``custom_id``, the conversation is ``body.messages``
and a ``response_format`` JSON schema becomes the record's own schema.
"""

from __future__ import annotations

import csv
import glob as globlib
import json
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from structgen.errors import InputError
from structgen.extract.records import InputRecord

__all__ = ["Fields", "as_records", "read_records", "source_kind"]


@dataclass(frozen=True)
class Fields:
    text: str = "text"
    id: str = "id"
    schema: str | None = None


def read_records(source: str | Path, fields: Fields = Fields()) -> Iterator[InputRecord]:
    """Records from ``source``: ``-`` (JSONL on stdin), a ``.jsonl``/``.json``, ``.csv`` or
    ``.parquet`` file, or a glob of text files (``'docs/*.txt'``: one record per file, the
    id its path)."""
    src = str(source)
    if src == "-":
        return _jsonl(sys.stdin, "<stdin>", fields)
    kind, paths = source_kind(src)
    if kind == "glob":
        return _glob(paths)
    path = Path(paths[0])
    if kind == "csv":
        return _csv(path, fields)
    if kind == "parquet":
        return _parquet(path, fields)
    if kind == "jsonl":
        return _jsonl_file(path, fields)
    return iter([InputRecord(id=path.name, text=_read_text(path))])


#: a file's kind by its suffix (any other suffix: one text document)
_SUFFIX_KINDS = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet",
                 ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl"}


def source_kind(src: str) -> tuple[str, list[str]]:
    """What the input ``src`` (a path or a glob, not ``-``) names, as every reader of it
    (:func:`read_records`, ``--ray``'s dataset) sees it: ``("glob", the matching files,
    sorted)``, else ``(kind, [src])`` with ``kind`` ``jsonl``, ``csv``, ``parquet`` or
    ``text`` by the suffix. InputError when the glob matches no file or the file is missing."""
    if any(c in src for c in "*?["):
        paths = sorted(globlib.glob(src, recursive=True))
        if not paths:
            raise InputError("the glob matches no file", source=src)
        return "glob", paths
    path = Path(src)
    if not path.is_file():
        raise InputError("no such input file", source=src)
    return _SUFFIX_KINDS.get(path.suffix.lower(), "text"), [src]


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read: {exc}", source=str(path)) from exc


def _jsonl_file(path: Path, fields: Fields) -> Iterator[InputRecord]:
    try:
        fh = open(path, encoding="utf-8")  # noqa: SIM115 -- closed by the generator
    except OSError as exc:
        raise InputError(f"cannot open: {exc.strerror or exc}", source=str(path)) from exc

    def gen() -> Iterator[InputRecord]:
        with fh:
            yield from _jsonl(fh, str(path), fields)

    return gen()


def _jsonl(lines: Iterable[str], src: str, fields: Fields) -> Iterator[InputRecord]:
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            yield InputRecord(id=f"line-{n}", error=str(InputError(f"not JSON: {exc}", source=src, where=f"line {n}")))
            continue
        yield _from_mapping(obj, fields, src, f"line {n}", f"line-{n}")


def _from_mapping(obj: Any, fields: Fields, src: str, where: str, fallback_id: str) -> InputRecord:
    if not isinstance(obj, dict):
        return InputRecord(id=fallback_id, error=str(InputError("not a JSON object", source=src, where=where)))
    if "custom_id" in obj and isinstance(obj.get("body"), dict):
        return _openai_batch(obj, src, where)
    rid = obj.get(fields.id)
    rid = fallback_id if rid is None else str(rid)
    text = obj.get(fields.text)
    schema = obj.get(fields.schema) if fields.schema else None
    if not isinstance(text, str):
        what = "missing" if text is None else f"a {type(text).__name__}, not a string"
        return InputRecord(id=rid, error=str(InputError(f"field {fields.text!r} is {what}", source=src,
                                                        where=where)))
    return InputRecord(id=rid, text=text, schema=schema if schema not in (None, "") else None)


def _openai_batch(obj: dict[str, Any], src: str, where: str) -> InputRecord:
    rid = str(obj["custom_id"])
    body = obj["body"]
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        return InputRecord(id=rid, error=str(InputError("OpenAI batch body has no messages", source=src,
                                                        where=where)))
    turns: list[tuple[str, str]] = []
    for m in msgs:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):  # content parts: keep the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if not isinstance(content, str) or not isinstance(m.get("role"), str):
            return InputRecord(id=rid, error=str(InputError("an OpenAI batch message has no text content",
                                                            source=src, where=where)))
        turns.append((m["role"], content))
    schema = None
    rf = body.get("response_format")
    if isinstance(rf, dict) and rf.get("type") == "json_schema":
        js = rf.get("json_schema") or {}
        schema = js.get("schema") if isinstance(js, dict) else None
    text = next((c for r, c in reversed(turns) if r == "user"), "")
    return InputRecord(id=rid, text=text, messages=tuple(turns), schema=schema,
                       extra={"openai_body": {k: body[k] for k in ("model",) if k in body},
                              "openai_url": obj.get("url", "/v1/chat/completions")})


def _csv(path: Path, fields: Fields) -> Iterator[InputRecord]:
    try:
        fh = open(path, encoding="utf-8", newline="")  # noqa: SIM115 -- closed by the generator
    except OSError as exc:
        raise InputError(f"cannot open: {exc.strerror or exc}", source=str(path)) from exc

    def gen() -> Iterator[InputRecord]:
        with fh:
            reader = csv.DictReader(fh)
            if reader.fieldnames is None or fields.text not in reader.fieldnames:
                raise InputError(f"CSV has no column {fields.text!r} (columns: {reader.fieldnames})",
                                 source=str(path))
            for n, row in enumerate(reader, 2):
                yield _from_mapping(row, fields, str(path), f"row {n}", f"row-{n}")

    return gen()


def _parquet(path: Path, fields: Fields) -> Iterator[InputRecord]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise InputError("reading Parquet needs pyarrow: pip install 'structgen-lm[extract]'",
                         source=str(path)) from exc
    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:
        raise InputError(f"cannot open Parquet file: {exc}", source=str(path)) from exc
    names = set(pf.schema_arrow.names)
    if fields.text not in names:
        raise InputError(f"Parquet file has no column {fields.text!r} (columns: {sorted(names)})", source=str(path))
    cols = [c for c in (fields.id, fields.text, fields.schema) if c and c in names]

    def gen() -> Iterator[InputRecord]:
        n = 0
        for batch in pf.iter_batches(batch_size=1024, columns=cols):
            for row in batch.to_pylist():
                n += 1
                yield _from_mapping(row, fields, str(path), f"row {n}", f"row-{n}")

    return gen()


def _glob(paths: list[str]) -> Iterator[InputRecord]:
    def gen() -> Iterator[InputRecord]:
        for p in paths:
            try:
                yield InputRecord(id=p, text=Path(p).read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError) as exc:
                yield InputRecord(id=p, error=str(InputError(f"cannot read: {exc}", source=p)))

    return gen()


def as_records(items: Iterable[Any], fields: Fields = Fields()) -> Iterator[InputRecord]:
    """Records from Python values: strings (ids are their positions), dicts (as JSONL
    lines) or :class:`InputRecord` objects."""
    for n, item in enumerate(items):
        if isinstance(item, InputRecord):
            yield item
        elif isinstance(item, str):
            yield InputRecord(id=str(n), text=item)
        else:
            yield _from_mapping(item, fields, "<input>", f"item {n}", str(n))
