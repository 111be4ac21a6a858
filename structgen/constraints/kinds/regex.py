"""The regex constraint kind: the whole output must fully match a Python-syntax pattern.

A pattern is checked when the spec is built (``gen(regex=...)``): Python's parser and the
constraint engine must both accept it, so a pattern no backend can enforce -- or one that
breaks a parser (a repeat count past 2**32, hundreds of nested groups) -- fails at once
as :class:`~structgen.errors.ConstraintError`. Final validation runs the engine's own
automaton over the text (:mod:`structgen.constraints.text_matcher`): linear time, exactly
the language the decoding mask enforced. ``dtype=`` constraints are regexes too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from structgen.constraints.kind import ConstraintKind, ConstraintSpec, output_failed, register_kind
from structgen.constraints.text_matcher import accepts_regex, check_regex
from structgen.errors import ConstraintError

__all__ = ["REGEX_BOOL", "REGEX_FLOAT", "REGEX_INT", "REGEX_STR", "RegexSpec", "dtype_spec", "regex_spec"]

# The same patterns SGLang's frontend uses for `dtype=` (sglang.lang.ir).
REGEX_INT = r"[-+]?[0-9]+[ \n]*"
REGEX_FLOAT = r"[-+]?[0-9]*\.?[0-9]+[ \n]*"
REGEX_BOOL = r"(True|False)"
REGEX_STR = r"\"[\w\d\s]*\""

#: longest pattern accepted (a pattern is a program, not data)
MAX_PATTERN_LENGTH = 100_000


@dataclass(frozen=True)
class RegexSpec(ConstraintSpec):
    """The whole output must fully match ``pattern`` (Python `re` syntax subset)."""

    pattern: str
    kind: Literal["regex"] = "regex"

    def describe(self) -> str:
        return f"regex {self.pattern!r}"


def regex_spec(pattern: str) -> RegexSpec:
    """Build a :class:`RegexSpec`, rejecting at once a pattern Python or the engine cannot take."""
    if not isinstance(pattern, str):
        raise ConstraintError(f"regex must be a string, not {type(pattern).__name__}")
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise ConstraintError(f"regex is {len(pattern)} characters long (at most {MAX_PATTERN_LENGTH})",
                              constraint=pattern)
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ConstraintError(f"malformed regex: {exc}", constraint=pattern) from exc
    except (OverflowError, RecursionError, MemoryError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc) or type(exc).__name__
        raise ConstraintError(f"regex cannot be compiled: {reason}", constraint=pattern) from None
    check_regex(pattern)
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


def validate_regex(spec: RegexSpec, text: str, truncated: bool) -> str:
    """``text`` itself when the engine's automaton accepts all of it (linear time)."""
    ok, reason = accepts_regex(spec.pattern, text)
    if not ok:
        errors = [f"text does not fully match regex {spec.pattern!r}"]
        if reason:
            errors.append(reason)
        output_failed(text, truncated, "output does not match the regex", errors)
    return text


REGEX = register_kind(ConstraintKind(name="regex", spec_type=RegexSpec, feature="regex",
                                     description="regex constraints", validate=validate_regex))
