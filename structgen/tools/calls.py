"""Tool calls and results as typed values, and the parser that reads them from text.

A tool-calling ``gen`` produces a :class:`ToolTurn`: the free-text answer (``content``),
the thinking text if any, and the :class:`ToolCall` s -- each with an ``id``, the tool
``name``, its validated ``arguments`` (a pydantic model instance for function and model
tools, else a dict), the plain JSON ``raw_arguments`` and the exact ``raw`` text.
:func:`parse_turn` reads a turn in a :class:`~structgen.tools.formats.ToolFormat` and
rejects, as :class:`~structgen.errors.OutputValidationError`, any call of a tool that is
not allowed, arguments that do not validate, or more calls than allowed. Nothing is
``eval``'d: calls are JSON. A turn cut by ``max_tokens`` inside its call block keeps its
whole calls (``ToolTurn.truncated``); cut before the first whole call, it is an error.

Call ids are deterministic (``call_`` + 9 hex digits of a hash of the position, name and
arguments), so the same turn renders the same tool messages and a repeated program
reuses its cached prefix.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from structgen.errors import OutputValidationError, StructgenError
from structgen.tools.definition import Tool
from structgen.tools.formats import ToolFormat

__all__ = ["ToolCall", "ToolResult", "ToolTurn", "call_id", "parse_turn", "split_thinking"]


def call_id(index: int, name: str, arguments: Any) -> str:
    digest = hashlib.sha256(f"{index}\x00{name}\x00{json.dumps(arguments, sort_keys=True)}".encode())
    return "call_" + digest.hexdigest()[:9]


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: Any
    raw_arguments: dict[str, Any]
    raw: str

    def key(self) -> str:
        """Name and canonical arguments: equal keys are the same call (the loop guard)."""
        return self.name + json.dumps(self.raw_arguments, sort_keys=True)


@dataclass
class ToolTurn:
    """What one tool-calling generation produced."""

    content: str
    calls: list[ToolCall] = field(default_factory=list)
    thinking: str | None = None
    raw: str = ""
    #: the turn hit ``max_tokens`` inside its call block: ``calls`` are the complete ones
    truncated: bool = False

    @property
    def is_answer(self) -> bool:
        return not self.calls


@dataclass
class ToolResult:
    """The outcome of running one call: ``value`` or ``error`` (what the model sees)."""

    call: ToolCall
    value: Any = None
    error: str | None = None
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None

    def content(self) -> str:
        """The text the model reads back in the tool turn."""
        if self.error is not None:
            return json.dumps({"error": self.error}, ensure_ascii=False)
        return to_text(self.value)


def to_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if hasattr(value, "model_dump_json"):
        return str(value.model_dump_json())
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def split_thinking(text: str, think: tuple[Any, ...] | None) -> tuple[str | None, str]:
    """``(thinking, rest)``: the thinking section's text and what follows it."""
    if think is None:
        return None, text
    open_, close = think[0], think[1]
    if not text.startswith(open_):
        return None, text
    end = text.find(close, len(open_))
    if end < 0:
        return text[len(open_):], ""
    rest = text[end + len(close):]
    return text[len(open_):end], rest[1:] if rest.startswith("\n") else rest


def _fail(message: str, raw: str, truncated: bool, errors: list[str] | None = None) -> OutputValidationError:
    return OutputValidationError(message, raw=raw, errors=errors or [message], truncated=truncated)


class _Cut(Exception):
    """The call block ends early at the end of a truncated output (after whole calls)."""


def _decode_objects(text: str, fmt: ToolFormat, raw: str, truncated: bool) -> tuple[list[tuple[Any, str]], str]:
    """The call objects in ``text`` (which starts at the first call) with their raw text,
    and the answer after an empty list (formats that open the block under ``auto``).
    Raises :class:`_Cut` when ``truncated`` and the block breaks off after whole calls."""
    dec = json.JSONDecoder()
    out: list[tuple[Any, str]] = []
    pos = 0

    def fail(message: str) -> OutputValidationError | _Cut:
        if truncated and out:  # max_tokens cut the list after whole calls: keep those
            return _Cut(out)
        return _fail(message, raw, truncated)

    if fmt.list_style:
        if not text.startswith(fmt.open + "["):
            raise _fail(f"expected {fmt.open}[ to start the calls", raw, truncated)
        pos = len(fmt.open) + 1
        if text.startswith("]" + fmt.close, pos):  # an empty list: no call
            pos += 1 + len(fmt.close)
            if fmt.opens_in_auto:  # "<tool_call>[]</tool_call>" then the answer
                return out, text[pos:].lstrip()
            if text[pos:].strip():
                raise _fail(f"unexpected text after the tool calls: {text[pos:pos + 40]!r}", raw, truncated)
            return out, ""
        while True:
            try:
                obj, end = dec.raw_decode(text, pos)
            except ValueError as exc:
                raise fail(f"a tool call is not valid JSON: {exc}") from None
            out.append((obj, text[pos:end]))
            pos = end
            if text.startswith(fmt.separator, pos):
                pos += len(fmt.separator)
                continue
            if text.startswith("]" + fmt.close, pos):
                pos += 1 + len(fmt.close)
                break
            raise fail(f"expected {fmt.separator!r} or ']{fmt.close}' after a tool call")
    else:
        while True:
            if not text.startswith(fmt.open, pos):
                raise fail(f"expected {fmt.open!r} to start a tool call")
            pos += len(fmt.open)
            try:
                obj, end = dec.raw_decode(text, pos)
            except ValueError as exc:
                raise fail(f"a tool call is not valid JSON: {exc}") from None
            if not text.startswith(fmt.close, end):
                raise fail(f"expected {fmt.close!r} to end a tool call")
            out.append((obj, text[pos:end]))
            pos = end + len(fmt.close)
            if pos < len(text) and text.startswith(fmt.separator + fmt.open, pos):
                pos += len(fmt.separator)
                continue
            break
    if text[pos:].strip():
        raise _fail(f"unexpected text after the tool calls: {text[pos:pos + 40]!r}", raw, truncated)
    return out, ""


def parse_turn(text: str, fmt: ToolFormat, tools: Sequence[Tool], *, allowed: Sequence[str] | None = None,
               max_calls: int = 1, mode: str = "auto", think: tuple[Any, ...] | None = None,
               truncated: bool = False) -> ToolTurn:
    """Read one turn; validate every call. :class:`OutputValidationError` on any problem."""
    thinking, body = split_thinking(text, think)
    if think is not None and thinking is None:
        raise _fail(f"expected the thinking section to start with {think[0]!r}", text, truncated)
    at = body.find(fmt.trigger) if fmt.text_before else (0 if body.startswith(fmt.trigger) else -1)
    if at < 0:
        if mode == "required":
            raise _fail("a tool call was required but the model answered in text", text, truncated)
        return ToolTurn(content=body, thinking=thinking, raw=text)
    if mode == "none":
        raise _fail("tool calls are not allowed here (tool_choice='none')", text, truncated)
    content = body[:at]
    cut = False
    try:
        objects, answer = _decode_objects(body[at:], fmt, text, truncated)
    except _Cut as exc:  # max_tokens inside the block, after whole calls: those calls stand
        objects, answer, cut = exc.args[0], "", True
    if not objects:  # "<tool_call>[]</tool_call>": the model chose not to call (and may answer after it)
        if mode == "required":
            raise _fail("a tool call was required but the model made none", text, truncated)
        return ToolTurn(content=content + answer, thinking=thinking, raw=text)
    if len(objects) > max_calls:
        raise _fail(f"{len(objects)} tool calls, at most {max_calls} allowed", text, truncated)
    by_name = {t.name: t for t in tools}
    names = set(allowed) if allowed is not None else set(by_name)
    calls: list[ToolCall] = []
    errors: list[str] = []
    for i, (obj, raw) in enumerate(objects):
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            errors.append(f"call {i}: not an object with a string 'name'")
            continue
        name = obj["name"]
        args = obj.get(fmt.args_key, obj.get("arguments", obj.get("parameters", {})))
        if name not in names or name not in by_name:
            errors.append(f"call {i}: tool {name!r} is not allowed (allowed: {sorted(names)})")
            continue
        try:
            typed = by_name[name].validate(args)
        except StructgenError as exc:
            errors.append(f"call {i}: {exc.message if hasattr(exc, 'message') else exc}")
            continue
        plain = args if isinstance(args, dict) else {}
        calls.append(ToolCall(id=call_id(i, name, plain), name=name, arguments=typed, raw_arguments=plain, raw=raw))
    if errors:
        raise _fail("invalid tool call(s)", text, truncated, errors)
    return ToolTurn(content=content, calls=calls, thinking=thinking, raw=text, truncated=cut)
