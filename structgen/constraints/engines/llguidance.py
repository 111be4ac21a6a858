"""llguidance as a constraint engine: specs and JSON schemas compiled for a Hugging Face tokenizer.

Usage (what the embedded backend does each decoding step, through the ladder's cached
compiler)::

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

Translation, one function per spec kind (:data:`GRAMMARS`): :class:`RegexSpec` ->
llguidance regex (``\\w \\W \\s \\S`` rewritten to Python ``re``'s Unicode meaning, so
generated text always passes ``re.fullmatch``); :class:`ChoiceSpec` -> an alternation of
string literals; :class:`GrammarSpec` -> Lark (llguidance's dialect). A JSON schema
(:meth:`LLGuidanceEngine.compile_schema`) -> llguidance's JSON grammar, compact (no
whitespace between tokens) unless ``whitespace_flexible``, with the JSON options of
:data:`JSON_OPTIONS`; the ladder (:mod:`structgen.constraints.ladder`) decides which
schema and options to try.

Error contract: compiling raises :class:`ConstraintError` for malformed specs and
:class:`~structgen.constraints.base.EngineRefusal` for a schema llguidance cannot
compile. A matcher never raises on a bad token: :meth:`LLGuidanceMatcher.consume`
returns ``False`` and the matcher stays in its error state (``error()`` says why;
``rollback`` does not clear it). Misuse (a wrong bitmask, rolling back more tokens than
consumed) raises ``ValueError`` / ``TypeError`` / ``IndexError``.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import llguidance
import numpy as np

from structgen.constraints.base import CompiledConstraint, Engine, EngineRefusal, Matcher, TokenTable
from structgen.constraints.bitmask import bitmask_words, row_pointer
from structgen.constraints.engines.deadline import MAX_ABANDONED, Abandonable
from structgen.constraints.engines.hf_tokenizer import llguidance_json
from structgen.constraints.kind import Translations
from structgen.constraints.spec import (
    ChoiceSpec,
    ConstraintSpec,
    GrammarSpec,
    JsonSchemaSpec,
    RegexSpec,
)
from structgen.constraints.text_matcher import python_regex_to_rust
from structgen.errors import ConstraintError

__all__ = [
    "GRAMMARS",
    "JSON_OPTIONS",
    "LLGuidanceCompiled",
    "LLGuidanceEngine",
    "LLGuidanceMatcher",
    "llguidance_tokenizer",
    "python_regex_to_rust",
    "to_grammar",
]

#: llguidance's JSON compile options :meth:`LLGuidanceEngine.compile_schema` reads
#: (``coerce_one_of``: read ``oneOf`` as ``anyOf``; ``lenient``: ignore unimplemented
#: keywords and unknown formats); it also reads ``timeout_s`` (seconds, or ``None``)
JSON_OPTIONS = ("whitespace_flexible", "coerce_one_of", "lenient")
#: how llguidance words a schema no value satisfies
_UNSATISFIABLE = "Unsatisfiable schema"


def _first_line(message: str, limit: int = 500) -> str:
    """llguidance errors carry a parser-state dump after the first line; keep the reason."""
    head = message.split("\n<state>", 1)[0].strip()
    return head if len(head) <= limit else head[:limit - 3] + "..."


# --- spec -> llguidance grammar -------------------------------------------------------

def regex_grammar(spec: RegexSpec) -> str:
    """A regex constraint as an llguidance grammar (Python ``re`` classes kept)."""
    pattern = spec.pattern
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ConstraintError(f"malformed regex: {exc}", constraint=pattern) from exc
    except (OverflowError, RecursionError) as exc:
        raise ConstraintError(f"regex cannot be compiled: {type(exc).__name__}", constraint=pattern) from None
    return str(llguidance.LLMatcher.grammar_from_regex(python_regex_to_rust(pattern)))


def choice_grammar(spec: ChoiceSpec) -> str:
    """A choice constraint as an alternation of string literals."""
    choices = spec.choices
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


def lark_grammar(spec: GrammarSpec) -> str:
    """A Lark grammar constraint, as llguidance reads it."""
    if not isinstance(spec.grammar, str) or not spec.grammar.strip():
        raise ConstraintError("grammar must be a non-empty Lark string")
    return str(llguidance.LLMatcher.grammar_from_lark(spec.grammar))


def _no_translation(spec: ConstraintSpec, ctx: Any, what: str) -> ConstraintError:
    return ConstraintError(f"no {what} for {getattr(spec, 'kind', type(spec).__name__)} "
                           "constraints (JSON schemas are compiled through the ladder)")


#: spec kind -> its translation into an llguidance grammar (JSON schemas go through
#: :meth:`LLGuidanceEngine.compile_schema`, called by the ladder). A new constraint kind
#: registers here (``@GRAMMARS.register(MySpec)``; see :mod:`structgen.constraints.kind`).
GRAMMARS: Translations[str] = Translations("llguidance translation", missing=_no_translation)
GRAMMARS.register(RegexSpec)(lambda spec, _ctx: regex_grammar(spec))
GRAMMARS.register(ChoiceSpec)(lambda spec, _ctx: choice_grammar(spec))
GRAMMARS.register(GrammarSpec)(lambda spec, _ctx: lark_grammar(spec))


def to_grammar(spec: ConstraintSpec) -> str:
    """The llguidance grammar (JSON text) for a regex, choice or Lark ``spec``; not yet
    validated against a tokenizer."""
    return GRAMMARS(spec)


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


def llguidance_tokenizer(tokenizer: Any, *, n_vocab: int | None = None, eos_token_id: int | None = None) -> Any:
    """An ``llguidance.LLTokenizer`` for a Hugging Face fast tokenizer: what
    ``llguidance.hf.from_tokenizer`` makes, but reading the tokenizer's JSON through
    :func:`~structgen.constraints.engines.hf_tokenizer.llguidance_json` (a byte-level BPE
    written with byte-fallback parts would otherwise get wrong token bytes)."""
    if not hasattr(tokenizer, "backend_tokenizer"):
        raise ValueError(f"only fast (Rust-backed) tokenizers are supported, not {type(tokenizer).__name__}")
    eos = tokenizer.eos_token_id if eos_token_id is None else eos_token_id
    return llguidance.LLTokenizer(llguidance_json(tokenizer), n_vocab=n_vocab, eos_token=eos)


class LLGuidanceEngine(Engine):
    """llguidance for one Hugging Face *fast* tokenizer (:class:`~structgen.constraints.base.Engine`).

    Building the llguidance tokenizer is slow, so make one engine per tokenizer and share
    it -- :func:`structgen.constraints.compiler.compiler_for` does that and adds the ladder
    and the compile cache. This class itself does not cache.
    """

    name = "llguidance"

    def __init__(self, tokenizer: Any, *, n_vocab: int | None = None, eos_token_id: int | None = None):
        try:
            lltok = llguidance_tokenizer(tokenizer, n_vocab=n_vocab, eos_token_id=eos_token_id)
        except (ValueError, TypeError, RuntimeError, AttributeError) as exc:
            raise ConstraintError(f"cannot build an llguidance tokenizer: {exc}") from exc
        size = int(lltok.vocab_size)
        self.hf_tokenizer = tokenizer
        self._vocab = _Vocab(lltok, size, int(lltok.eos_token), bitmask_words(size))
        self._table: TokenTable | None = None
        self._table_lock = threading.Lock()
        self._runner = Abandonable(self.name, MAX_ABANDONED)

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

    def token_table(self) -> TokenTable:
        """This vocabulary for other engines: the bytes of each token (special tokens
        empty), EOS, llguidance's tokenization. Built on first use."""
        with self._table_lock:
            if self._table is None:
                lltok = self._vocab.tokenizer
                tokens = [b"" if lltok.is_special_token(i) else bytes(lltok.decode_bytes([i]))
                          for i in range(self._vocab.size)]
                self._table = TokenTable(tokens, self._vocab.eos_token_id,
                                         lambda text: [int(t) for t in lltok.tokenize_bytes(text)])
            return self._table

    def compile_spec(self, spec: ConstraintSpec) -> LLGuidanceCompiled:
        """A regex, choice or Lark spec; :class:`ConstraintError` if malformed."""
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

    def compile_schema(self, spec: JsonSchemaSpec, schema: Any,
                       options: Mapping[str, Any]) -> LLGuidanceCompiled:
        """``schema`` (a dict, or its JSON text) compiled with llguidance's JSON options
        (:data:`JSON_OPTIONS`); :class:`EngineRefusal` when llguidance cannot. With a
        ``timeout_s`` option the compile runs on its own thread and is abandoned when
        it takes longer (:mod:`~structgen.constraints.engines.deadline`)."""
        overrides = {k: bool(options[k]) for k in JSON_OPTIONS if k in options}
        timeout = options.get("timeout_s")
        if timeout is None:
            grammar, template = self._build(schema, overrides)
        else:
            grammar, template = self._runner.run(lambda: self._build(schema, overrides), float(timeout))
        return LLGuidanceCompiled(spec, grammar, template, self._vocab,
                                  warnings=[_first_line(m) for m in template.get_grammar_warnings()])

    def _build(self, schema: Any, overrides: dict[str, bool]) -> tuple[str, Any]:
        try:
            grammar = str(llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=overrides))  # type: ignore[arg-type]
        except (ValueError, TypeError, RuntimeError) as exc:
            raise _refusal(str(exc)) from None
        # building the matcher validates the grammar: one compile, not two
        template = llguidance.LLMatcher(self._vocab.tokenizer, grammar, log_level=0)
        if template.is_error():
            raise _refusal(template.get_error() or "unknown error")
        return grammar, template


def _refusal(message: str) -> EngineRefusal:
    reason = _first_line(message, 300)
    return EngineRefusal(reason, unsatisfiable=reason.startswith(_UNSATISFIABLE))
