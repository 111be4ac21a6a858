"""OpenAI-compatible servers: the chat and completions routes, shared by vLLM and TensorRT-LLM.

:class:`OpenAICompatBackend` holds what all such servers share: the sampling-parameter
names, the ``/v1/models`` detection, parsing of ``choices[0]``. Subclasses say where a
constraint goes (:meth:`constraint_fields`).

:class:`OpenAIBackend` is any OpenAI-compatible server (OpenAI itself, proxies, other
engines' chat routes): it sends ``messages`` to ``/v1/chat/completions``; JSON schema goes
into ``response_format`` (``json_schema``, strict); a choice set becomes a strict JSON
schema with an ``enum`` whose value is unwrapped; regex and grammars cannot be expressed
there, so they are capability errors, never dropped constraints.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from structgen.backends.openai.tools import calls_text, chat_tool_messages, tool_fields
from structgen.constraints.kind import Translations
from structgen.constraints.spec import ChoiceSpec, ConstraintSpec, JsonSchemaSpec
from structgen.contract.backend import (
    Capabilities,
    GenerateRequest,
    GenerateResult,
    SamplingParams,
)
from structgen.contract.server import Call, Flow, ServerBackend, finish_reason, require, text_field
from structgen.errors import BackendError, CapabilityError, OutputValidationError
from structgen.tools.spec import ToolCallSpec

__all__ = ["ANSWERS", "FIELDS", "OpenAIBackend", "OpenAICompatBackend", "openai_sampling"]

#: structgen SamplingParams name -> OpenAI request field
_OPENAI_NAMES = {
    "max_new_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "stop": "stop",
    "seed": "seed",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "n": "n",
}
#: extra fields vLLM (and other engines' OpenAI routes) accept at top level
_ENGINE_EXTRA_NAMES = {
    "top_k": "top_k",
    "min_p": "min_p",
    "min_new_tokens": "min_tokens",
    "stop_token_ids": "stop_token_ids",
    "ignore_eos": "ignore_eos",
}


def openai_sampling(params: SamplingParams, allowed: frozenset[str], *,
                    max_tokens_field: str = "max_tokens") -> dict[str, Any]:
    """The request fields for the parameters in ``allowed`` that are set."""
    names = {**_OPENAI_NAMES, **_ENGINE_EXTRA_NAMES, "max_new_tokens": max_tokens_field}
    out: dict[str, Any] = {}
    for name in params.set_fields() & allowed:
        if name not in names:
            continue
        value = getattr(params, name)
        if isinstance(value, tuple):
            value = list(value)
        out[names[name]] = value
    return out


class OpenAICompatBackend(ServerBackend):
    """Shared core of OpenAI-route backends. ``route`` is ``"chat"`` or ``"completions"``."""

    name = "openai-compatible"
    route = "chat"
    max_tokens_field = "max_tokens"

    # -- detection --------------------------------------------------------------------
    def _server_version(self) -> str | None:
        return None

    def _detect(self) -> tuple[str | None, Any]:
        version = self._server_version()
        if self.model is None or (self.route == "completions" and self._tokenizer_path is None):
            body = self.http.get("/v1/models", what="list models")
            data = body.get("data") or []
            if not data:
                from structgen.errors import BackendError

                raise BackendError("the server lists no models", backend=self.name)
            entry = data[0]
            if self.model is not None:
                entry = next((d for d in data if d.get("id") == self.model), entry)
            self.model = self.model or entry.get("id")
            if self._tokenizer_path is None:
                self._tokenizer_path = entry.get("root")
        return version, self._capabilities_for(version)

    # -- translation (pure; tested against documented payloads) ---------------------------
    def constraint_fields(self, spec: ConstraintSpec) -> dict[str, Any]:
        raise NotImplementedError

    def build_payload(self, request: GenerateRequest) -> dict[str, Any]:
        payload: dict[str, Any] = {"model": self.model}
        if self.route == "chat":
            payload["messages"] = self.chat_messages(request)
        else:
            payload["prompt"] = request.prompt
        payload.update(openai_sampling(request.params, self.capabilities.sampling,
                                       max_tokens_field=self.max_tokens_field))
        if request.constraint is not None:
            payload.update(self.constraint_fields(request.constraint))
        return payload

    def chat_messages(self, request: GenerateRequest) -> list[dict[str, Any]]:
        msgs: list[dict[str, Any]] = [{"role": m.role, "content": m.content} for m in request.messages]
        for msg, m in zip(msgs, request.messages, strict=True):
            if m.tool_call_id:  # a tool result answers this call
                msg["tool_call_id"] = m.tool_call_id
        if not msgs:
            return [{"role": "user", "content": request.prompt}]
        if msgs[-1]["role"] == "assistant" and not msgs[-1]["content"]:
            msgs.pop()  # the open assistant turn the server will write
        return msgs

    def parse_text(self, request: GenerateRequest, body: Mapping[str, Any]) -> GenerateResult:
        """``choices[0]``'s text (a BackendError quoting the body when it is not a string)."""
        choice = require(body, "choices", 0, backend=self.name)
        if not isinstance(choice, Mapping):
            raise BackendError(f"unexpected response: choices[0] is not an object: {str(choice)[:200]}",
                               backend=self.name)
        meta: dict[str, Any] = {}
        if self.route == "chat":
            message = require(choice, "message", backend=self.name)
            if not isinstance(message, Mapping):
                raise BackendError(f"unexpected response: choices[0].message is not an object: "
                                   f"{str(message)[:200]}", backend=self.name)
            if message.get("tool_calls"):
                meta["tool_calls"] = message["tool_calls"]
            if message.get("refusal"):
                meta["refusal"] = message["refusal"]
            # content is null when the model only called tools or refused
            text = text_field(message.get("content"), field="choices[0].message.content", body=body,
                              backend=self.name, allow_null=bool(meta))
        else:
            text = text_field(choice.get("text"), field="choices[0].text", body=body, backend=self.name)
        usage = body.get("usage")
        self._count_usage(usage)
        if usage:
            meta["usage"] = usage
        return GenerateResult(text=text, finish_reason=finish_reason(choice.get("finish_reason")),  # type: ignore[arg-type]
                              meta=meta)

    def _generate_flow(self, request: GenerateRequest) -> Flow[GenerateResult]:
        path = "/v1/chat/completions" if self.route == "chat" else "/v1/completions"
        body = yield Call(path, self.build_payload(request), what=f"{self.name} generate")
        return self.parse_text(request, body)


def _strict_choice_schema(choices: tuple[str, ...]) -> dict[str, Any]:
    return {"type": "object", "properties": {"choice": {"type": "string", "enum": list(choices)}},
            "required": ["choice"], "additionalProperties": False}


class OpenAIBackend(OpenAICompatBackend):
    """Any OpenAI-compatible chat server: JSON schema (strict) and choices; no regex/grammar."""

    name = "openai"
    route = "chat"

    def __init__(self, base_url: str = "https://api.openai.com", *,
                 tools: list[dict[str, Any]] | None = None, tool_choice: Any = None, **kw: Any):
        """``tools`` (OpenAI function-tool dicts) and ``tool_choice`` are sent with every
        generation; the calls the model makes come back in ``result.meta["tool_calls"]``."""
        super().__init__(base_url, **kw)
        self.tools = list(tools or [])
        self.tool_choice = tool_choice

    def build_payload(self, request: GenerateRequest) -> dict[str, Any]:
        payload = super().build_payload(request)
        if isinstance(request.constraint, ToolCallSpec):  # gen(tools=...): the API's own tool calling
            payload["messages"] = chat_tool_messages(payload["messages"], request.constraint)
            return payload
        if self.tools:
            payload["tools"] = self.tools
            if self.tool_choice is not None:
                payload["tool_choice"] = self.tool_choice
        return payload

    def _server_version(self) -> str | None:
        return "v1"

    def _capabilities_for(self, version: str | None) -> Capabilities:
        return Capabilities(
            regex=False, json_schema=True, grammar=False, choices=True, select="choice",
            prefix_cache=False, tools=True, streaming=False,
            chat_messages=True,
            sampling=frozenset({"max_new_tokens", "temperature", "top_p", "stop", "seed",
                                "frequency_penalty", "presence_penalty"}))

    def check_generate(self, request: GenerateRequest) -> None:
        super().check_generate(request)
        if request.messages and request.messages[-1].role == "assistant" and request.messages[-1].content:
            raise CapabilityError("continuing a partly written assistant turn (prefill)",
                                  backend=self.name, version=self.version, program=request.program,
                                  variable=request.variable,
                                  hint="OpenAI chat routes start a fresh assistant message")

    def constraint_fields(self, spec: ConstraintSpec) -> dict[str, Any]:
        return FIELDS(spec, self)

    def parse_text(self, request: GenerateRequest, body: Mapping[str, Any]) -> GenerateResult:
        result = super().parse_text(request, body)
        if request.constraint is not None:
            unwrap = ANSWERS.handler(request.constraint)
            if unwrap is not None:
                unwrap(request.constraint, request, result)
        return result


# -- constraint translation, one entry per kind (structgen.constraints.kind) -------------------

#: spec class -> the ``response_format`` of an OpenAI chat request (strict JSON schema)
FIELDS: Translations[dict[str, Any]] = Translations("openai")
#: spec class -> how the answer comes back when a kind is sent as something else (a
#: choice travels as a one-key JSON object): rewrites the result in place
ANSWERS: Translations[None] = Translations("openai answers")


@FIELDS.register(JsonSchemaSpec)
def _json_fields(spec: JsonSchemaSpec, backend: OpenAIBackend) -> dict[str, Any]:
    name = getattr(spec.model, "__name__", None) or "output"
    return {"response_format": {"type": "json_schema", "json_schema": {
        "name": "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in name)[:64],
        "schema": spec.schema_dict, "strict": True}}}


@FIELDS.register(ChoiceSpec)
def _choice_fields(spec: ChoiceSpec, backend: OpenAIBackend) -> dict[str, Any]:
    return {"response_format": {"type": "json_schema", "json_schema": {
        "name": "choice", "schema": _strict_choice_schema(spec.choices), "strict": True}}}


@ANSWERS.register(ChoiceSpec)
def _choice_answer(spec: ChoiceSpec, request: GenerateRequest, result: GenerateResult) -> None:
    try:
        value = json.loads(result.text)["choice"]
    except (ValueError, KeyError, TypeError):
        raise OutputValidationError("choice answer is not the expected JSON object",
                                    raw=result.text, truncated=result.finish_reason == "length",
                                    program=request.program, variable=request.variable) from None
    if value not in spec.choices:
        raise OutputValidationError("choice answer is none of the choices", raw=result.text,
                                    program=request.program, variable=request.variable)
    result.meta["raw"] = result.text
    result.text = value


@FIELDS.register(ToolCallSpec)
def _tool_fields(spec: ToolCallSpec, backend: OpenAIBackend) -> dict[str, Any]:
    if spec.think is not None:
        raise CapabilityError("a thinking section before tool calls (needs a grammar)", backend=backend.name,
                              version=backend.version)
    return tool_fields(spec)


@ANSWERS.register(ToolCallSpec)
def _tool_answer(spec: ToolCallSpec, request: GenerateRequest, result: GenerateResult) -> None:
    result.text = calls_text(spec, {"content": result.text, "tool_calls": result.meta.get("tool_calls")},
                             truncated=result.finish_reason == "length")
