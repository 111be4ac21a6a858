"""Constraint specifications: frozen, engine-independent data.

A spec says *what* the output must look like. It is part of the IR and knows no engine;
compiling it against a tokenizer is the constraint engines' job, translating it into a
server's request is each backend adapter's job -- both through
:class:`~structgen.constraints.kind.Translations` tables keyed by spec class.

This module is the stable import path of the built-in kinds (each defined in its own
module under :mod:`structgen.constraints.kinds`) and of :class:`ConstraintSpec`, the base
every spec class derives from.
"""

from __future__ import annotations

from structgen.constraints.kind import ConstraintSpec
from structgen.constraints.kinds import (
    REGEX_BOOL,
    REGEX_FLOAT,
    REGEX_INT,
    REGEX_STR,
    ChoiceSpec,
    GrammarSpec,
    JsonSchemaSpec,
    RegexSpec,
    close_schema,
    dtype_spec,
    grammar_spec,
    json_schema_spec,
    regex_spec,
)

__all__ = [
    "REGEX_BOOL",
    "REGEX_FLOAT",
    "REGEX_INT",
    "REGEX_STR",
    "ChoiceSpec",
    "ConstraintSpec",
    "GrammarSpec",
    "JsonSchemaSpec",
    "RegexSpec",
    "close_schema",
    "dtype_spec",
    "grammar_spec",
    "json_schema_spec",
    "regex_spec",
]
