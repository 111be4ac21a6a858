"""The constraint engine's contract: spec -> compile (cached) -> matcher -> mask.

Stages (after XGrammar / LLGuidance):

1. :mod:`structgen.constraints.spec` -- frozen specs (regex, JSON schema, choices, grammar).
2. :meth:`ConstraintCompiler.compile` -- compiles a spec for one tokenizer; results are
   cached by ``(spec, tokenizer fingerprint)``. A malformed spec raises
   :class:`~structgen.errors.ConstraintError` here, before any token is generated.
3. :meth:`CompiledConstraint.matcher` -- a fresh, stateful :class:`Matcher` per sequence.
4. :meth:`Matcher.fill_bitmask` -- writes the allowed-token bitmask for the next step.

Each engine (:mod:`structgen.constraints.engines`) implements :class:`Engine`: a spec or
a JSON schema -> a :class:`CompiledConstraint` -> a :class:`Matcher`, or
:class:`EngineRefusal` when it cannot compile it; the ladder
(:mod:`structgen.constraints.ladder`) composes engines into the one
:class:`ConstraintCompiler`. Engines share one vocabulary (:class:`TokenTable`) and one
bitmask layout.

Error contract (written down, as LLGuidance does): a matcher never raises on a bad
token. :meth:`Matcher.consume` returns ``False`` and the matcher enters an error state
(:meth:`Matcher.error` says why); it raises only on API misuse.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from structgen.constraints.spec import ConstraintSpec, JsonSchemaSpec
from structgen.errors import ConstraintError

__all__ = ["CompiledConstraint", "ConstraintCompiler", "Engine", "EngineRefusal", "Matcher", "TokenTable"]


class Matcher(ABC):
    """Per-sequence constraint state over token ids.

    Engine matchers share the consumed-token bookkeeping below: ``_history`` holds one
    flag per consumed token, True for an EOS the engine itself never saw (EOS accepted
    after the grammar stopped), which rollback skips; ``_error`` is the error state.
    """

    _history: list[bool]
    _error: str | None

    def _start_history(self) -> None:
        self._history = []
        self._error = None

    def _unwind(self, n: int) -> int:
        """Drop the last ``n`` consumed tokens from the history; how many of them the
        engine saw (what it must roll back). ``ValueError`` if fewer were consumed."""
        if n < 0 or n > len(self._history):
            raise ValueError(f"cannot roll back {n} tokens; {len(self._history)} consumed")
        real = 0
        for _ in range(n):
            if not self._history.pop():
                real += 1
        return real

    def _copy_history_to(self, twin: Matcher) -> None:
        twin._history = list(self._history)
        twin._error = self._error

    @property
    def num_consumed(self) -> int:
        return len(self._history)

    def reset(self) -> None:
        """Back to the start of the output (clears nothing if in the error state)."""
        self.rollback(len(self._history))

    @abstractmethod
    def fill_bitmask(self, bitmask: Any, index: int = 0) -> None:
        """Write the allowed next tokens into row ``index`` of an int32 bitmask
        (shape ``[batch, ceil(vocab/32)]``, bit ``t % 32`` of word ``t // 32`` = token ``t``)."""

    @abstractmethod
    def consume(self, token_id: int) -> bool:
        """Advance by one token. ``False`` (and error state) if the token was not allowed."""

    def consume_many(self, token_ids: Sequence[int]) -> bool:
        return all(self.consume(t) for t in token_ids)

    @abstractmethod
    def is_accepting(self) -> bool:
        """The text so far is a complete match: the sequence may end here (EOS allowed)."""

    @abstractmethod
    def is_stopped(self) -> bool:
        """No further token can be accepted: the sequence must end now."""

    @abstractmethod
    def forced_tokens(self) -> list[int]:
        """Tokens that are the only possible continuation (for jump-forward decoding)."""

    def forced_text(self) -> bytes:
        """The bytes every continuation starts with, beyond :meth:`forced_tokens`
        (which an engine keeps to whole tokens that cannot merge with what follows).
        Default: none known."""
        return b""

    def draft_tokens(self, prefer: Sequence[int] | None = None) -> list[int]:
        """A likely tokenization of :meth:`forced_text`, to verify rather than force:
        ``prefer`` (e.g. how the model tokenized the same text before) if it spells that
        text and the constraint allows it, else :meth:`tokenize_bytes`; only the prefix
        the constraint allows. The decoder computes them speculatively and keeps those
        it would have chosen itself."""
        rest = self.forced_text()
        if not rest:
            return []
        if prefer:
            ids = [int(t) for t in prefer]
            if self.token_bytes(ids) == rest and self.validate_tokens(ids) == len(ids):
                return ids
        ids = self.tokenize_bytes(rest)
        return ids[:self.validate_tokens(ids)]

    def validate_tokens(self, token_ids: Sequence[int]) -> int:
        """How many of ``token_ids`` would be accepted in order, without changing state."""
        raise NotImplementedError

    def tokenize_bytes(self, text: bytes) -> list[int]:
        """The canonical tokens of ``text``."""
        raise NotImplementedError

    def token_bytes(self, token_ids: Sequence[int]) -> bytes:
        """The bytes of ``token_ids`` (for matching them against :meth:`forced_text`)."""
        raise NotImplementedError

    @abstractmethod
    def rollback(self, n: int) -> None:
        """Undo the last ``n`` consumed tokens."""

    @abstractmethod
    def error(self) -> str | None:
        """Why the matcher is in its error state, or ``None``."""


class CompiledConstraint(ABC):
    """A spec compiled for one tokenizer. Immutable and shareable across threads."""

    spec: ConstraintSpec
    #: False when the spec could not be enforced exactly at the token level and a looser
    #: grammar is enforced instead (the final validation then guards the result).
    exact: bool = True
    #: the ladder rung that compiled it (``"exact"`` for anything not from a ladder)
    rung: str = "exact"
    #: why earlier rungs failed, what normalisation widened, engine warnings
    warnings: tuple[str, ...] = ()

    @abstractmethod
    def matcher(self) -> Matcher:
        """A fresh matcher at the start of the output."""

    def label(self, *, exact: bool, rung: str, warnings: Sequence[str]) -> CompiledConstraint:
        """Record how faithfully this enforces its spec (the ladder does, before the
        object is shared). Returns ``self``."""
        self.exact = exact
        self.rung = rung
        self.warnings = tuple(warnings)
        return self


class ConstraintCompiler(ABC):
    """Compiles specs for a tokenizer, caching by ``(spec, tokenizer)``."""

    @abstractmethod
    def compile(self, spec: ConstraintSpec) -> CompiledConstraint:
        """Compile ``spec``; raise :class:`~structgen.errors.ConstraintError` if malformed."""


class EngineRefusal(ConstraintError):
    """An engine cannot compile what it was given (a ladder then tries its next rung).

    ``unsatisfiable``: the engine found that no value satisfies the schema it was given;
    ``timed_out``: the compile ran past its deadline and was abandoned.
    """

    def __init__(self, reason: str, *, unsatisfiable: bool = False, timed_out: bool = False,
                 constraint: str | None = None):
        super().__init__(reason, constraint=constraint)
        self.reason = reason
        self.unsatisfiable = unsatisfiable
        self.timed_out = timed_out


@dataclass(frozen=True)
class TokenTable:
    """One vocabulary as every engine sees it: the bytes of each token id (special tokens
    empty: never text), the EOS id, and the canonical tokenization of bytes."""

    tokens: Sequence[bytes]
    eos_token_id: int
    tokenize: Callable[[bytes], list[int]]

    @property
    def size(self) -> int:
        return len(self.tokens)


class Engine(ABC):
    """A constraint engine for one vocabulary: a spec or a JSON schema -> a
    :class:`CompiledConstraint` -> a :class:`Matcher`.

    Engines know nothing of each other; :mod:`structgen.constraints.ladder` composes them.
    """

    #: the engine's name in notes and warnings
    name: ClassVar[str]

    @abstractmethod
    def compile_schema(self, spec: JsonSchemaSpec, schema: Any,
                       options: Mapping[str, Any]) -> CompiledConstraint:
        """Compile ``schema`` (a prepared JSON schema, or its text) for ``spec``.

        ``options`` are the engine's own (its module lists them). Raises
        :class:`EngineRefusal` when it cannot; never another exception for a bad schema.
        """

    def compile_spec(self, spec: ConstraintSpec) -> CompiledConstraint:
        """Compile a spec of another kind; raises :class:`EngineRefusal` for kinds the
        engine does not compile, :class:`ConstraintError` for a malformed spec."""
        raise EngineRefusal(f"{self.name} does not compile {spec.kind} constraints")
