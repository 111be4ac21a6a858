"""Constraints: specs (data), the compile/matcher contract, and the llguidance engine."""

from structgen.constraints.spec import (
    ChoiceSpec,
    ConstraintSpec,
    GrammarSpec,
    JsonSchemaSpec,
    RegexSpec,
    dtype_spec,
    json_schema_spec,
    regex_spec,
)

__all__ = [
    "ChoiceSpec",
    "ConstraintSpec",
    "GrammarSpec",
    "JsonSchemaSpec",
    "RegexSpec",
    "dtype_spec",
    "json_schema_spec",
    "regex_spec",
]
