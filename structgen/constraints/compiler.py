"""The compile cache and the shared compiler per tokenizer.

``compiler_for(tokenizer)`` returns one :class:`CachingCompiler` per tokenizer
*vocabulary* (fingerprint = SHA-256 of the vocabulary and EOS ids, computed once per
tokenizer object) and ladder configuration: the engines composed by
:class:`~structgen.constraints.ladder.Ladder`, configured by
:class:`~structgen.constraints.ladder.LadderConfig` (``LadderConfig.from_env()`` unless one
is passed in). Compiled constraints are cached in a bounded LRU :class:`CompileCache`
keyed by ``(spec, fingerprint)``, shared by all compilers unless one is passed in.
Everything here is thread safe.

    compiler = compiler_for(tokenizer)
    compiled = compiler.compile(regex_spec(r"\\d{4}-\\d{2}-\\d{2}"))   # miss
    compiled = compiler.compile(regex_spec(r"\\d{4}-\\d{2}-\\d{2}"))   # hit, same object
    compiler.cache.stats()   # CacheStats(hits=1, misses=1, evictions=0, size=1, maxsize=512)
"""

from __future__ import annotations

import hashlib
import json
import threading
import weakref
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from structgen.constraints.base import CompiledConstraint, ConstraintCompiler
from structgen.constraints.engines.llguidance import LLGuidanceEngine
from structgen.constraints.ladder import Ladder, LadderConfig
from structgen.constraints.spec import ConstraintSpec

__all__ = [
    "CacheStats",
    "CachingCompiler",
    "CompileCache",
    "compiler_for",
    "default_cache",
    "tokenizer_fingerprint",
]

DEFAULT_CACHE_SIZE = 512


@dataclass(frozen=True)
class CacheStats:
    hits: int
    misses: int
    evictions: int
    size: int
    maxsize: int


class CompileCache:
    """A thread-safe LRU of compiled constraints with hit / miss / eviction counters.

    Failed compiles (``ConstraintError``) are not cached. Two threads missing on the same
    key at once may both compile; the first result stored wins and both count a miss.
    """

    def __init__(self, maxsize: int = DEFAULT_CACHE_SIZE):
        if maxsize < 1:
            raise ValueError(f"maxsize must be at least 1, not {maxsize}")
        self.maxsize = maxsize
        self._items: OrderedDict[Hashable, CompiledConstraint] = OrderedDict()
        self._lock = threading.Lock()
        self._hits = self._misses = self._evictions = 0

    def get(self, key: Hashable) -> CompiledConstraint | None:
        """The cached value (counted as a hit, made most recent) or ``None`` (a miss)."""
        with self._lock:
            value = self._items.get(key)
            if value is None:
                self._misses += 1
                return None
            self._items.move_to_end(key)
            self._hits += 1
            return value

    def put(self, key: Hashable, value: CompiledConstraint) -> CompiledConstraint:
        """Store ``value`` unless ``key`` is already there; return the stored value."""
        with self._lock:
            existing = self._items.get(key)
            if existing is not None:
                self._items.move_to_end(key)
                return existing
            self._items[key] = value
            while len(self._items) > self.maxsize:
                self._items.popitem(last=False)
                self._evictions += 1
            return value

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._items

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self._hits, self._misses, self._evictions, len(self._items), self.maxsize)

    def clear(self) -> None:
        """Drop every entry and zero the counters."""
        with self._lock:
            self._items.clear()
            self._hits = self._misses = self._evictions = 0


class CachingCompiler(ConstraintCompiler):
    """A :class:`~structgen.constraints.ladder.Ladder` behind a :class:`CompileCache`.

    Equal specs share one compiled constraint (``JsonSchemaSpec.model`` is not part of
    equality, so ``compiled.spec`` may be an equal spec with another model attached).
    ``fingerprint`` names the vocabulary and, when not the default, the ladder's
    configuration: compilers that would compile differently never share entries.
    """

    def __init__(self, ladder: Ladder, fingerprint: str, cache: CompileCache):
        self.ladder = ladder
        self.fingerprint = fingerprint
        self.cache = cache

    @property
    def vocab_size(self) -> int:
        return self.ladder.vocab_size

    @property
    def eos_token_id(self) -> int:
        return self.ladder.eos_token_id

    @property
    def config(self) -> LadderConfig:
        return self.ladder.config

    def compile(self, spec: ConstraintSpec) -> CompiledConstraint:
        key = (spec, self.fingerprint)
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        return self.cache.put(key, self.ladder.compile(spec))


_DEFAULT_CACHE = CompileCache()


def default_cache() -> CompileCache:
    """The process-wide compile cache shared by compilers made with :func:`compiler_for`."""
    return _DEFAULT_CACHE


_fingerprints: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
_fingerprint_ids: dict[int, tuple[Any, str]] = {}  # tokenizers that cannot be weakly referenced
_engines: dict[tuple[str, int | None, int | None], LLGuidanceEngine] = {}
_ladders: dict[tuple[str, int | None, int | None, LadderConfig], Ladder] = {}
_compilers: dict[tuple[str, int | None, int | None, LadderConfig], CachingCompiler] = {}  # default cache only
_lock = threading.RLock()


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """SHA-256 of the tokenizer's vocabulary (token -> id) and EOS ids; computed once per object
    (under the lock: threads that first compile at the same moment do not each hash the vocabulary)."""
    with _lock:
        try:
            cached = _fingerprints.get(tokenizer)
        except TypeError:
            entry = _fingerprint_ids.get(id(tokenizer))
            cached = entry[1] if entry is not None and entry[0] is tokenizer else None
        if cached is not None:
            return cached
        vocab = tokenizer.get_vocab()
        digest = hashlib.sha256()
        for token, index in sorted(vocab.items(), key=lambda item: (item[1], item[0])):
            digest.update(f"{index}\x00{token}\x01".encode("utf-8", "surrogatepass"))
        eos = getattr(tokenizer, "eos_token_id", None)
        digest.update(json.dumps({"eos": eos, "n": len(vocab)}).encode())
        fingerprint = digest.hexdigest()
        try:
            _fingerprints[tokenizer] = fingerprint
        except TypeError:
            _fingerprint_ids[id(tokenizer)] = (tokenizer, fingerprint)
        return fingerprint


def compiler_for(tokenizer: Any, *, cache: CompileCache | None = None,
                 n_vocab: int | None = None, eos_token_id: int | None = None,
                 config: LadderConfig | None = None) -> CachingCompiler:
    """The shared compiler for ``tokenizer`` (a Hugging Face fast tokenizer).

    Tokenizers with the same vocabulary share one llguidance tokenizer (slow to build: once).
    ``cache`` defaults to :func:`default_cache`; pass a fresh :class:`CompileCache` to
    isolate (tests, or a bounded cache per model). ``n_vocab`` / ``eos_token_id`` override
    the vocabulary size (e.g. the model's padded logits width) and EOS token. ``config``
    defaults to :meth:`LadderConfig.from_env() <structgen.constraints.ladder.LadderConfig.from_env>`.
    """
    config = LadderConfig.from_env() if config is None else config
    fingerprint = tokenizer_fingerprint(tokenizer)
    if n_vocab is not None or eos_token_id is not None:
        fingerprint = f"{fingerprint}:{n_vocab}:{eos_token_id}"
    engine_key = (fingerprint, n_vocab, eos_token_id)
    ladder_key = (*engine_key, config)
    if config != LadderConfig():
        fingerprint = f"{fingerprint}:{config!r}"
    cache = default_cache() if cache is None else cache
    with _lock:
        if cache is _DEFAULT_CACHE and ladder_key in _compilers:
            return _compilers[ladder_key]
        ladder = _ladders.get(ladder_key)
        if ladder is None:
            engine = _engines.get(engine_key)
            if engine is None:
                engine = LLGuidanceEngine(tokenizer, n_vocab=n_vocab, eos_token_id=eos_token_id)
                _engines[engine_key] = engine
            ladder = _ladders[ladder_key] = Ladder(engine, config)
        compiler = CachingCompiler(ladder, fingerprint, cache)
        if cache is _DEFAULT_CACHE:
            _compilers[ladder_key] = compiler
        return compiler
