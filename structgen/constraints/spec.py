"""Constraint specifications: frozen, engine-independent data.

A spec says *what* the output must look like. It is part of the IR and knows no
engine; compiling it against a tokenizer is :mod:`structgen.constraints.compiler`'s job,
and translating it into a server's request is each backend adapter's job.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal, Union

from structgen.errors import ConstraintError

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
    "dtype_spec",
    "json_schema_spec",
]

# The same patterns SGLang's frontend uses for `dtype=` (sglang.lang.ir).
REGEX_INT = r"[-+]?[0-9]+[ \n]*"
REGEX_FLOAT = r"[-+]?[0-9]*\.?[0-9]+[ \n]*"
REGEX_BOOL = r"(True|False)"
REGEX_STR = r"\"[\w\d\s]*\""


@dataclass(frozen=True)
class RegexSpec:
    """The whole output must fully match ``pattern`` (Python `re` syntax subset)."""

    pattern: str
    kind: Literal["regex"] = "regex"

    def describe(self) -> str:
        return f"regex {self.pattern!r}"


@dataclass(frozen=True)
class JsonSchemaSpec:
    """The output must be JSON valid against ``schema`` (canonical JSON text).

    ``model`` is the pydantic class the schema came from, if any (typed results).
    ``whitespace``: ``"compact"`` (default; no whitespace between tokens) or ``"flexible"``.
    """

    schema: str
    model: Any = field(default=None, compare=False, hash=False)
    whitespace: Literal["compact", "flexible"] = "compact"
    kind: Literal["json_schema"] = "json_schema"

    @property
    def schema_dict(self) -> Any:
        return json.loads(self.schema)

    def describe(self) -> str:
        title = ""
        if self.model is not None:
            title = getattr(self.model, "__name__", "")
        return f"json_schema {title or self.schema[:80]}"


@dataclass(frozen=True)
class ChoiceSpec:
    """The output must be exactly one of ``choices``."""

    choices: tuple[str, ...]
    kind: Literal["choice"] = "choice"

    def describe(self) -> str:
        return f"choices {list(self.choices)!r}"


@dataclass(frozen=True)
class GrammarSpec:
    """The output must match a Lark-syntax grammar (llguidance's dialect)."""

    grammar: str
    kind: Literal["grammar"] = "grammar"

    def describe(self) -> str:
        return f"grammar {self.grammar[:80]!r}"


ConstraintSpec = Union[RegexSpec, JsonSchemaSpec, ChoiceSpec, GrammarSpec]


def _is_pydantic_model(obj: Any) -> bool:
    return isinstance(obj, type) and hasattr(obj, "model_json_schema") and hasattr(obj, "model_validate")


def json_schema_spec(schema: Any, *, whitespace: Literal["compact", "flexible"] = "compact") -> JsonSchemaSpec:
    """Build a :class:`JsonSchemaSpec` from a JSON string, a dict, or a pydantic model class.

    Raises :class:`ConstraintError` at once for text that is not JSON or a value
    that is not a schema (deeper checks happen when it is compiled).
    """
    model = None
    if _is_pydantic_model(schema):
        model = schema
        schema_obj: Any = schema.model_json_schema()
    elif isinstance(schema, (str, bytes)):
        try:
            schema_obj = json.loads(schema)
        except ValueError as exc:
            raise ConstraintError(f"json_schema is not valid JSON: {exc}",
                                  constraint=str(schema)) from exc
    elif isinstance(schema, (dict, bool)):
        schema_obj = schema
    else:
        raise ConstraintError(
            f"json_schema must be a JSON string, a dict or a pydantic model class, not {type(schema).__name__}")
    if not isinstance(schema_obj, (dict, bool)):
        raise ConstraintError("a JSON schema must be an object or a boolean",
                              constraint=json.dumps(schema_obj)[:200])
    if whitespace not in ("compact", "flexible"):
        raise ConstraintError(f"whitespace must be 'compact' or 'flexible', not {whitespace!r}")
    # Key order is kept, not sorted: the order of "properties" is the order in which
    # constrained decoding generates the fields (e.g. "reasoning" before "answer").
    text = json.dumps(schema_obj, separators=(",", ":"))
    return JsonSchemaSpec(schema=text, model=model, whitespace=whitespace)


def regex_spec(pattern: str) -> RegexSpec:
    """Build a :class:`RegexSpec`, rejecting patterns Python cannot parse at once."""
    if not isinstance(pattern, str):
        raise ConstraintError(f"regex must be a string, not {type(pattern).__name__}")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ConstraintError(f"malformed regex: {exc}", constraint=pattern) from exc
    return RegexSpec(pattern)


_DTYPES: dict[Any, str] = {
    int: REGEX_INT, "int": REGEX_INT,
    float: REGEX_FLOAT, "float": REGEX_FLOAT,
    bool: REGEX_BOOL, "bool": REGEX_BOOL,
    str: REGEX_STR, "str": REGEX_STR,
}


def dtype_spec(dtype: Any) -> RegexSpec:
    """The regex SGLang uses for ``dtype=int|float|str|bool``."""
    try:
        return RegexSpec(_DTYPES[dtype])
    except (KeyError, TypeError):
        raise ConstraintError(f"dtype must be int, float, str or bool, not {dtype!r}") from None
