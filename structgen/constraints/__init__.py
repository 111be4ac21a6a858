"""Constraints: what an output must look like, and how engines enforce it token by token.

* :mod:`.spec` -- frozen, engine-independent specs (regex, JSON schema, choices, grammar);
* :mod:`.base` -- the contract: engine -> compiled constraint -> matcher -> bitmask;
* :mod:`.engines` -- llguidance and XGrammar, peers under that contract;
* :mod:`.ladder` -- the engines composed into one compiler (:class:`~.ladder.LadderConfig`);
* :mod:`.compiler` -- the shared, cached compiler per tokenizer (:func:`~.compiler.compiler_for`);
* :mod:`.schema` -- JSON-schema work before compiling (checks, normalisation, looser rungs);
* :mod:`.validation` -- final validation of generated text.
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
