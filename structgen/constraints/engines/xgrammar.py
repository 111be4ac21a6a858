"""XGrammar as a constraint engine for JSON schemas (the ladder's second engine).

The ladder (:mod:`structgen.constraints.ladder`) asks XGrammar to compile a normalised
schema when llguidance cannot compile it exactly; XGrammar enforces much of what
llguidance's looser rungs drop, so its grammar is usually tighter. It is known to accept
some invalid instances, so an XGrammar constraint is never labelled exact and the final
validation (:mod:`structgen.constraints.validation`) guards the output.

XGrammar is optional (``pip install 'structgen-lm[xgrammar]'``; it imports torch and
transformers). It is imported lazily, on first use (:func:`load_xgrammar`); when it is
missing or broken, :func:`engine_for` says why and the ladder goes on without it.

One ``TokenizerInfo`` + ``GrammarCompiler`` per vocabulary, built on first use and cached
(:func:`engine_for`). The vocabulary is the shared
:class:`~structgen.constraints.base.TokenTable` -- the same bytes per token, the same
special tokens (empty, so never allowed), the same EOS as the only stop token -- so every
engine sees one vocabulary and one bitmask width.

:meth:`XGrammarEngine.compile_schema` reads the options ``whitespace_flexible``,
``any_order`` (keys in any order) and ``timeout_s``: compilation runs on a daemon thread
(XGrammar releases the GIL) and is abandoned after ``timeout_s``; at most
``max_abandoned`` abandoned compiles may still be running, beyond that it refuses
(:mod:`~structgen.constraints.engines.deadline`).

Matcher semantics mirror :class:`~structgen.constraints.engines.llguidance.LLGuidanceMatcher`:
EOS is allowed exactly where the text so far is complete; consuming EOS there stops the
matcher, and EOS after a stop is accepted without reaching XGrammar (``rollback`` skips
it); once stopped or in the error state the mask allows EOS only; a bad token makes
``consume`` return ``False`` and the matcher keeps its error state (``rollback`` does not
clear it). Misuse raises ``TypeError`` / ``ValueError`` / ``IndexError``.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from structgen.constraints.base import CompiledConstraint, Engine, EngineRefusal, Matcher, TokenTable
from structgen.constraints.bitmask import bitmask_words, row_pointer
from structgen.constraints.engines.deadline import MAX_ABANDONED, Abandonable
from structgen.constraints.engines.xgrammar_schema import skipped_keyword, xgrammar_schema
from structgen.constraints.spec import JsonSchemaSpec
from structgen.extras import install_hint

__all__ = [
    "SCHEMA_OPTIONS",
    "XGrammarCompiled",
    "XGrammarEngine",
    "XGrammarMatcher",
    "engine_for",
    "load_xgrammar",
]

#: the options :meth:`XGrammarEngine.compile_schema` reads (defaults: compact, schema
#: order, 5 s)
SCHEMA_OPTIONS = ("whitespace_flexible", "any_order", "timeout_s")
_DEFAULT_TIMEOUT_S = 5.0


def load_xgrammar() -> tuple[Any, str | None]:
    """``(xgrammar module, None)``, or ``(None, why)`` when it cannot be imported.

    The one place XGrammar is imported (tests replace it to simulate its absence).
    """
    try:
        import xgrammar
    except ImportError as exc:
        return None, f"xgrammar is not installed ({exc}): {install_hint('xgrammar')}"
    except Exception as exc:
        return None, f"xgrammar cannot be imported: {type(exc).__name__}: {exc}"
    return xgrammar, None


def _eos_word(eos: int) -> tuple[int, int]:
    """(word index, int32 value) of the bitmask word that allows only ``eos``."""
    value = 1 << (eos & 31)
    return eos >> 5, value - (1 << 32) if value >= 1 << 31 else value


class XGrammarEngine(Engine):
    """XGrammar's tokenizer info and compiler for one vocabulary (thread safe)."""

    name = "xgrammar"

    def __init__(self, xgr: Any, table: TokenTable, *, max_abandoned: int = MAX_ABANDONED):
        size = table.size
        eos = table.eos_token_id
        self.xgr = xgr
        self.table = table
        self.vocab_size = size
        self.eos_token_id = eos
        self.words = bitmask_words(size)
        self.eos_word = _eos_word(eos)
        self.info = xgr.TokenizerInfo(list(table.tokens), xgr.VocabType.RAW, vocab_size=size, stop_token_ids=[eos])
        # no XGrammar-side cache: structgen's CompileCache keeps the compiled constraints
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=max(1, min(4, os.cpu_count() or 1)),
                                            cache_enabled=False)
        self._runner = Abandonable(self.name, max_abandoned)

    def compile_schema(self, spec: JsonSchemaSpec, schema: Any,
                       options: Mapping[str, Any]) -> XGrammarCompiled:
        """``schema`` (normalised) compiled by XGrammar, never exact; :class:`EngineRefusal`
        when a keyword XGrammar enforces more loosely than llguidance's looser rungs is
        used, or XGrammar fails or times out."""
        if isinstance(schema, bool):
            schema = {} if schema else {"not": {}}
        skip = skipped_keyword(schema)
        if skip is not None:
            raise EngineRefusal(f"skipped: XGrammar enforces {skip} more loosely than llguidance's lenient rung")
        grammar = self._compile(xgrammar_schema(schema), whitespace_flexible=bool(options.get("whitespace_flexible")),
                                any_order=bool(options.get("any_order")),
                                timeout_s=float(options.get("timeout_s", _DEFAULT_TIMEOUT_S)))
        return XGrammarCompiled(spec, self, grammar, schema)

    def _compile(self, schema: Any, *, whitespace_flexible: bool, any_order: bool, timeout_s: float) -> Any:
        text = schema if isinstance(schema, str) else json.dumps(schema)

        def compile_json() -> Any:
            try:
                # strict_mode=False: unlisted properties / items follow the schema (the
                # default, strict, would reject valid instances); any_order: see the ladder
                return self.compiler.compile_json_schema(
                    text, any_whitespace=whitespace_flexible,
                    separators=None if whitespace_flexible else (",", ":"),
                    strict_mode=False, any_order=any_order)
            except Exception as exc:
                raise EngineRefusal(f"{type(exc).__name__}: {_first_line(str(exc))}") from None

        return self._runner.run(compile_json, timeout_s)


_LOG_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: (Check failed: \(.*?\) is false: )?")


def _first_line(message: str) -> str:
    """XGrammar's C++ messages, without the ``[time] file.cc:line: Check failed: ...`` prefix."""
    head = _LOG_PREFIX.sub("", message.strip().split("\n", 1)[0]).strip()
    return head if len(head) <= 300 else head[:297] + "..."


_engines: dict[int, tuple[TokenTable, XGrammarEngine]] = {}  # id(table) -> (table, engine)
_engines_lock = threading.Lock()


def engine_for(table: TokenTable) -> tuple[XGrammarEngine | None, str | None]:
    """The cached :class:`XGrammarEngine` for ``table``, or ``(None, why)``."""
    with _engines_lock:
        entry = _engines.get(id(table))
        if entry is not None and entry[0] is table:
            return entry[1], None
    xgr, why = load_xgrammar()
    if xgr is None:
        return None, why
    try:
        engine = XGrammarEngine(xgr, table)
    except Exception as exc:
        return None, f"cannot build the xgrammar tokenizer: {type(exc).__name__}: {_first_line(str(exc))}"
    with _engines_lock:
        entry = _engines.setdefault(id(table), (table, engine))
        return entry[1], None


class XGrammarMatcher(Matcher):
    """Per-sequence state over an ``xgrammar.GrammarMatcher``. Not thread safe (one per sequence)."""

    def __init__(self, inner: Any, engine: XGrammarEngine):
        self._m = inner
        self._engine = engine
        self._start_history()  # consumed tokens and error state (see Matcher)
        self._version = 0  # bumped on every state change: keys the cached is_stopped answer
        self._stopped_at: tuple[int, bool] | None = None
        self._scratch: Any = None

    # -- masks
    def fill_bitmask(self, bitmask: Any, index: int = 0) -> None:
        row_pointer(bitmask, index, self._engine.words)  # checks dtype, shape, device, index
        if self.is_stopped():
            self._eos_only(bitmask, index)
            return
        try:
            self._m.fill_next_token_bitmask(bitmask, index)  # DLPack: written in place, no copy
        except RuntimeError as exc:  # e.g. a non-contiguous array
            raise ValueError(f"xgrammar cannot fill this bitmask: {_first_line(str(exc))}") from exc

    def _eos_only(self, bitmask: Any, index: int) -> None:
        word, value = self._engine.eos_word
        bitmask[index] = 0
        bitmask[index, word] = value

    # -- state changes
    def consume(self, token_id: int) -> bool:
        if self._error is not None:
            return False
        token_id = int(token_id)
        size = self._engine.vocab_size
        if not 0 <= token_id < size:
            self._error = f"token id {token_id} is outside the vocabulary (size {size})"
            return False
        if token_id == self._engine.eos_token_id and self._m.is_terminated():
            self._history.append(True)  # EOS after the stop: accepted, not seen by XGrammar
            self._version += 1
            return True
        if not self._m.accept_token(token_id):  # False leaves XGrammar's state unchanged
            self._error = f"token {token_id} not allowed by the xgrammar grammar"
            return False
        self._history.append(False)
        self._version += 1
        return True

    def rollback(self, n: int) -> None:
        real = self._unwind(n)
        if real:
            # XGrammar's rollback is unlimited (0.2.x: max_rollback_tokens is always -1)
            self._m.rollback(real)
        self._version += 1

    # -- queries
    def is_accepting(self) -> bool:
        return self._error is None and bool(self._m.is_completed())

    def is_stopped(self) -> bool:
        """Error, EOS consumed, or complete with nothing but EOS allowed next (as llguidance)."""
        if self._error is not None or self._m.is_terminated():
            return True
        if not self._m.is_completed():
            return False
        cached = self._stopped_at
        if cached is not None and cached[0] == self._version:
            return cached[1]
        if self._scratch is None:
            import numpy as np

            self._scratch = np.zeros((1, self._engine.words), dtype=np.int32)
        self._m.fill_next_token_bitmask(self._scratch, 0)
        word, value = self._engine.eos_word
        row = self._scratch[0]
        only_eos = bool(row[word] == value and not row[:word].any() and not row[word + 1:].any())
        self._stopped_at = (self._version, only_eos)
        return only_eos

    def forced_tokens(self) -> list[int]:
        """XGrammar's jump-forward tokens: whole tokens of the forced text, the last one left
        out when a longer token could extend it (as llguidance's fast-forward tokens).
        Each is checked on a fork first, so the caller's ``consume`` cannot fail on them."""
        if self.is_stopped() or self._m.is_completed():
            return []  # complete: ending here is one of the choices, so nothing is forced
        return self._accepted_prefix([int(t) for t in self._m.find_jump_forward_tokens()])

    def forced_text(self) -> bytes:
        """The text every continuation starts with (whole UTF-8 characters only)."""
        return b"" if self.is_stopped() else self._m.find_jump_forward_string().encode()

    def tokenize_bytes(self, text: bytes) -> list[int]:
        return self._engine.table.tokenize(text)

    def validate_tokens(self, token_ids: Sequence[int]) -> int:
        return len(self._accepted_prefix(token_ids))

    def _accepted_prefix(self, ids: Sequence[int]) -> list[int]:
        probe = self._m.fork()
        out: list[int] = []
        for t in ids:
            if t == self._engine.eos_token_id or not 0 <= t < self._engine.vocab_size or not probe.accept_token(t):
                break
            out.append(t)
        return out

    def token_bytes(self, token_ids: Sequence[int]) -> bytes:
        return b"".join(self._engine.table.tokens[int(t)] for t in token_ids)

    def error(self) -> str | None:
        return self._error

    def fork(self) -> XGrammarMatcher:
        """An independent copy of this matcher's state (for ``fork`` / beam branches)."""
        twin = XGrammarMatcher(self._m.fork(), self._engine)
        self._copy_history_to(twin)
        return twin


class XGrammarCompiled(CompiledConstraint):
    """A schema compiled by XGrammar for one tokenizer. Never exact: final validation guards it."""

    def __init__(self, spec: JsonSchemaSpec, engine: XGrammarEngine, grammar: Any, schema: Any,
                 *, warnings: Sequence[str] = ()):
        self.spec = spec
        self.exact = False
        self.rung = XGrammarEngine.name
        self.warnings: tuple[str, ...] = tuple(warnings)
        self.schema = schema
        self.engine = engine
        self.grammar = grammar
        self._lock = threading.Lock()

    def label(self, *, exact: bool, rung: str, warnings: Sequence[str]) -> XGrammarCompiled:
        super().label(exact=False, rung=rung, warnings=warnings)  # never exact
        return self

    def matcher(self) -> XGrammarMatcher:
        engine = self.engine
        with self._lock:
            inner = engine.xgr.GrammarMatcher(self.grammar, override_stop_tokens=[engine.eos_token_id])
        return XGrammarMatcher(inner, engine)

    def __repr__(self) -> str:
        return f"XGrammarCompiled({self.spec.describe()}, exact=False)"
