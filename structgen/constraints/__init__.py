"""Constraints: what an output must look like, and how engines enforce it token by token.

* :mod:`.spec` -- frozen, engine-independent specs (regex, JSON schema, choices, grammar);
* :mod:`.kind` / :mod:`.kinds` -- the constraint-kind registry and the built-in kinds, one
  module each (spec class, builder, final validator), dispatched by table, not ``isinstance``;
* :mod:`.base` -- the contract: engine -> compiled constraint -> matcher -> bitmask;
* :mod:`.engines` -- llguidance and XGrammar, peers under that contract;
* :mod:`.ladder` -- the engines composed into one compiler (:class:`~.ladder.LadderConfig`);
* :mod:`.compiler` -- the shared, cached compiler per tokenizer (:func:`~.compiler.compiler_for`);
* :mod:`.schema` -- JSON-schema work before compiling (checks, normalisation, looser rungs);
* :mod:`.validation` -- final validation of generated text, in bounded time
  (:mod:`.text_matcher`: the engine's automaton for regexes; :mod:`.json_patterns`: RE2).
"""

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
