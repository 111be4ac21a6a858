"""Records in, results out, in input order, with bounded concurrency and the journal.

:func:`run_records` pulls records lazily from any iterable, skips those the journal has
already finished (their stored output line comes back unchanged), runs the rest on a
thread pool -- so a batching backend decodes many at once -- and yields one
:class:`Done` per input record in input order; a computed record is yielded only once
the journal has committed it (records finishing together share one commit). At most ``window`` records are held at
any time, whatever the input's size.
"""

from __future__ import annotations

import contextlib
import json
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from structgen.errors import StructgenError
from structgen.extract.extractor import Extractor, seed_of
from structgen.extract.journal import Journal, content_key
from structgen.extract.records import ExtractResult, InputRecord

__all__ = ["DEFAULT_CONCURRENCY", "Done", "model_id", "run_records"]

#: records in flight at once: enough for a local engine's full batch (the embedded engine
#: decodes up to 512 sequences per pass) and for a server's continuous batching
DEFAULT_CONCURRENCY = 512


@dataclass
class Done:
    """One finished record: its result, its output line, whether the journal had it."""

    result: ExtractResult
    line: str
    resumed: bool = False


def model_id(backend: Any) -> str:
    """What identifies the model behind a backend (part of every progress key): its name,
    path or served name, and for an in-process model its dtype (it changes the output)."""
    out = str(backend.name)
    for attr in ("model_path", "model", "base_url"):
        value = getattr(backend, attr, None)
        if isinstance(value, str) and value:
            out = f"{backend.name}:{value}"
            break
    with contextlib.suppress(Exception):  # an in-process engine's model (a closed backend raises)
        dtype = getattr(getattr(backend.engine, "model", None), "dtype", None)
        if dtype is not None:
            out += f":{dtype}"
    return out


def record_key(extractor: Extractor, record: InputRecord, model: str) -> tuple[str, Any]:
    """The record's content key and its schema's model class (for typed results)."""
    digest: str | None = None
    model_cls = None
    try:
        schema = extractor.schema_for(record)
        digest, model_cls = schema.digest, schema.model
    except StructgenError:
        digest = repr(record.schema)  # the record fails; the key still names what it asked for
    parts = extractor.key_parts(record, digest)
    parts["model"] = model
    return content_key(parts), model_cls


def run_records(records: Iterable[InputRecord], extractor: Extractor, *, journal: Journal | None = None,
                retry_failed: bool = False, concurrency: int = DEFAULT_CONCURRENCY,
                window: int | None = None) -> Iterator[Done]:
    """Yield a :class:`Done` per record, in input order."""
    concurrency = max(1, int(concurrency))
    window = window or concurrency * 2
    model = model_id(extractor.backend)
    pool = ThreadPoolExecutor(concurrency, thread_name_prefix="structgen-extract")
    pending: deque[Future[Done]] = deque()

    def work(record: InputRecord, key: str) -> Done:
        if record.error is None:  # in the worker: the reader never waits for a prefix
            with contextlib.suppress(StructgenError):  # a bad schema: the record reports it
                extractor.warm(extractor.schema_for(record))
        result = extractor.process(record, seed=seed_of(key))
        line = result.to_json()
        if journal is not None:
            journal.put(key, record.id, result.ok, line)
        return Done(result, line)

    def take() -> Done:
        """The oldest record, once durable: a computed record is yielded (and so written
        out) only after the journal's group holding it is committed."""
        done = pending.popleft().result()
        if journal is not None and not done.resumed:
            journal.commit()
        return done

    try:
        for record in records:
            key, model_cls = record_key(extractor, record, model)
            stored = journal.get(key) if journal is not None else None
            fut: Future[Done]
            if stored is not None and (stored[0] or not retry_failed):
                fut = Future()
                result = ExtractResult.from_dict(json.loads(stored[1]), model_cls)
                result.extra = record.extra
                fut.set_result(Done(result, stored[1], resumed=True))
            else:
                fut = pool.submit(work, record, key)
            pending.append(fut)
            while len(pending) >= window or (pending and pending[0].done()):
                yield take()
        while pending:
            yield take()
    finally:
        for fut in pending:
            fut.cancel()
        pool.shutdown(wait=True, cancel_futures=True)
