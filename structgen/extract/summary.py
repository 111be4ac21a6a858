"""Counting a job as it runs: records, valid, failed by error type, tokens, per-field fill.

:class:`Stats` is updated once per finished record (cheap, constant memory: counters
and one counter per field path) and read by the progress display and the end-of-job
summary, which is also written as JSON.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from structgen.extract.records import ExtractResult

__all__ = ["Stats"]

_MAX_FIELDS = 500  # field paths tracked for fill rates


def _field_paths(value: Any, path: str, out: set[str]) -> None:
    """Paths (list indices as ``[]``) holding a non-empty value."""
    if isinstance(value, dict):
        for k, v in value.items():
            _field_paths(v, f"{path}.{k}" if path else str(k), out)
    elif isinstance(value, list):
        for v in value:
            _field_paths(v, f"{path}[]", out)
        if value:
            out.add(path)
    elif value is not None and value != "":
        out.add(path)


@dataclass
class Stats:
    total: int | None = None  # records expected, when known
    records: int = 0
    valid: int = 0
    resumed: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    forced_tokens: int = 0
    computed_records: int = 0  # run now, not taken from the journal
    fields: Counter[str] = field(default_factory=Counter)
    workers: Counter[str] = field(default_factory=Counter)  # records computed per Ray worker (host:pid)
    started: float = field(default_factory=time.perf_counter)

    def add(self, result: ExtractResult, resumed: bool = False, worker: str | None = None) -> None:
        """Count ``result``; ``worker``: the Ray worker that computed it (host:pid), if any."""
        self.records += 1
        if resumed:
            self.resumed += 1
        else:
            self.computed_records += 1
            if worker:
                self.workers[worker] += 1
            u = result.usage
            self.prompt_tokens += u.prompt_tokens
            self.cached_tokens += u.cached_tokens
            self.generated_tokens += u.generated_tokens
            self.forced_tokens += u.forced_tokens
        if result.error is not None:
            self.failed[result.error.type] += 1
            return
        self.valid += 1
        paths: set[str] = set()
        _field_paths(result.data_json(), "", paths)
        for p in paths:
            if p in self.fields or len(self.fields) < _MAX_FIELDS:
                self.fields[p] += 1

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    @property
    def errors(self) -> int:
        return sum(self.failed.values())

    def docs_per_s(self) -> float:
        return self.computed_records / self.elapsed if self.elapsed > 0 else 0.0

    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.elapsed if self.elapsed > 0 else 0.0

    def cache_hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def fill_rates(self) -> dict[str, float]:
        return {p: round(n / self.valid, 4) for p, n in sorted(self.fields.items())} if self.valid else {}

    def to_dict(self) -> dict[str, Any]:
        return {"records": self.records, "valid": self.valid, "failed": sum(self.failed.values()),
                "failed_by_type": dict(sorted(self.failed.items())), "resumed": self.resumed,
                "computed": self.computed_records, "seconds": round(self.elapsed, 3),
                "docs_per_s": round(self.docs_per_s(), 3), "tokens_per_s": round(self.tokens_per_s(), 1),
                "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "prefix_cache_hit_rate": round(self.cache_hit_rate(), 4),
                "generated_tokens": self.generated_tokens, "forced_tokens": self.forced_tokens,
                "fill_rate": self.fill_rates(),
                **({"computed_by_worker": dict(sorted(self.workers.items()))} if self.workers else {})}

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
