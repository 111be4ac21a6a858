"""The grammar constraint kind: the output must be a sentence of a Lark grammar (llguidance's dialect).

Grammars are enforced while decoding; final validation reports a cut-off output only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from structgen.constraints.kind import ConstraintKind, ConstraintSpec, output_failed, register_kind

__all__ = ["GrammarSpec"]


@dataclass(frozen=True)
class GrammarSpec(ConstraintSpec):
    """The output must match a Lark-syntax grammar (llguidance's dialect)."""

    grammar: str
    kind: Literal["grammar"] = "grammar"

    def describe(self) -> str:
        return f"grammar {self.grammar[:80]!r}"


def validate_grammar(spec: GrammarSpec, text: str, truncated: bool) -> str:
    if truncated:
        output_failed(text, truncated, "output does not complete the grammar", ["the grammar may not be complete"])
    return text


GRAMMAR = register_kind(ConstraintKind(name="grammar", spec_type=GrammarSpec, feature="grammar",
                                       description="grammar constraints", validate=validate_grammar))
