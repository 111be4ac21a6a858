"""Native tool calling on OpenAI-compatible chat routes, for ``gen(tools=...)``.

A :class:`~structgen.tools.spec.ToolCallSpec` becomes the request's ``tools`` (only the
allowed ones; ``strict: true`` where the schema meets OpenAI's strict rules: every object
closed and every property required), ``tool_choice`` (``auto`` / ``required`` / ``none`` /
one named function) and ``parallel_tool_calls``. The calls that come back are written in
the spec's canonical text so the interpreter parses and validates them like any other
backend's (unknown names, invalid arguments, more than ``k`` calls fail as
``OutputValidationError``). Earlier turns go back as the API expects them: an assistant
message with ``tool_calls`` and ``tool`` messages carrying their ``tool_call_id``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from structgen.errors import OutputValidationError

__all__ = ["calls_text", "chat_tool_messages", "is_tool_spec", "tool_fields"]


def is_tool_spec(spec: Any) -> bool:
    return getattr(spec, "tools_json", None) is not None and hasattr(spec, "call_format")


def _strict_ok(schema: Any) -> bool:
    if isinstance(schema, list):
        return all(_strict_ok(s) for s in schema)
    if not isinstance(schema, dict):
        return True
    if "properties" in schema:
        if schema.get("additionalProperties") is not False:
            return False
        if set(schema.get("required", [])) != set(schema["properties"]):
            return False
    return all(_strict_ok(v) for k, v in schema.items() if k not in ("enum", "const", "default", "examples"))


def tool_fields(spec: Any) -> dict[str, Any]:
    tools: list[dict[str, Any]] = []
    for t in spec.allowed_tools:
        fn = dict(t.openai()["function"])
        if _strict_ok(t.parameters):
            fn["strict"] = True
        tools.append({"type": "function", "function": fn})
    out: dict[str, Any] = {"tools": tools}
    first_name: str = tools[0]["function"]["name"] if tools else ""
    if spec.mode == "none":
        out["tool_choice"] = "none"
    elif spec.mode == "required" and len(tools) == 1:
        out["tool_choice"] = {"type": "function", "function": {"name": first_name}}
    else:
        out["tool_choice"] = spec.mode
    if spec.mode != "none":
        out["parallel_tool_calls"] = spec.max_calls > 1
    return out


def chat_tool_messages(messages: Sequence[Mapping[str, Any]], spec: Any) -> list[dict[str, Any]]:
    """Earlier tool turns in the chat API's shape (assistant ``tool_calls``, ``tool`` ids)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        msg = dict(m)
        if msg.get("role") == "assistant" and spec.call_format.trigger in (msg.get("content") or ""):
            try:
                turn = spec.validate_output(msg["content"])
            except Exception:
                turn = None
            if turn is not None and turn.calls:
                msg = {"role": "assistant", "content": turn.content or None, "tool_calls": [
                    {"id": c.id, "type": "function",
                     "function": {"name": c.name, "arguments": json.dumps(c.raw_arguments)}} for c in turn.calls]}
        elif msg.get("role") == "tool":
            msg = {k: v for k, v in msg.items() if k in ("role", "content", "tool_call_id")}
        out.append(msg)
    return out


def calls_text(spec: Any, message: Mapping[str, Any], *, truncated: bool) -> str:
    """The canonical text of a chat response ``message`` (its content, then its calls)."""
    content = message.get("content") or ""
    calls = []
    for tc in message.get("tool_calls") or []:
        fn = tc.get("function") or {}
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except ValueError as exc:
            raise OutputValidationError(f"tool call arguments are not JSON: {exc}", raw=str(fn.get("arguments")),
                                        truncated=truncated) from None
        calls.append((str(fn.get("name")), args))
    if not calls:
        return content
    return str(spec.render_calls(calls, content if spec.call_format.text_before else ""))
