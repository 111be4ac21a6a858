"""TensorRT-LLM's ``trtllm-serve``: OpenAI routes with ``response_format`` guided decoding.

From TensorRT-LLM's documentation (``features/guided-decoding``, ``serve/openai_protocol.py``):
guided decoding needs the server started with ``guided_decoding_backend: xgrammar`` or
``llguidance`` in its ``--config`` YAML; then ``response_format`` carries the constraint:

- ``{"type": "json", "schema": S}`` (also ``{"type": "json_schema", "json_schema": {...}}``),
- ``{"type": "regex", "regex": R}``,
- ``{"type": "ebnf", "ebnf": G}`` -- EBNF for xgrammar, Lark for llguidance,
- ``{"type": "structural_tag", ...}``.

A server started *without* a guided-decoding backend ignores ``response_format``, so the
adapter must be told the backend (``guided_decoding_backend=``); with ``None`` every
constraint is a capability error rather than a silently unconstrained output.
Choices are sent as an escaped regex alternation; ``select`` is a constrained choice
(prompt logprobs are not relied on).

:func:`llm_api_guided_kwargs` gives the same translation for the in-process API:
``GuidedDecodingParams(**llm_api_guided_kwargs(spec))``.

Unverified against a live engine here (no installable wheel): see ``gpu_check.sh``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any

from structgen.backends.openai.adapter import OpenAICompatBackend
from structgen.backends.sglang.adapter import choice_regex
from structgen.constraints.kind import Translations
from structgen.constraints.spec import (
    ChoiceSpec,
    ConstraintSpec,
    GrammarSpec,
    JsonSchemaSpec,
    RegexSpec,
)
from structgen.contract.backend import Capabilities
from structgen.errors import CapabilityError

__all__ = ["GUIDED", "TRTLLMBackend", "llm_api_guided_kwargs"]

GUIDED_BACKENDS = ("xgrammar", "llguidance")


#: spec class -> ``GuidedDecodingParams`` keyword arguments; the context has the
#: ``guided_decoding_backend`` (``"xgrammar"`` / ``"llguidance"``), ``name`` and ``version``
GUIDED: Translations[dict[str, Any]] = Translations("trtllm")


@GUIDED.register(JsonSchemaSpec)
def _json_guide(spec: JsonSchemaSpec, ctx: Any) -> dict[str, Any]:
    return {"json": spec.schema}


@GUIDED.register(RegexSpec)
def _regex_guide(spec: RegexSpec, ctx: Any) -> dict[str, Any]:
    return {"regex": spec.pattern}


@GUIDED.register(ChoiceSpec)
def _choice_guide(spec: ChoiceSpec, ctx: Any) -> dict[str, Any]:
    return {"regex": choice_regex(spec.choices)}


@GUIDED.register(GrammarSpec)
def _grammar_guide(spec: GrammarSpec, ctx: Any) -> dict[str, Any]:
    if ctx.guided_decoding_backend != "llguidance":
        raise CapabilityError("Lark grammar constraints", backend=ctx.name, version=ctx.version,
                              hint="xgrammar reads EBNF; use guided_decoding_backend: llguidance")
    return {"grammar": spec.grammar}


def llm_api_guided_kwargs(spec: ConstraintSpec, *, guided_decoding_backend: str = "xgrammar") -> dict[str, Any]:
    """Keyword arguments for ``tensorrt_llm.llmapi.GuidedDecodingParams`` for ``spec``."""
    return GUIDED(spec, SimpleNamespace(name="trtllm", version=None, guided_decoding_backend=guided_decoding_backend))


#: ``GuidedDecodingParams`` keyword -> the server's ``response_format`` for it
_RESPONSE_FORMAT: dict[str, Callable[[Any], dict[str, Any]]] = {
    "json": lambda v: {"type": "json", "schema": json.loads(v)},
    "regex": lambda v: {"type": "regex", "regex": v},
    "grammar": lambda v: {"type": "ebnf", "ebnf": v},
}


class TRTLLMBackend(OpenAICompatBackend):
    """A ``trtllm-serve`` server, completions route with text prompts."""

    name = "trtllm"
    route = "completions"

    def __init__(self, base_url: str = "http://127.0.0.1:8000", *,
                 guided_decoding_backend: str | None = "xgrammar", **kw: Any):
        if guided_decoding_backend not in (*GUIDED_BACKENDS, None):
            raise ValueError(f"guided_decoding_backend must be one of {GUIDED_BACKENDS} or None")
        self.guided_decoding_backend = guided_decoding_backend
        super().__init__(base_url, **kw)

    def _server_version(self) -> str | None:
        body = self.http.get_optional("/version", what="trtllm version", retries=1)
        return str(body.get("version")) if isinstance(body, Mapping) and body.get("version") else None

    def _capabilities_for(self, version: str | None) -> Capabilities:
        guided = self.guided_decoding_backend is not None
        return Capabilities(
            regex=guided, json_schema=guided, grammar=self.guided_decoding_backend == "llguidance",
            choices=guided, select="choice" if guided else "none", prefix_cache=True, tools=False,
            streaming=False, chat_messages=False,
            sampling=frozenset({"max_new_tokens", "min_new_tokens", "temperature", "top_p", "top_k",
                                "stop", "stop_token_ids", "seed", "frequency_penalty",
                                "presence_penalty", "ignore_eos"}))

    def constraint_fields(self, spec: ConstraintSpec) -> dict[str, Any]:
        if self.guided_decoding_backend is None:
            raise CapabilityError(f"{spec.kind} constraints", backend=self.name, version=self.version,
                                  hint="the server has no guided_decoding_backend")
        ((key, value),) = GUIDED(spec, self).items()
        return {"response_format": _RESPONSE_FORMAT[key](value)}
