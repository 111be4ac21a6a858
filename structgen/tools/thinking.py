"""Reasoning first: a free-text thinking section, then the constrained part.

``gen(..., think=True)`` (or a tag pair such as ``("<reasoning>", "</reasoning>")``) lets
the model write anything inside the tags, then enforces the constraint that follows:
a JSON schema, a regex, a dtype or nothing (tool calls build the same section into their
own grammar, :mod:`structgen.tools.grammar`). Thinking never switches the constraint off:
the section is part of one llguidance grammar, and the part after it is validated as the
plain constraint would be. The variable's text is the whole output; its typed value is
the constrained part's; ``meta["thinking"]`` holds the thinking text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from structgen.constraints.kind import ConstraintKind, register_kind
from structgen.constraints.spec import GrammarSpec, dtype_spec, json_schema_spec, regex_spec
from structgen.errors import OutputValidationError
from structgen.tools.calls import split_thinking
from structgen.tools.grammar import think_prefix
from structgen.tools.spec import normalize_think

__all__ = ["ThinkingSpec", "thinking_spec"]


@dataclass(frozen=True)
class ThinkingSpec(GrammarSpec):
    """A thinking section, then ``inner`` (None: free text)."""

    inner: Any = None
    think: tuple[Any, ...] | None = None
    dtype: Any = None

    def describe(self) -> str:
        inner = self.inner.describe() if self.inner is not None else "text"
        return f"thinking, then {inner}"

    def validate_output(self, text: str, *, truncated: bool = False) -> Any:
        from structgen.constraints.validation import validate_output

        thinking, rest = split_thinking(text, self.think)
        if thinking is None or self.think is None or self.think[1] not in text:
            raise OutputValidationError("the thinking section is not closed", raw=text,
                                        errors=[f"expected {self.think[1] if self.think else ''!r}"],
                                        truncated=truncated)
        if self.inner is None:
            return rest
        try:
            value = validate_output(self.inner, rest, truncated=truncated)
        except OutputValidationError as exc:
            raise OutputValidationError(exc.message, raw=text, errors=exc.errors, truncated=truncated) from None
        if self.dtype is not None:
            from structgen.lang.kinds.generate import convert_dtype

            return convert_dtype(self.dtype, rest)
        return value


register_kind(ConstraintKind(name="thinking", spec_type=ThinkingSpec, feature="grammar",
                             description="a thinking section before a constraint (needs grammars)",
                             validate=lambda spec, text, truncated: spec.validate_output(text, truncated=truncated)))


def _lark_regex(pattern: str) -> str:
    from structgen.constraints.engines.llguidance import python_regex_to_rust

    return "/" + python_regex_to_rust(pattern).replace("/", "\\/") + "/"


def thinking_spec(think: Any, *, regex: str | None = None, json_schema: Any = None, dtype: Any = None,
                  whitespace: Any = "compact") -> ThinkingSpec:
    tags = normalize_think(think)
    head, rules = think_prefix(tags)
    inner: Any = None
    body = "REST"
    extra = ["REST: /(?s:.*)/"]
    if regex is not None or dtype is not None:
        inner = regex_spec(regex) if regex is not None else dtype_spec(dtype)
        extra = [f"REST: {_lark_regex(inner.pattern)}"]
    elif json_schema is not None:
        inner = json_schema_spec(json_schema, whitespace=whitespace)
        schema = json.loads(inner.schema)
        if isinstance(schema, dict):
            schema = {**schema, "x-guidance": {"whitespace_flexible": whitespace == "flexible"}}
        body = "answer"
        extra = [f"answer: %json {json.dumps(schema)}"]
    grammar = "\n".join(["%llguidance {}", f"start: {head}{body}", *rules, *extra]) + "\n"
    return ThinkingSpec(grammar=grammar, inner=inner, think=tags, dtype=dtype)
