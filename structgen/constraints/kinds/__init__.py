"""The built-in constraint kinds, one module each; importing this package registers them.

Each module holds a kind's spec class, its builder (the checks at ``gen()`` time), its
final validator and its :func:`~structgen.constraints.kind.register_kind` call. A new kind
is a new module here (or anywhere) plus translations registered by each engine and
backend that can serve it -- see backends/README.md, "Adding a constraint kind".
"""

from structgen.constraints.kinds.choice import ChoiceSpec
from structgen.constraints.kinds.grammar import GrammarSpec, grammar_spec
from structgen.constraints.kinds.json_schema import JsonSchemaSpec, close_schema, json_schema_spec
from structgen.constraints.kinds.regex import (
    REGEX_BOOL,
    REGEX_FLOAT,
    REGEX_INT,
    REGEX_STR,
    RegexSpec,
    dtype_spec,
    regex_spec,
)

__all__ = [
    "REGEX_BOOL",
    "REGEX_FLOAT",
    "REGEX_INT",
    "REGEX_STR",
    "ChoiceSpec",
    "GrammarSpec",
    "JsonSchemaSpec",
    "RegexSpec",
    "close_schema",
    "dtype_spec",
    "grammar_spec",
    "json_schema_spec",
    "regex_spec",
]
