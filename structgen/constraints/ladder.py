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

A schema that provably admits no value raises :class:`~structgen.errors.ConstraintError`
before any token: ``false``, ``$ref`` cycles no finite value ends (found by
:func:`~structgen.constraints.schema.prepare.prepare_schema`), a normalised ``false``, or
llguidance reporting an unsatisfiable schema on the ``exact`` or ``coerce`` rung (both
only ever widen the schema, so the original is unsatisfiable too).

Compile time and memory are bounded. A schema past :class:`LadderConfig`'s size limits
(optional properties of one object -- llguidance's compile time grows with their square
--, enum values, schema nodes) goes straight to the ``type`` rung, or raises
:class:`~structgen.errors.ConstraintError` with ``oversize="error"``. A large schema
within them compiles on a thread under ``compile_timeout`` for the whole ladder; past it
the remaining rungs are skipped for ``type``.

Configuration is data (:class:`LadderConfig`), passed where the compiler is built
(:func:`structgen.constraints.compiler.compiler_for`); :meth:`LadderConfig.from_env` is
the one place environment variables are read.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from structgen.constraints.base import CompiledConstraint, ConstraintCompiler, EngineRefusal
from structgen.constraints.engines.llguidance import LLGuidanceEngine
from structgen.constraints.engines.xgrammar import XGrammarEngine, engine_for
from structgen.constraints.kind import Translations
from structgen.constraints.schema.loosen import relax, skeleton, top_types
from structgen.constraints.schema.prepare import PreparedSchema, prepare_schema
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
    #: XGrammar accepts an object's keys in any order (JSON objects are unordered; in the
    #: schema's order XGrammar rejects valid instances MaskBench has). The cost: its
    #: any-order grammar counts keys, so a repeated key can stand in for a required one
    #: (``{"a":1,"b":2,"b":3}`` for required a, b, c) -- the final validation rejects it.
    any_order: bool = True
    #: size limits: a schema past any of them is not compiled as it is (see ``oversize``)
    max_optional_properties: int = 2000  # optional properties of one object
    max_enum_values: int = 20_000  # enum values, all enums together
    max_schema_nodes: int = 100_000  # schema objects
    #: past a size limit: ``"loosen"`` (the ``type`` rung, final validation guards) or
    #: ``"error"`` (:class:`~structgen.errors.ConstraintError`)
    oversize: Literal["loosen", "error"] = "loosen"
    #: seconds the rungs of one large schema may take together; a compile still running
    #: then is abandoned and the ``type`` rung used
    compile_timeout: float = 10.0

    def __post_init__(self) -> None:
        if self.second_engine not in (None, "xgrammar"):
            raise ValueError(f"second_engine must be 'xgrammar' or None, not {self.second_engine!r}")
        if self.oversize not in ("loosen", "error"):
            raise ValueError(f"oversize must be 'loosen' or 'error', not {self.oversize!r}")

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

        Raises :class:`ConstraintError` for a malformed schema or one that admits no value,
        one past the size limits with ``oversize="error"``, and if even "any JSON value"
        fails to compile."""
        config = self.config
        start = time.monotonic()
        prepared = prepare_schema(spec.schema)
        base = {"whitespace_flexible": spec.whitespace == "flexible"}
        over = self.over_limits(prepared)
        if over is not None:
            if config.oversize == "error":
                raise ConstraintError(f"JSON schema too large to compile: {over}", constraint=spec.describe())
            return self._loosest(spec, prepared.schema, base, [f"limits: {over}; compiled as its type"])
        deadline = start + config.compile_timeout if self.maybe_slow(prepared) else None

        def timed(options: dict[str, Any]) -> dict[str, Any]:
            if deadline is None:
                return options
            return {**options, "timeout_s": max(0.0, deadline - time.monotonic())}

        if prepared.plain:
            try:
                compiled = self.primary.compile_schema(
                    spec, prepared.schema if prepared.text is None else prepared.text, timed(base))
            except EngineRefusal as refusal:
                _raise_if_unsatisfiable(refusal, spec)
                if refusal.timed_out:
                    return self._loosest(spec, prepared.schema, base, [f"exact: {refusal.reason}"])
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
        ]
        for rung, make, options in attempts:
            if deadline is not None and time.monotonic() >= deadline:
                notes.append(f"{rung}: skipped (compile_timeout of {config.compile_timeout:g} s spent)")
                break
            try:
                compiled = self.primary.compile_schema(spec, make(), timed(options))
            except EngineRefusal as refusal:
                if rung in ("exact", "coerce"):  # both only widen: the original is unsatisfiable too
                    _raise_if_unsatisfiable(refusal, spec)
                notes.append(f"{rung}: {refusal.reason}")
                if refusal.timed_out:
                    break
            else:
                exact = rung == "exact" and norm.exact
                return compiled.label(exact=exact, rung=rung, warnings=notes + list(compiled.warnings))
            if rung == SECOND_ENGINE_AFTER:
                left = None if deadline is None else deadline - time.monotonic()
                other = self._second_engine(spec, norm.schema, base, notes, left)
                if other is not None:
                    return other
        return self._loosest(spec, norm.schema, base, notes)

    def _loosest(self, spec: JsonSchemaSpec, schema: Any, base: dict[str, Any],
                 notes: list[str]) -> CompiledConstraint:
        """The ``type`` rung, else ``any``: small grammars, compiled without a deadline."""
        for rung, candidate, options in (("type", top_types(schema), {**base, "lenient": True}), ("any", {}, base)):
            try:
                compiled = self.primary.compile_schema(spec, candidate, options)
            except EngineRefusal as refusal:
                notes.append(f"{rung}: {refusal.reason}")
            else:
                return compiled.label(exact=False, rung=rung, warnings=notes + list(compiled.warnings))
        raise ConstraintError("cannot compile even an unconstrained JSON grammar: " + "; ".join(notes[-3:]))

    def over_limits(self, prepared: PreparedSchema) -> str | None:
        """Which size limit of :class:`LadderConfig` ``prepared`` is past, if any."""
        config = self.config
        if prepared.widest_optional > config.max_optional_properties:
            return (f"an object has {prepared.widest_optional} optional properties (max_optional_properties="
                    f"{config.max_optional_properties}; llguidance's compile time grows with their square)")
        if prepared.enum_values > config.max_enum_values:
            return f"{prepared.enum_values} enum values (max_enum_values={config.max_enum_values})"
        if prepared.nodes > config.max_schema_nodes:
            return f"{prepared.nodes} schema objects (max_schema_nodes={config.max_schema_nodes})"
        return None

    @staticmethod
    def maybe_slow(prepared: PreparedSchema) -> bool:
        """Large enough that compiling may take long: its rungs run under ``compile_timeout``
        (on a thread each; small schemas compile in place, without that overhead)."""
        return prepared.widest_optional > 200 or prepared.enum_values > 2000 or prepared.nodes > 2000

    # --- the second engine, between the "coerce" and "lenient" rungs -------------------------

    def _second_engine(self, spec: JsonSchemaSpec, schema: Any, base: dict[str, Any],
                       notes: list[str], left_s: float | None) -> CompiledConstraint | None:
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
        timeout = config.xgrammar_timeout if left_s is None else max(0.0, min(config.xgrammar_timeout, left_s))
        options = {**base, "any_order": config.any_order, "timeout_s": timeout}
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
        return engine_for(self.primary.token_table())


def _raise_if_unsatisfiable(refusal: EngineRefusal, spec: JsonSchemaSpec) -> None:
    if refusal.unsatisfiable:
        raise ConstraintError(f"the JSON schema admits no value ({refusal.reason})",
                              constraint=spec.describe()) from None


def _compile_by_grammar(spec: ConstraintSpec, ladder: Ladder) -> CompiledConstraint:
    return ladder.primary.compile_spec(spec)


def _compile_schema(spec: JsonSchemaSpec, ladder: Ladder) -> CompiledConstraint:
    return ladder.compile_schema(spec)


#: how a kind is compiled: by the primary engine's grammar translation
#: (:data:`~structgen.constraints.engines.llguidance.GRAMMARS`), unless the kind registers
#: its own path here -- JSON schemas go down the ladder's rungs
COMPILE: Translations[CompiledConstraint] = Translations("ladder compile", default=_compile_by_grammar)
COMPILE.register(JsonSchemaSpec)(_compile_schema)
