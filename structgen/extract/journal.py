"""Durable per-record progress: an SQLite database in WAL mode, group-committed.

Each finished record is stored under a content key -- a hash of (id, text, schema,
instructions, few-shot examples, model, sampling) -- with its whole output record. Puts
are buffered and committed together, one transaction and one sync (``synchronous=FULL``)
per group: when the job is about to hand a record on (:meth:`Journal.commit`, called by
:func:`~structgen.extract.stream.run_records` before it yields a computed record), when
``max_pending`` records are waiting, or when the oldest has waited ``max_delay`` seconds.
A record is thus reported (written to the output) only once it is on disk, and a job
killed at any moment loses at most the uncommitted group, which a resume runs again.

A rerun of the same job looks every record up: a stored one is written out again exactly
as stored and not recomputed; a record whose text, schema, prompt, model or sampling
changed has a new key and runs again. Failed records are stored too, marked, so
``retry_failed`` re-runs only those. The output file is rewritten from the journal on
every run, in input order, so a job killed and resumed writes each record once.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["Journal", "content_key"]


def content_key(parts: dict[str, Any]) -> str:
    """A stable hash of a record's work (canonical JSON of ``parts``)."""
    blob = json.dumps(parts, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class Journal:
    """``path`` is created if missing. One process writes at a time (SQLite serialises
    writers); safe to share between threads. ``max_pending`` / ``max_delay``: a put
    commits the group itself when that many records wait, or the oldest has waited that
    long (bounding the work a kill loses)."""

    def __init__(self, path: str | Path, *, max_pending: int = 256, max_delay: float = 1.0):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_pending = max(1, int(max_pending))
        self.max_delay = float(max_delay)
        self.commits = 0  # transactions written (each one sync)
        self._lock = threading.Lock()
        self._pending: dict[str, tuple[str, str, int, str]] = {}
        self._oldest = 0.0
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("CREATE TABLE IF NOT EXISTS records (key TEXT PRIMARY KEY, id TEXT NOT NULL, "
                         "ok INTEGER NOT NULL, result TEXT NOT NULL)")

    def get(self, key: str) -> tuple[bool, str] | None:
        """``(ok, stored output line)`` for a finished record (committed or pending), else ``None``."""
        with self._lock:
            row = self._pending.get(key)
            if row is not None:
                return bool(row[2]), row[3]
            found = self._db.execute("SELECT ok, result FROM records WHERE key = ?", (key,)).fetchone()
        return None if found is None else (bool(found[0]), str(found[1]))

    def put(self, key: str, record_id: str, ok: bool, line: str) -> None:
        """Buffer one finished record; durable after the next :meth:`commit` (or at once,
        when the group is full or old enough)."""
        with self._lock:
            if not self._pending:
                self._oldest = time.monotonic()
            self._pending[key] = (key, record_id, int(ok), line)
            if len(self._pending) >= self.max_pending or time.monotonic() - self._oldest >= self.max_delay:
                self._commit()

    def put_many(self, rows: list[tuple[str, str, bool, str]]) -> None:
        """Store ``(key, id, ok, line)`` rows in one committed transaction."""
        with self._lock:
            for key, record_id, ok, line in rows:
                self._pending[key] = (key, record_id, int(ok), line)
            self._commit()

    def commit(self) -> None:
        """Write every buffered record in one transaction, synced before returning."""
        with self._lock:
            self._commit()

    def _commit(self) -> None:
        if not self._pending:
            return
        rows = list(self._pending.values())
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._db.executemany("INSERT OR REPLACE INTO records (key, id, ok, result) VALUES (?, ?, ?, ?)", rows)
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")
        self._pending.clear()
        self.commits += 1

    def counts(self) -> dict[str, int]:
        with self._lock:
            self._commit()
            ok, failed = self._db.execute(
                "SELECT COALESCE(SUM(ok), 0), COALESCE(SUM(1 - ok), 0) FROM records").fetchone()
        return {"ok": int(ok), "failed": int(failed)}

    def close(self) -> None:
        """Commit what is buffered (finished records), then close."""
        with self._lock:
            try:
                self._commit()
            finally:
                self._db.close()
