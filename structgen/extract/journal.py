"""Durable per-record progress: an SQLite database in WAL mode.

Each finished record is stored under a content key -- a hash of (id, text, schema,
instructions, few-shot examples, model, sampling) -- with its whole output record, in
its own committed transaction (``synchronous=FULL``: on disk before the next record is
reported). A rerun of the same job looks every record up: a stored one is written out
again exactly as stored and not recomputed; a record whose text, schema, prompt, model or
sampling changed has a new key and runs again. Failed records are stored too, marked,
so ``retry_failed`` re-runs only those.

The journal only ever answers "is this exact work done, and what was its output"; the
output file is rewritten from it on every run, in input order, so a job killed at any
moment and resumed writes each record once.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

__all__ = ["Journal", "content_key"]


def content_key(parts: dict[str, Any]) -> str:
    """A stable hash of a record's work (canonical JSON of ``parts``)."""
    blob = json.dumps(parts, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class Journal:
    """``path`` is created if missing. One process writes at a time (a lock file is not
    needed: SQLite serialises writers); safe to share between threads."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("CREATE TABLE IF NOT EXISTS records (key TEXT PRIMARY KEY, id TEXT NOT NULL, "
                         "ok INTEGER NOT NULL, result TEXT NOT NULL)")

    def get(self, key: str) -> tuple[bool, str] | None:
        """``(ok, stored output line)`` for a finished record, else ``None``."""
        with self._lock:
            row = self._db.execute("SELECT ok, result FROM records WHERE key = ?", (key,)).fetchone()
        return None if row is None else (bool(row[0]), str(row[1]))

    def put(self, key: str, record_id: str, ok: bool, line: str) -> None:
        """Store one finished record (committed and synced before returning)."""
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO records (key, id, ok, result) VALUES (?, ?, ?, ?)",
                             (key, record_id, int(ok), line))

    def counts(self) -> dict[str, int]:
        with self._lock:
            ok, failed = self._db.execute(
                "SELECT COALESCE(SUM(ok), 0), COALESCE(SUM(1 - ok), 0) FROM records").fetchone()
        return {"ok": int(ok), "failed": int(failed)}

    def close(self) -> None:
        with self._lock:
            self._db.close()
