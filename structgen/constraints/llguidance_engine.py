"""The llguidance constraint engine: specs compiled for a Hugging Face tokenizer.

Usage (what the embedded backend does each decoding step)::

    from structgen.constraints.compiler import compiler_for
    from structgen.constraints.bitmask import allocate_token_bitmask, apply_token_bitmask_inplace

    compiler = compiler_for(hf_tokenizer)          # one shared, cached compiler per tokenizer
    compiled = compiler.compile(spec)              # ConstraintError here if spec is malformed
    matcher = compiled.matcher()                   # fresh state, one per sequence
    bitmask = allocate_token_bitmask(batch, compiler.vocab_size)   # CPU int32 [batch, words]
    while not matcher.is_stopped():
        matcher.fill_bitmask(bitmask, row)         # allowed next tokens (EOS iff accepting)
        apply_token_bitmask_inplace(logits, bitmask)   # disallowed logits -> -inf
        token = sample(logits)
        if not matcher.consume(token):             # False: error state, see matcher.error()
            break
        if token == compiler.eos_token_id:
            break

Translation: :class:`RegexSpec` -> llguidance regex (``\\w \\W \\s \\S`` rewritten to Python
``re``'s Unicode meaning, so generated text always passes ``re.fullmatch``);
:class:`JsonSchemaSpec` -> llguidance JSON grammar, compact (no whitespace between
tokens) unless ``whitespace="flexible"``; :class:`ChoiceSpec` -> an alternation of string
literals; :class:`GrammarSpec` -> Lark (llguidance's dialect).

A JSON schema is meta-checked, normalised and compiled through the fallback ladder of
:func:`structgen.constraints.fallback.schema_grammar`: keywords llguidance cannot enforce
(``uniqueItems``, unknown ``format`` s, lookaround ``pattern`` s) give a looser grammar
with ``exact = False`` and the reasons in ``warnings``; final validation
(:mod:`structgen.constraints.validation`) then guards the result.

Error contract: ``compile`` raises :class:`ConstraintError` for malformed specs. A matcher
never raises on a bad token: :meth:`LLGuidanceMatcher.consume` returns ``False`` and the
matcher stays in its error state (``error()`` says why; ``rollback`` does not clear it).
Misuse (a wrong bitmask, rolling back more tokens than consumed) raises
``ValueError`` / ``TypeError`` / ``IndexError``.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import llguidance
import llguidance.hf
import numpy as np

from structgen.constraints.base import CompiledConstraint, ConstraintCompiler, Matcher
from structgen.constraints.bitmask import bitmask_words, row_pointer
from structgen.constraints.fallback import schema_grammar
from structgen.constraints.schema import prepare_schema, scan_checked
from structgen.constraints.spec import (
    ChoiceSpec,
    ConstraintSpec,
    GrammarSpec,
    JsonSchemaSpec,
    RegexSpec,
)
from structgen.constraints.xgrammar_engine import XGRAMMAR_RUNG, XGrammarCompiled
from structgen.errors import ConstraintError

__all__ = ["LLGuidanceCompiled", "LLGuidanceCompiler", "LLGuidanceMatcher", "python_regex_to_rust", "to_grammar"]


def _first_line(message: str) -> str:
    """llguidance errors carry a parser-state dump after the first line; keep the reason."""
    head = message.split("\n<state>", 1)[0].strip()
    return head if len(head) <= 500 else head[:497] + "..."


# --- spec -> llguidance grammar -------------------------------------------------------

_PY_CLASSES = {
    # Python `re` (str patterns): \w is str.isalnum() or "_" -- letters and numbers, no
    # combining marks (Rust's \w has marks); \s is str.isspace() -- includes \x1c-\x1f.
    "w": r"[\p{L}\p{N}_]",
    "W": r"[^\p{L}\p{N}_]",
    "s": r"[\s\x1c-\x1f]",
    "S": r"[^\s\x1c-\x1f]",
}


def python_regex_to_rust(pattern: str) -> str:
    """Rewrite ``\\w \\W \\s \\S`` (outside and inside classes) to Python's Unicode meaning.

    Rust's regex syntax accepts nested classes, so ``[\\w-]`` becomes ``[[\\p{L}\\p{N}_]-]``.
    """
    out: list[str] = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            out.append(_PY_CLASSES.get(nxt, ch + nxt))
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def _regex_grammar(pattern: str) -> str:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ConstraintError(f"malformed regex: {exc}", constraint=pattern) from exc
    return str(llguidance.LLMatcher.grammar_from_regex(python_regex_to_rust(pattern)))


def _json_grammar(spec: JsonSchemaSpec, *, lenient: bool) -> str:
    try:
        schema = json.loads(spec.schema)
    except ValueError as exc:
        raise ConstraintError(f"json_schema is not valid JSON: {exc}", constraint=spec.schema) from exc
    schema = prepare_schema(schema)  # the one place schemas are checked and normalised
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    options = {"whitespace_flexible": spec.whitespace == "flexible", "lenient": lenient}
    try:
        return str(llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=options))  # type: ignore[arg-type]
    except ValueError as exc:
        raise ConstraintError(f"cannot compile JSON schema: {exc}", constraint=spec.schema) from exc


def _choice_grammar(choices: Sequence[str]) -> str:
    if not choices:
        raise ConstraintError("choices must not be empty")
    for c in choices:
        if not isinstance(c, str):
            raise ConstraintError(f"choices must be strings, not {type(c).__name__}",
                                  constraint=repr(list(choices)))
    if any(c == "" for c in choices):
        # Lark has no empty literal; an optional alternation of the others is the same language.
        rest = [c for c in dict.fromkeys(choices) if c]
        if not rest:
            return str(llguidance.LLMatcher.grammar_from_regex(""))
        return str(llguidance.LLMatcher.grammar_from_lark(
            "start: (" + " | ".join(json.dumps(c) for c in rest) + ")?"))
    return str(llguidance.LLMatcher.grammar_from_lark(
        "start: " + " | ".join(json.dumps(c) for c in dict.fromkeys(choices))))


def to_grammar(spec: ConstraintSpec, *, lenient: bool = False) -> str:
    """The llguidance grammar (JSON text) for ``spec``; not yet validated against a tokenizer."""
    if isinstance(spec, RegexSpec):
        return _regex_grammar(spec.pattern)
    if isinstance(spec, JsonSchemaSpec):
        return _json_grammar(spec, lenient=lenient)
    if isinstance(spec, ChoiceSpec):
        return _choice_grammar(spec.choices)
    if isinstance(spec, GrammarSpec):
        if not isinstance(spec.grammar, str) or not spec.grammar.strip():
            raise ConstraintError("grammar must be a non-empty Lark string")
        return str(llguidance.LLMatcher.grammar_from_lark(spec.grammar))
    raise ConstraintError(f"unknown constraint spec {type(spec).__name__}")


# --- compiled constraint and matcher ---------------------------------------------------


@dataclass(frozen=True)
class _Vocab:
    tokenizer: Any  # llguidance.LLTokenizer
    size: int
    eos_token_id: int
    words: int


def _base_address(bitmask: Any) -> int:
    """The buffer address of a numpy array (fixed while referenced) or torch tensor."""
    if isinstance(bitmask, np.ndarray):
        return 0  # a referenced ndarray cannot be resized in place: its address is fixed
    return int(bitmask.data_ptr())


class LLGuidanceMatcher(Matcher):
    """Per-sequence state over an ``llguidance.LLMatcher``. Not thread safe (one per sequence)."""

    def __init__(self, inner: Any, vocab: _Vocab):
        self._m = inner
        self._vocab = vocab
        self._start_history()  # consumed tokens and error state (see Matcher)
        self._last_row: tuple[Any, int, int, int, int] | None = None

    # -- masks
    def fill_bitmask(self, bitmask: Any, index: int = 0) -> None:
        # Decoding loops pass the same bitmask every step: reuse the checked row address
        # while the array is the same object at the same base address (a numpy array we
        # hold cannot be resized; a torch tensor's base address is re-read each time).
        last = self._last_row
        if last is not None and last[0] is bitmask and last[1] == index and last[2] == _base_address(bitmask):
            self._m.unsafe_compute_mask_ptr(last[3], last[4])
            return
        address, size = row_pointer(bitmask, index, self._vocab.words)
        self._last_row = (bitmask, index, _base_address(bitmask), address, size)
        self._m.unsafe_compute_mask_ptr(address, size)

    def validate_tokens(self, token_ids: Sequence[int]) -> int:
        """How many of ``token_ids`` would be accepted in order, without changing state."""
        if self.error() is not None:
            return 0
        ids: list[int] = []
        for t in token_ids:
            if not 0 <= int(t) < self._vocab.size:
                break
            ids.append(int(t))
        return int(self._m.validate_tokens(ids))

    # -- state changes
    def consume(self, token_id: int) -> bool:
        if self._error is not None:
            return False
        token_id = int(token_id)
        if not 0 <= token_id < self._vocab.size:
            self._error = f"token id {token_id} is outside the vocabulary (size {self._vocab.size})"
            return False
        virtual = token_id == self._vocab.eos_token_id and self._m.is_stopped() and not self._m.is_error()
        if not self._m.consume_token(token_id):
            self._error = _first_line(self._m.get_error()) or f"token {token_id} not allowed"
            return False
        self._history.append(virtual)
        return True

    def rollback(self, n: int) -> None:
        real = self._unwind(n)
        if real and not self._m.rollback(real):
            self._error = _first_line(self._m.get_error()) or "rollback failed"

    # -- queries
    def is_accepting(self) -> bool:
        return self._error is None and bool(self._m.is_accepting())

    def is_stopped(self) -> bool:
        return self._error is not None or bool(self._m.is_stopped())

    def forced_tokens(self) -> list[int]:
        if self.is_stopped():
            return []
        return [int(t) for t in self._m.compute_ff_tokens()]

    def tokenize_bytes(self, text: bytes) -> list[int]:
        return [int(t) for t in self._vocab.tokenizer.tokenize_bytes(text)]

    def token_bytes(self, token_ids: Sequence[int]) -> bytes:
        return bytes(self._vocab.tokenizer.decode_bytes([int(t) for t in token_ids]))

    def forced_text(self) -> bytes:
        """The bytes every continuation starts with (may end mid-token)."""
        return b"" if self.is_stopped() else bytes(self._m.compute_ff_bytes())

    def error(self) -> str | None:
        if self._error is None and self._m.is_error():
            self._error = _first_line(self._m.get_error())
        return self._error

    def fork(self) -> LLGuidanceMatcher:
        """An independent copy of this matcher's state (for ``fork`` / beam branches)."""
        twin = LLGuidanceMatcher(self._m.deep_copy(), self._vocab)
        self._copy_history_to(twin)
        return twin


class LLGuidanceCompiled(CompiledConstraint):
    """A validated llguidance grammar for one tokenizer. Immutable, shareable across threads."""

    def __init__(self, spec: ConstraintSpec, grammar: str, template: Any, vocab: _Vocab,
                 *, exact: bool = True, warnings: Sequence[str] = ()):
        self.spec = spec
        self.grammar = grammar
        self.exact = exact
        self.warnings: tuple[str, ...] = tuple(warnings)
        self._template = template
        self._vocab = vocab
        self._lock = threading.Lock()

    def matcher(self) -> LLGuidanceMatcher:
        with self._lock:  # deep_copy of a shared PyO3 object: keep borrows serial
            inner = self._template.deep_copy()
        return LLGuidanceMatcher(inner, self._vocab)

    def __repr__(self) -> str:
        return f"LLGuidanceCompiled({self.spec.describe()}, exact={self.exact})"


class LLGuidanceCompiler(ConstraintCompiler):
    """Compiles specs with llguidance for one Hugging Face *fast* tokenizer.

    Building the llguidance tokenizer takes ~1 s, so make one compiler per tokenizer and
    share it -- :func:`structgen.constraints.compiler.compiler_for` does that and adds the
    compile cache. This class itself does not cache.
    """

    def __init__(self, tokenizer: Any, *, n_vocab: int | None = None, eos_token_id: int | None = None):
        try:
            lltok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=n_vocab, eos_token=eos_token_id)
        except (ValueError, TypeError, RuntimeError) as exc:
            raise ConstraintError(f"cannot build an llguidance tokenizer: {exc}") from exc
        size = int(lltok.vocab_size)
        self.hf_tokenizer = tokenizer
        self._vocab = _Vocab(lltok, size, int(lltok.eos_token), bitmask_words(size))

    @property
    def vocab_size(self) -> int:
        """Tokens covered by a bitmask row (bitmask words = ``ceil(vocab_size / 32)``)."""
        return self._vocab.size

    @property
    def eos_token_id(self) -> int:
        return self._vocab.eos_token_id

    @property
    def llguidance_tokenizer(self) -> Any:
        return self._vocab.tokenizer

    def compile(self, spec: ConstraintSpec) -> LLGuidanceCompiled | XGrammarCompiled:
        if isinstance(spec, JsonSchemaSpec):
            return self._compile_json(spec)
        grammar = to_grammar(spec)
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self._vocab.tokenizer)
        if is_error:
            reason = _first_line(messages[0]) if messages else "unknown error"
            raise ConstraintError(f"cannot compile {spec.kind} constraint: {reason}",
                                  constraint=spec.describe())
        template = llguidance.LLMatcher(self._vocab.tokenizer, grammar, log_level=0)
        if template.is_error():
            raise ConstraintError(
                f"cannot compile {spec.kind} constraint: {_first_line(template.get_error())}",
                constraint=spec.describe())
        return LLGuidanceCompiled(spec, grammar, template, self._vocab,
                                  warnings=[_first_line(m) for m in messages])

    def _compile_json(self, spec: JsonSchemaSpec) -> LLGuidanceCompiled | XGrammarCompiled:
        """Normalise, then the strictest grammar the engine builds (see
        :mod:`structgen.constraints.fallback`): looser rungs (``exact=False``) still admit
        every valid value, and final validation guards the result."""
        try:
            schema = json.loads(spec.schema)
        except ValueError as exc:
            raise ConstraintError(f"json_schema is not valid JSON: {exc}", constraint=spec.schema) from exc
        scan = scan_checked(schema)
        built = schema_grammar(schema, self._vocab.tokenizer, whitespace_flexible=spec.whitespace == "flexible",
                               plain=scan.plain, text=spec.schema)
        if built.rung == XGRAMMAR_RUNG:  # the second engine compiled it (never exact)
            return XGrammarCompiled(spec, built.matcher, warnings=built.warnings)
        return LLGuidanceCompiled(spec, built.grammar, built.matcher, self._vocab, exact=built.exact,
                                  warnings=built.warnings)
