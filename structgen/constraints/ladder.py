"""The fallback ladder: engines composed into one compiler, configured by :class:`LadderConfig`.

A regex, choice or Lark spec is compiled by llguidance. A JSON schema first goes through
:func:`~structgen.constraints.schema.prepare.prepare_schema` (checks, offline references),
then up a ladder of grammars, strictly first. When a rung cannot be compiled, each next
rung is a *looser* schema that still admits every valid value:

1. ``exact``     the schema as given when it is *plain*, else the normalised schema,
                 strict (exact when normalisation was exact);
2. ``coerce``    ``oneOf`` read as ``anyOf``;
3. ``xgrammar``  the second engine (:mod:`structgen.constraints.engines.xgrammar`) on the
                 normalised schema: tighter than the llguidance rungs that ignore or drop
                 keywords, but never exact; skipped when switched off, missing, failing
                 or timing out (a note says why);
4. ``lenient``   unimplemented keywords and unknown formats ignored by the engine;
5. ``relaxed``   string patterns, formats, ``patternProperties`` (folded into
                 ``additionalProperties``), property/item counts and other hard
                 keywords dropped (:func:`~structgen.constraints.schema.loosen.relax`);
6. ``skeleton``  only types, properties, required keys, items, enums and ``anyOf``;
7. ``type``      any JSON value of the schema's top-level type(s);
8. ``any``       any JSON value.

Every rung after the first is labelled ``exact=False``: the compiled constraint then only
guarantees well-formed JSON of roughly the right shape, and
:func:`structgen.constraints.validation.validate_output` (jsonschema, formats checked) is
what keeps an invalid value from reaching the user -- it raises
:class:`~structgen.errors.OutputValidationError` with the raw text and each error.

Configuration is data (:class:`LadderConfig`), passed where the compiler is built
(:func:`structgen.constraints.compiler.compiler_for`); :meth:`LadderConfig.from_env` is
the one place environment variables are read.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from structgen.constraints.base import CompiledConstraint, ConstraintCompiler, EngineRefusal
from structgen.constraints.engines.llguidance import LLGuidanceEngine
from structgen.constraints.engines.xgrammar import XGrammarEngine, engine_for
from structgen.constraints.kind import Translations
from structgen.constraints.schema.loosen import relax, skeleton, top_types
from structgen.constraints.schema.prepare import prepare_schema
from structgen.constraints.spec import ConstraintSpec, JsonSchemaSpec
from structgen.errors import ConstraintError

__all__ = ["COMPILE", "RUNGS", "Ladder", "LadderConfig"]

RUNGS = ("exact", "coerce", "xgrammar", "lenient", "relaxed", "skeleton", "type", "any")
#: the llguidance rung after which XGrammar is tried. Not right after "exact": "coerce" is
#: the exact schema with oneOf read as anyOf, and on MaskBench it rejects more invalid
#: instances than XGrammar (which also reads oneOf as anyOf and ignores a oneOf branch's
#: sibling keywords); from "lenient" down llguidance ignores or drops keywords, and
#: XGrammar is tighter.
SECOND_ENGINE_AFTER = "coerce"

_OFF = ("0", "false", "no", "off")


@dataclass(frozen=True)
class LadderConfig:
    """How the ladder compiles JSON schemas. Frozen: part of the compile cache's key."""

    #: the engine tried after llguidance's ``coerce`` rung: ``"xgrammar"`` or ``None`` (off)
    second_engine: str | None = "xgrammar"
    #: seconds one XGrammar compile may take before it is abandoned
    xgrammar_timeout: float = 5.0
    #: abandoned (timed-out) XGrammar compiles that may still run before the rung is skipped
    xgrammar_max_abandoned: int = 2
    #: XGrammar accepts an object's keys in any order (JSON objects are unordered; in the
    #: schema's order XGrammar rejects valid instances MaskBench has). The cost: its
    #: any-order grammar counts keys, so a repeated key can stand in for a required one
    #: (``{"a":1,"b":2,"b":3}`` for required a, b, c) -- the final validation rejects it.
    any_order: bool = True

    def __post_init__(self) -> None:
        if self.second_engine not in (None, "xgrammar"):
            raise ValueError(f"second_engine must be 'xgrammar' or None, not {self.second_engine!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LadderConfig:
        """The configuration with environment overrides -- the one place they are read:

        * ``STRUCTGEN_XGRAMMAR=0`` switches the second engine off;
        * ``STRUCTGEN_XGRAMMAR_TIMEOUT`` seconds per XGrammar compile;
        * ``STRUCTGEN_XGRAMMAR_ANY_ORDER=0`` keys in the schema's order.
        """
        env = os.environ if environ is None else environ
        base = cls()
        second = base.second_engine
        if env.get("STRUCTGEN_XGRAMMAR", "").strip().lower() in _OFF:
            second = None
        try:
            timeout = float(env.get("STRUCTGEN_XGRAMMAR_TIMEOUT", base.xgrammar_timeout))
        except ValueError:
            timeout = base.xgrammar_timeout
        any_order = env.get("STRUCTGEN_XGRAMMAR_ANY_ORDER", "1").strip().lower() not in _OFF
        return cls(second_engine=second, xgrammar_timeout=timeout, any_order=any_order)


class Ladder(ConstraintCompiler):
    """The one compiler for a vocabulary: llguidance first, the second engine on the
    ladder, as :class:`LadderConfig` says. Does not cache (see
    :class:`~structgen.constraints.compiler.CachingCompiler`)."""

    def __init__(self, primary: LLGuidanceEngine, config: LadderConfig | None = None):
        self.primary = primary
        self.config = LadderConfig() if config is None else config

    @property
    def vocab_size(self) -> int:
        return self.primary.vocab_size

    @property
    def eos_token_id(self) -> int:
        return self.primary.eos_token_id

    @property
    def llguidance_tokenizer(self) -> Any:
        return self.primary.llguidance_tokenizer

    def compile(self, spec: ConstraintSpec) -> CompiledConstraint:
        return COMPILE(spec, self)

    def compile_schema(self, spec: JsonSchemaSpec) -> CompiledConstraint:
        """The strictest constraint the engines build for ``spec`` (see the module docstring).

        Raises :class:`ConstraintError` for a malformed schema, and only if even "any JSON
        value" fails to compile."""
        prepared = prepare_schema(spec.schema)
        base = {"whitespace_flexible": spec.whitespace == "flexible"}
        if prepared.plain:
            try:
                compiled = self.primary.compile_schema(
                    spec, prepared.schema if prepared.text is None else prepared.text, base)
            except EngineRefusal:
                pass
            else:
                return compiled.label(exact=True, rung="exact", warnings=compiled.warnings)
        norm = prepared.normalized
        notes: list[str] = [f"normalisation widened: {r}" for r in norm.relaxed]
        coerce = {**base, "coerce_one_of": True}
        loose = {**base, "coerce_one_of": True, "lenient": True}
        attempts: list[tuple[str, Callable[[], Any], dict[str, Any]]] = [
            ("exact", lambda: norm.schema, base),
            ("coerce", lambda: norm.schema, coerce),
            ("lenient", lambda: norm.schema, loose),
            ("relaxed", lambda: relax(norm.schema), loose),
            ("skeleton", lambda: skeleton(norm.schema), loose),
            ("type", lambda: top_types(norm.schema), {**base, "lenient": True}),
            ("any", dict, base),
        ]
        for rung, make, options in attempts:
            candidate = make()
            if isinstance(candidate, bool):
                candidate = {} if candidate else {"type": "string", "enum": []}
            try:
                compiled = self.primary.compile_schema(spec, candidate, options)
            except EngineRefusal as refusal:
                notes.append(f"{rung}: {refusal.reason}")
            else:
                exact = rung == "exact" and norm.exact
                return compiled.label(exact=exact, rung=rung, warnings=notes + list(compiled.warnings))
            if rung == SECOND_ENGINE_AFTER:
                other = self._second_engine(spec, norm.schema, base, notes)
                if other is not None:
                    return other
        raise ConstraintError("cannot compile even an unconstrained JSON grammar: " + "; ".join(notes[-3:]))

    # --- the second engine, between the "coerce" and "lenient" rungs -------------------------

    def _second_engine(self, spec: JsonSchemaSpec, schema: Any, base: dict[str, Any],
                       notes: list[str]) -> CompiledConstraint | None:
        """The ``xgrammar`` rung: the normalised schema compiled by the second engine, when
        llguidance could not compile it (nor its ``coerce`` form); a note and ``None``
        when the engine is off, missing, failing or timing out."""
        config = self.config
        if config.second_engine is None:
            notes.append("xgrammar: xgrammar is switched off (STRUCTGEN_XGRAMMAR=0)")
            return None
        engine, why = self.second_engine()
        if engine is None:
            notes.append(f"xgrammar: {why or 'xgrammar is unavailable'}")
            return None
        options = {**base, "any_order": config.any_order, "timeout_s": config.xgrammar_timeout}
        try:
            compiled = engine.compile_schema(spec, schema, options)
        except EngineRefusal as refusal:
            notes.append(f"xgrammar: {refusal.reason}")
            return None
        used = "engine: xgrammar (llguidance could not compile the schema; final validation guards the output)"
        return compiled.label(exact=False, rung="xgrammar", warnings=(*notes, used))

    def second_engine(self) -> tuple[XGrammarEngine | None, str | None]:
        """The second engine for this vocabulary (built on first use, XGrammar imported
        then), or ``(None, why)``."""
        return engine_for(self.primary.token_table(), max_abandoned=self.config.xgrammar_max_abandoned)


def _compile_by_grammar(spec: ConstraintSpec, ladder: Ladder) -> CompiledConstraint:
    return ladder.primary.compile_spec(spec)


def _compile_schema(spec: JsonSchemaSpec, ladder: Ladder) -> CompiledConstraint:
    return ladder.compile_schema(spec)


#: how a kind is compiled: by the primary engine's grammar translation
#: (:data:`~structgen.constraints.engines.llguidance.GRAMMARS`), unless the kind registers
#: its own path here -- JSON schemas go down the ladder's rungs
COMPILE: Translations[CompiledConstraint] = Translations("ladder compile", default=_compile_by_grammar)
COMPILE.register(JsonSchemaSpec)(_compile_schema)
