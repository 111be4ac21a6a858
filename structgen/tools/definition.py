"""Tool definitions: what a model may call, with its name, description and argument schema.

A :class:`Tool` comes from a typed Python function (``@tool``; sync or async; the argument
schema is built by pydantic from the signature: defaults, ``Annotated[..., Field(...)]``,
enums, nested models), from a pydantic model (a tool without an implementation: calling
it *is* the result), from an OpenAI-format tool dict, or from a live MCP server
(:mod:`structgen.tools.mcp`). :func:`as_tools` accepts any mix of these.

Argument schemas are closed (``additionalProperties: false`` on every object that lists
its properties) so a call can never carry an unknown argument, and ``title`` annotations
are dropped (they cost prompt tokens and say nothing the name does not).
"""

from __future__ import annotations

import inspect
import json
import re
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from structgen.errors import ProgramError

__all__ = ["Tool", "ToolArgumentsError", "as_tool", "as_tools", "tool"]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,63}$")
#: keys whose values are maps of names to schemas (a property called "title" is kept)
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")


class ToolArgumentsError(ProgramError):
    """A call's arguments do not validate against its tool's schema."""


@dataclass(frozen=True, eq=False)
class Tool:
    """One callable tool. ``fn`` is None for a tool that only describes a result shape."""

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any] | None = None
    is_async: bool = False
    timeout: float | None = None
    #: the pydantic model of the arguments (function and model tools): typed arguments
    args_model: Any = None
    #: how ``fn`` takes its arguments: "kwargs" (a function), "model" (one model instance)
    call_style: str = "kwargs"
    source: str = "function"
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ProgramError(f"tool name {self.name!r} must be 1-64 letters, digits, '_', '-' or '.', "
                               "starting with a letter or '_'")
        if not isinstance(self.parameters, dict) or self.parameters.get("type", "object") != "object":
            raise ProgramError(f"tool {self.name!r}: parameters must be a JSON schema of type object")

    @property
    def schema_json(self) -> str:
        return json.dumps(self.parameters, separators=(",", ":"), sort_keys=False)

    def openai(self) -> dict[str, Any]:
        """The OpenAI function-tool dict (also what chat templates take as ``tools``)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}

    def validate(self, arguments: Any) -> Any:
        """Check ``arguments`` (a dict) against the schema; return the typed arguments
        (a pydantic model instance when the tool has one, else the dict).
        :class:`ToolArgumentsError` lists every problem with its JSON path."""
        from structgen.constraints.schema import error_path, schema_validator

        if not isinstance(arguments, dict):
            raise ToolArgumentsError(f"tool {self.name!r}: arguments must be a JSON object, "
                                     f"not {type(arguments).__name__}")
        errors = sorted(schema_validator(self.parameters).iter_errors(arguments),
                        key=lambda e: list(map(str, e.path)))
        if errors:
            msgs = "; ".join(f"{error_path(e.path)}: {e.message}" for e in errors[:10])
            raise ToolArgumentsError(f"tool {self.name!r}: invalid arguments: {msgs}")
        if self.args_model is None:
            return arguments
        try:
            return self.args_model.model_validate(arguments)
        except ValueError as exc:
            raise ToolArgumentsError(f"tool {self.name!r}: invalid arguments: {exc}") from exc

    def bind_arguments(self, typed: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``(args, kwargs)`` for calling ``fn`` with validated, typed arguments."""
        if self.call_style == "model":
            return (typed,), {}
        if self.args_model is not None and not isinstance(typed, dict):
            return (), {name: getattr(typed, name) for name in type(typed).model_fields}
        return (), dict(typed)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the implementation directly (a decorated function stays callable)."""
        if self.fn is None:
            raise ProgramError(f"tool {self.name!r} has no implementation")
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Tool({self.name!r}, source={self.source})"


# -- schemas -------------------------------------------------------------------------------
def clean_schema(node: Any, *, close: bool = True) -> Any:
    """Drop ``title`` annotations; close objects that list properties (no extra keys)."""
    if isinstance(node, list):
        return [clean_schema(v, close=close) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {k: clean_schema(v, close=close) for k, v in value.items()}
        else:
            out[key] = clean_schema(value, close=close)
    if close and "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _doc_parts(doc: str | None) -> tuple[str, dict[str, str]]:
    """The description (text before any ``Args:`` section) and per-argument docs."""
    text = inspect.cleandoc(doc or "")
    head, args = text, {}
    match = re.search(r"^(Args|Arguments|Parameters):\s*$", text, flags=re.M)
    if match:
        head = text[:match.start()].strip()
        current = None
        for line in text[match.end():].splitlines():
            if line and not line.startswith((" ", "\t")):
                break
            item = re.match(r"^\s{1,8}(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", line)
            if item:
                current = item.group(1)
                args[current] = item.group(2).strip()
            elif current and line.strip():
                args[current] = (args[current] + " " + line.strip()).strip()
    return " ".join(head.split()), args


def _function_model(fn: Callable[..., Any], name: str, arg_docs: dict[str, str]) -> Any:
    import pydantic

    hints = typing.get_type_hints(fn, include_extras=True)
    fields: dict[str, Any] = {}
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ProgramError(f"tool {name!r}: *args / **kwargs cannot be described as a schema")
        if p.name not in hints:
            raise ProgramError(f"tool {name!r}: parameter {p.name!r} needs a type annotation")
        ann = hints[p.name]
        default = ... if p.default is inspect.Parameter.empty else p.default
        if p.name in arg_docs and not _has_description(ann):
            ann = typing.Annotated[ann, pydantic.Field(description=arg_docs[p.name])]
        fields[p.name] = (ann, default)
    model_name = "".join(part.capitalize() for part in re.split(r"[^A-Za-z0-9]", name) if part) + "Args"
    return pydantic.create_model(model_name, __config__=pydantic.ConfigDict(extra="forbid"), **fields)


def _has_description(ann: Any) -> bool:
    return any(getattr(m, "description", None) for m in getattr(ann, "__metadata__", ()))


def _from_function(fn: Callable[..., Any], *, name: str | None, description: str | None,
                   timeout: float | None) -> Tool:
    tool_name = name or getattr(fn, "__name__", None) or "tool"
    doc, arg_docs = _doc_parts(getattr(fn, "__doc__", None))
    model = _function_model(fn, tool_name, arg_docs)
    params = clean_schema(model.model_json_schema())
    params.setdefault("properties", {})
    return Tool(name=tool_name, description=description if description is not None else doc,
                parameters=params, fn=fn, is_async=inspect.iscoroutinefunction(fn), timeout=timeout,
                args_model=model, call_style="kwargs", source="function")


def _is_model_class(obj: Any) -> bool:
    return isinstance(obj, type) and hasattr(obj, "model_json_schema") and hasattr(obj, "model_validate")


def _from_model(model: Any, *, name: str | None, description: str | None, fn: Callable[..., Any] | None,
                timeout: float | None) -> Tool:
    doc, _ = _doc_parts(model.__doc__ if model.__doc__ != _base_doc(model) else "")
    return Tool(name=name or model.__name__, description=description if description is not None else doc,
                parameters=clean_schema(model.model_json_schema()), fn=fn,
                is_async=fn is not None and inspect.iscoroutinefunction(fn), timeout=timeout,
                args_model=model, call_style="model", source="model")


def _base_doc(model: Any) -> str | None:
    for base in model.__mro__[1:]:
        if base.__name__ == "BaseModel":
            return base.__doc__  # type: ignore[no-any-return]
    return None


def _from_openai(spec: Mapping[str, Any], *, fn: Callable[..., Any] | None, timeout: float | None) -> Tool:
    inner = spec.get("function", spec) if spec.get("type", "function") == "function" else None
    if not isinstance(inner, Mapping) or "name" not in inner:
        raise ProgramError(f"not an OpenAI function tool: {json.dumps(spec)[:200]}")
    params = inner.get("parameters") or {"type": "object", "properties": {}}
    if not isinstance(params, dict):
        raise ProgramError(f"tool {inner['name']!r}: parameters must be a JSON schema object")
    return Tool(name=str(inner["name"]), description=str(inner.get("description") or ""),
                parameters=clean_schema(params, close=bool(inner.get("strict", True))), fn=fn,
                is_async=fn is not None and inspect.iscoroutinefunction(fn), timeout=timeout,
                source="openai")


def as_tool(obj: Any, *, name: str | None = None, description: str | None = None,
            fn: Callable[..., Any] | None = None, timeout: float | None = None) -> Tool:
    """A :class:`Tool` from a Tool, a typed function, a pydantic model class, an OpenAI
    tool dict (``fn`` gives it an implementation) or a structgen program."""
    if isinstance(obj, Tool):
        return obj
    if _is_model_class(obj):
        return _from_model(obj, name=name, description=description, fn=fn, timeout=timeout)
    if isinstance(obj, Mapping):
        return _from_openai(obj, fn=fn, timeout=timeout)
    from structgen.lang.program import Program

    if isinstance(obj, Program):
        from structgen.tools.compose import program_tool

        return program_tool(obj, name=name, description=description, timeout=timeout)
    if callable(obj):
        return _from_function(obj, name=name, description=description, timeout=timeout)
    raise ProgramError(f"cannot make a tool from {type(obj).__name__}: use a typed function, a pydantic "
                       "model, an OpenAI tool dict, a program or an MCP server's tools")


def as_tools(objs: Iterable[Any] | Any) -> tuple[Tool, ...]:
    """:func:`as_tool` over a list (names must be unique)."""
    if isinstance(objs, (Tool, Mapping)) or callable(objs):
        objs = [objs]
    out = tuple(as_tool(o) for o in objs)
    seen: set[str] = set()
    for t in out:
        if t.name in seen:
            raise ProgramError(f"two tools are named {t.name!r}")
        seen.add(t.name)
    if not out:
        raise ProgramError("tools must not be empty")
    return out


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None, description: str | None = None,
         timeout: float | None = None) -> Any:
    """Decorate a typed function (sync or async) as a :class:`Tool`; usable bare or with
    options. The description is the docstring's text before its ``Args:`` section, whose
    entries describe the arguments."""
    if fn is not None:
        return as_tool(fn, name=name, description=description, timeout=timeout)

    def decorate(f: Callable[..., Any]) -> Tool:
        return as_tool(f, name=name, description=description, timeout=timeout)

    return decorate
