"""llama.cpp's server (``llama-server``): GBNF ``grammar`` on completions.

``llama-server`` (llama.cpp's own; llama-cpp-python's ``python -m llama_cpp.server`` takes
the same field) speaks OpenAI routes plus ``grammar`` (GBNF). It has no
regex field and its schema conversion is loose, so every constraint is sent as structgen's
own GBNF (:mod:`structgen.backends.llamacpp.gbnf`, :mod:`~structgen.backends.llamacpp.gbnf_schema`)
and the output is checked afterwards against the original constraint
(:func:`~structgen.constraints.validation.validate_output`): a value the grammar could not
pin down exactly (e.g. an integer bound) fails as
:class:`~structgen.errors.OutputValidationError` carrying the raw text, never silently.

Grammars in Lark syntax have no GBNF translation here: a capability error. ``select`` is
a constrained choice. Install and launch: ``backends/llamacpp/LAUNCH.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from structgen.backends.llamacpp.gbnf import choices_to_gbnf, regex_to_gbnf
from structgen.backends.llamacpp.gbnf_schema import json_schema_to_gbnf
from structgen.backends.llamacpp.tool_gbnf import tool_gbnf
from structgen.backends.openai.adapter import OpenAICompatBackend
from structgen.constraints.kind import Translations
from structgen.constraints.spec import (
    ChoiceSpec,
    ConstraintSpec,
    GrammarSpec,
    JsonSchemaSpec,
    RegexSpec,
)
from structgen.constraints.validation import validate_output
from structgen.contract.backend import Capabilities, GenerateRequest, GenerateResult
from structgen.errors import CapabilityError
from structgen.tools.spec import ToolCallSpec

__all__ = ["GBNF", "LlamaCppBackend", "grammar_for"]

#: spec class -> llama.cpp GBNF grammar text (context: an object with ``name``/``version``)
GBNF: Translations[str] = Translations("llamacpp")


@GBNF.register(RegexSpec)
def _regex_gbnf(spec: RegexSpec, ctx: Any) -> str:
    return regex_to_gbnf(spec.pattern)


@GBNF.register(JsonSchemaSpec)
def _json_gbnf(spec: JsonSchemaSpec, ctx: Any) -> str:
    return json_schema_to_gbnf(spec.schema_dict)


@GBNF.register(ChoiceSpec)
def _choice_gbnf(spec: ChoiceSpec, ctx: Any) -> str:
    return choices_to_gbnf(spec.choices)


@GBNF.register(GrammarSpec)
def _lark_gbnf(spec: GrammarSpec, ctx: Any) -> str:
    raise CapabilityError("Lark grammar constraints", backend=ctx.name, version=ctx.version,
                          hint="llama.cpp reads GBNF only")


@GBNF.register(ToolCallSpec)
def _tools_gbnf(spec: ToolCallSpec, ctx: Any) -> str:
    return tool_gbnf(spec)


def grammar_for(spec: ConstraintSpec, *, backend: str = "llamacpp", version: str | None = None) -> str:
    return GBNF(spec, SimpleNamespace(name=backend, version=version))


class LlamaCppBackend(OpenAICompatBackend):
    """A llama.cpp server (``llama-server``); text prompts to ``/v1/completions``."""

    name = "llamacpp"
    route = "completions"

    def __init__(self, base_url: str = "http://127.0.0.1:8000", **kw: Any):
        kw.setdefault("max_concurrency", 4)  # llama-server's slots (--parallel)
        super().__init__(base_url, **kw)
        self._grammar_cache: dict[ConstraintSpec, str] = {}

    def _server_version(self) -> str | None:
        """llama-server's build (``/props`` ``build_info``, e.g. ``b11669-Debian``); None
        where the server has no such route (llama-cpp-python's)."""
        body = self.http.get_optional("/props", what="llama.cpp props", retries=1)
        build = body.get("build_info") if isinstance(body, Mapping) else None
        return str(build) if build else None

    def _capabilities_for(self, version: str | None) -> Capabilities:
        return Capabilities(
            regex=True, json_schema=True, grammar=False, choices=True, select="choice",
            # tool calls: structgen's own GBNF of the turn (tool_gbnf.py)
            prefix_cache=False, tools=True, streaming=False,
            chat_messages=False,
            sampling=frozenset({"max_new_tokens", "temperature", "top_p", "top_k", "min_p", "stop",
                                "seed", "frequency_penalty", "presence_penalty"}))

    def constraint_fields(self, spec: ConstraintSpec) -> dict[str, Any]:
        grammar = self._grammar_cache.get(spec)
        if grammar is None:
            grammar = GBNF(spec, self)
            if len(self._grammar_cache) < 256:
                self._grammar_cache[spec] = grammar
        return {"grammar": grammar}

    def check_generate(self, request: GenerateRequest) -> None:
        super().check_generate(request)
        if request.constraint is not None:
            self.constraint_fields(request.constraint)  # untranslatable -> raise before sending

    def parse_text(self, request: GenerateRequest, body: Mapping[str, Any]) -> GenerateResult:
        """The text, checked against the original constraint by structgen's own final
        validation (the GBNF may be looser): an OutputValidationError carries the raw text,
        and a program's ``retries=`` re-samples it."""
        result = super().parse_text(request, body)
        if request.constraint is not None:
            validate_output(request.constraint, result.text, truncated=result.finish_reason == "length")
        return result
