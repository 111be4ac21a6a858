"""The grammar constraint kind: the output must be a sentence of a Lark grammar (llguidance's dialect).

Grammars are enforced while decoding; final validation reports a cut-off output only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from structgen.constraints.kind import ConstraintKind, ConstraintSpec, output_failed, register_kind
from structgen.errors import ConstraintError

__all__ = ["GrammarSpec", "grammar_spec"]


@dataclass(frozen=True)
class GrammarSpec(ConstraintSpec):
    """The output must match a Lark-syntax grammar (llguidance's dialect)."""

    grammar: str
    kind: Literal["grammar"] = "grammar"

    def describe(self) -> str:
        return f"grammar {self.grammar[:80]!r}"


def grammar_spec(grammar: str) -> GrammarSpec:
    """Build a :class:`GrammarSpec` from a Lark grammar (llguidance's dialect), checked at
    once: a malformed grammar raises :class:`ConstraintError` before anything runs."""
    if not isinstance(grammar, str) or not grammar.strip():
        raise ConstraintError(f"grammar must be a non-empty Lark grammar string, not {grammar!r}")
    import llguidance  # a base dependency, imported only when a grammar is built

    try:
        problem = llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_lark(grammar))
    except Exception as exc:
        raise ConstraintError(f"malformed grammar: {exc}", constraint=grammar) from exc
    if problem:
        raise ConstraintError(f"malformed grammar: {problem.strip()}", constraint=grammar)
    return GrammarSpec(grammar)


def validate_grammar(spec: GrammarSpec, text: str, truncated: bool) -> str:
    if truncated:
        output_failed(text, truncated, "output does not complete the grammar", ["the grammar may not be complete"])
    return text


GRAMMAR = register_kind(ConstraintKind(name="grammar", spec_type=GrammarSpec, feature="grammar",
                                       description="grammar constraints", validate=validate_grammar))
