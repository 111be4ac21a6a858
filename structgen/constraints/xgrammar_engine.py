"""XGrammar as the second engine: tried when llguidance cannot compile a schema.

:func:`structgen.constraints.fallback.schema_grammar` climbs a ladder of llguidance
grammars. When its ``exact`` and ``coerce`` rungs fail, the ``xgrammar`` rung asks XGrammar
to compile the same normalised schema (:func:`compile_schema`) before the llguidance rungs
that ignore or drop keywords (``lenient`` .. ``any``): XGrammar enforces much of what those
drop, so its grammar is usually tighter. It is known to accept some invalid instances
(MaskBench: 1,368), so an XGrammar constraint is always ``exact=False`` and the final
validation (:mod:`structgen.constraints.validation`) guards the output.

XGrammar is optional (``pip install 'structgen[xgrammar]'``; it imports torch and
transformers). It is imported lazily, only when the rung is reached; when it is missing or
broken the rung is skipped and a warning says so (:func:`load_xgrammar`;
``STRUCTGEN_XGRAMMAR=0`` switches it off).

One ``TokenizerInfo`` + ``GrammarCompiler`` per llguidance tokenizer, built on first use
and cached (:func:`engine_for`). The vocabulary is taken from llguidance's tokenizer --
the same bytes per token, the same special tokens (empty, so never allowed), the same EOS
as the only stop token -- so both engines see one vocabulary and one bitmask width.

Compilation runs on a daemon thread (XGrammar releases the GIL) and is abandoned after
``timeout_s`` (some large schemas take minutes); at most :data:`MAX_ABANDONED` abandoned
compiles may still be running, beyond that the rung is skipped.

Matcher semantics mirror :class:`~structgen.constraints.llguidance_engine.LLGuidanceMatcher`:
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
from collections.abc import Sequence
from typing import Any

from structgen.constraints.base import CompiledConstraint, Matcher
from structgen.constraints.bitmask import bitmask_words, row_pointer
from structgen.constraints.spec import ConstraintSpec

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "MAX_ABANDONED",
    "XGRAMMAR_RUNG",
    "XGrammarCompiled",
    "XGrammarEngine",
    "XGrammarMatcher",
    "compile_schema",
    "engine_for",
    "full_match_pattern",
    "load_xgrammar",
    "xgrammar_schema",
]

XGRAMMAR_RUNG = "xgrammar"
#: seconds one XGrammar compile may take (``STRUCTGEN_XGRAMMAR_TIMEOUT`` overrides)
DEFAULT_TIMEOUT_S = 5.0
#: abandoned (timed-out) compiles that may still be running before the rung is skipped
MAX_ABANDONED = 2
#: keys in any order (XGrammar's ``any_order``; ``STRUCTGEN_XGRAMMAR_ANY_ORDER=0``: the
#: schema's order, as llguidance). On by default: JSON objects are unordered, and in the
#: schema's order XGrammar rejects valid instances MaskBench has (and the sample's floors
#: count). The cost: its any-order grammar counts keys, so a repeated key can stand in for
#: a required one (``{"a":1,"b":2,"b":3}`` for required a, b, c) -- the final validation
#: then rejects the output.
ANY_ORDER = os.environ.get("STRUCTGEN_XGRAMMAR_ANY_ORDER", "1").strip().lower() not in ("0", "false", "no", "off")


def load_xgrammar() -> tuple[Any, str | None]:
    """``(xgrammar module, None)``, or ``(None, why)`` when it cannot be imported.

    The one place XGrammar is imported (tests replace it to simulate its absence).
    """
    try:
        import xgrammar
    except ImportError as exc:
        return None, f"xgrammar is not installed ({exc})"
    except Exception as exc:
        return None, f"xgrammar cannot be imported: {type(exc).__name__}: {exc}"
    return xgrammar, None


def _eos_word(eos: int) -> tuple[int, int]:
    """(word index, int32 value) of the bitmask word that allows only ``eos``."""
    value = 1 << (eos & 31)
    return eos >> 5, value - (1 << 32) if value >= 1 << 31 else value


class XGrammarEngine:
    """XGrammar's tokenizer info and compiler for one llguidance tokenizer (thread safe)."""

    def __init__(self, xgr: Any, lltokenizer: Any):
        size = int(lltokenizer.vocab_size)
        eos = int(lltokenizer.eos_token)
        vocab = [b"" if lltokenizer.is_special_token(i) else bytes(lltokenizer.decode_bytes([i]))
                 for i in range(size)]
        self.xgr = xgr
        self.lltokenizer = lltokenizer
        self.vocab = vocab  # bytes per token (special tokens empty)
        self.vocab_size = size
        self.eos_token_id = eos
        self.words = bitmask_words(size)
        self.eos_word = _eos_word(eos)
        self.info = xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=size, stop_token_ids=[eos])
        # no XGrammar-side cache: structgen's CompileCache keeps the compiled constraints
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=max(1, min(4, os.cpu_count() or 1)),
                                            cache_enabled=False)
        self._lock = threading.Lock()
        self._abandoned = 0

    def compile_json(self, schema: Any, *, whitespace_flexible: bool,
                     timeout_s: float) -> tuple[Any | None, str | None]:
        """``(CompiledGrammar, None)`` or ``(None, why)``; never raises on a bad schema."""
        text = schema if isinstance(schema, str) else json.dumps(schema)
        with self._lock:
            if self._abandoned >= MAX_ABANDONED:
                return None, f"skipped: {self._abandoned} timed-out compiles are still running"
        box: dict[str, Any] = {}
        done = threading.Event()

        def run() -> None:
            try:
                # strict_mode=False: unlisted properties / items follow the schema (the
                # default, strict, would reject valid instances); see ANY_ORDER
                box["grammar"] = self.compiler.compile_json_schema(
                    text, any_whitespace=whitespace_flexible,
                    separators=None if whitespace_flexible else (",", ":"),
                    strict_mode=False, any_order=ANY_ORDER)
            except Exception as exc:
                box["error"] = f"{type(exc).__name__}: {_first_line(str(exc))}"
            finally:
                with self._lock:
                    if box.get("abandoned"):
                        self._abandoned -= 1
                    done.set()

        threading.Thread(target=run, name="structgen-xgrammar-compile", daemon=True).start()
        if not done.wait(timeout_s):
            with self._lock:
                if not done.is_set():
                    box["abandoned"] = True
                    self._abandoned += 1
                    return None, f"compile timed out after {timeout_s:g} s"
        if "error" in box:
            return None, str(box["error"])
        return box["grammar"], None


_LOG_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: (Check failed: \(.*?\) is false: )?")


def _first_line(message: str) -> str:
    """XGrammar's C++ messages, without the ``[time] file.cc:line: Check failed: ...`` prefix."""
    head = _LOG_PREFIX.sub("", message.strip().split("\n", 1)[0]).strip()
    return head if len(head) <= 300 else head[:297] + "..."


_engines: dict[int, tuple[Any, XGrammarEngine]] = {}  # id(lltokenizer) -> (lltokenizer, engine)
_engines_lock = threading.Lock()


def engine_for(lltokenizer: Any) -> tuple[XGrammarEngine | None, str | None]:
    """The cached :class:`XGrammarEngine` for ``lltokenizer``, or ``(None, why)``."""
    with _engines_lock:
        entry = _engines.get(id(lltokenizer))
        if entry is not None and entry[0] is lltokenizer:
            return entry[1], None
    xgr, why = load_xgrammar()
    if xgr is None:
        return None, why
    try:
        engine = XGrammarEngine(xgr, lltokenizer)
    except Exception as exc:
        return None, f"cannot build the xgrammar tokenizer: {type(exc).__name__}: {_first_line(str(exc))}"
    with _engines_lock:
        entry = _engines.setdefault(id(lltokenizer), (lltokenizer, engine))
        return entry[1], None


# --- the schema as XGrammar reads it ------------------------------------------------------
# XGrammar narrows two keywords (measured on MaskBench, xgrammar 0.2.9): it full-matches
# ``pattern`` and ``patternProperties`` keys (JSON Schema searches: ``^https?://`` admits
# "https://x"), and with ``patternProperties`` it rejects every other key even when
# ``additionalProperties`` allows it. Its copy of the schema is rewritten so its grammar
# only widens: patterns become full-match equivalents, ``patternProperties`` fold into
# ``additionalProperties`` (as the ``relaxed`` rung does). Still narrower than the schema:
# strings under a ``pattern`` cannot contain JSON escapes (XGrammar's regex sees them raw).


def _top_level_branches(pattern: str) -> list[str]:
    """``pattern`` split at its top-level ``|`` (outside groups and classes)."""
    out: list[str] = []
    depth, in_class, start, i = 0, False, 0, 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            i += 2
            continue
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "|" and depth == 0:
            out.append(pattern[start:i])
            start = i + 1
        i += 1
    out.append(pattern[start:])
    return out


def _ends_with_anchor(branch: str) -> bool:
    if not branch.endswith("$"):
        return False
    backslashes = len(branch) - 1 - len(branch[:-1].rstrip("\\"))
    return backslashes % 2 == 0


def full_match_pattern(pattern: str) -> str:
    """A regex whose *full* matches are the strings ``pattern`` *finds* a match in."""
    parts = []
    for branch in _top_level_branches(pattern):
        head, body = ("", branch[1:]) if branch.startswith("^") else (".*", branch)
        tail = ""
        if _ends_with_anchor(body):
            body = body[:-1]
        else:
            tail = ".*"
        parts.append(f"{head}(?:{body}){tail}")
    return "|".join(parts)


def _xgrammar_node(node: dict) -> dict:
    out = dict(node)
    if isinstance(out.get("pattern"), str):
        out["pattern"] = full_match_pattern(out["pattern"])
    patterns = out.pop("patternProperties", None)
    if isinstance(patterns, dict) and patterns:
        extra = out.get("additionalProperties", True)
        if extra is not True and extra != {}:
            branches = list(patterns.values()) + ([extra] if extra is not False else [])
            out["additionalProperties"] = {"anyOf": branches} if len(branches) > 1 else branches[0]
    return out


#: keywords XGrammar enforces more loosely than llguidance's lenient rung does (MaskBench:
#: ``allOf`` branches' ``const`` / ``propertyNames`` let through; ``patternProperties``
#: must be folded away, see above): schemas using them skip the xgrammar rung
SKIP_KEYWORDS = ("allOf", "patternProperties")


def _uses(schema: Any, keys: tuple[str, ...]) -> str | None:
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                if k in keys:
                    return k
                stack.append(v)
        elif isinstance(node, list):
            stack.extend(node)
    return None


def xgrammar_schema(schema: Any) -> Any:
    """``schema`` rewritten so XGrammar's grammar admits every value it admits (see above)."""
    from structgen.constraints.fallback import _walk

    return _walk(schema, _xgrammar_node)


class XGrammarTemplate:
    """A compiled XGrammar grammar and its engine: what the ladder's ``xgrammar`` rung yields."""

    def __init__(self, engine: XGrammarEngine, grammar: Any, schema: Any):
        self.engine = engine
        self.grammar = grammar
        self.schema = schema


def compile_schema(schema: Any, lltokenizer: Any, *, whitespace_flexible: bool = False,
                   timeout_s: float | None = None) -> tuple[XGrammarTemplate | None, list[str]]:
    """The ``xgrammar`` rung: ``(template, [])`` or ``(None, [why])``; never raises.
    ``STRUCTGEN_XGRAMMAR=0`` switches the rung off."""
    if os.environ.get("STRUCTGEN_XGRAMMAR", "").strip().lower() in ("0", "false", "no", "off"):
        return None, ["xgrammar is switched off (STRUCTGEN_XGRAMMAR=0)"]
    engine, why = engine_for(lltokenizer)
    if engine is None:
        return None, [why or "xgrammar is unavailable"]
    if timeout_s is None:
        try:
            timeout_s = float(os.environ.get("STRUCTGEN_XGRAMMAR_TIMEOUT", DEFAULT_TIMEOUT_S))
        except ValueError:
            timeout_s = DEFAULT_TIMEOUT_S
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    skip = _uses(schema, SKIP_KEYWORDS)
    if skip is not None:
        return None, [f"skipped: XGrammar enforces {skip} more loosely than llguidance's lenient rung"]
    grammar, why = engine.compile_json(xgrammar_schema(schema), whitespace_flexible=whitespace_flexible, timeout_s=timeout_s)
    if grammar is None:
        return None, [why or "cannot compile"]
    return XGrammarTemplate(engine, grammar, schema), []


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
        return [int(t) for t in self._engine.lltokenizer.tokenize_bytes(text)]

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
        return b"".join(self._engine.vocab[int(t)] for t in token_ids)

    def error(self) -> str | None:
        return self._error

    def fork(self) -> XGrammarMatcher:
        """An independent copy of this matcher's state (for ``fork`` / beam branches)."""
        twin = XGrammarMatcher(self._m.fork(), self._engine)
        self._copy_history_to(twin)
        return twin


class XGrammarCompiled(CompiledConstraint):
    """A schema compiled by XGrammar for one tokenizer. Never exact: final validation guards it."""

    rung = XGRAMMAR_RUNG

    def __init__(self, spec: ConstraintSpec, template: XGrammarTemplate, *, warnings: Sequence[str] = ()):
        self.spec = spec
        self.exact = False
        self.warnings: tuple[str, ...] = tuple(warnings)
        self.schema = template.schema
        self._template = template
        self._lock = threading.Lock()

    def matcher(self) -> XGrammarMatcher:
        engine = self._template.engine
        with self._lock:
            inner = engine.xgr.GrammarMatcher(self._template.grammar, override_stop_tokens=[engine.eos_token_id])
        return XGrammarMatcher(inner, engine)

    def __repr__(self) -> str:
        return f"XGrammarCompiled({self.spec.describe()}, exact=False)"
