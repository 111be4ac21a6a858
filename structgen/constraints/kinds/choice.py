"""The choice constraint kind: the output must be exactly one of a set of strings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from structgen.constraints.kind import ConstraintKind, ConstraintSpec, output_failed, register_kind

__all__ = ["ChoiceSpec"]


@dataclass(frozen=True)
class ChoiceSpec(ConstraintSpec):
    """The output must be exactly one of ``choices``."""

    choices: tuple[str, ...]
    kind: Literal["choice"] = "choice"

    def describe(self) -> str:
        return f"choices {list(self.choices)!r}"


def validate_choice(spec: ChoiceSpec, text: str, truncated: bool) -> str:
    if text not in spec.choices:
        output_failed(text, truncated, "output is not one of the choices", [f"expected one of {list(spec.choices)!r}"])
    return text


CHOICE = register_kind(ConstraintKind(name="choice", spec_type=ChoiceSpec, feature="choices",
                                      description="choice constraints", validate=validate_choice))
