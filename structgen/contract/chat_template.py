"""Role rendering from a tokenizer's own chat template.

A :class:`ChatTemplate` wraps a render function ``render(messages) -> str`` (for a
Hugging Face tokenizer: ``apply_chat_template(messages, tokenize=False)``) and derives
the text that opens and closes each role turn by rendering a sentinel message in
context. Nothing about any model's format is hard-coded here.

``render_tools(messages, tools)`` renders with a tool list (``apply_chat_template(...,
tools=tools)``), for templates that show tools; ``source`` is the template text, from
which :mod:`structgen.tools.formats` reads the model's tool-call syntax.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from structgen.errors import ProgramError

__all__ = ["ChatTemplate", "RoleText"]

_SENTINEL = "\u2063STRUCTGEN\u2063CONTENT\u2063"

Render = Callable[[list[dict[str, str]]], str]
RenderTools = Callable[[list[dict[str, Any]], list[dict[str, Any]]], str]


@dataclass(frozen=True)
class RoleText:
    prefix: str
    suffix: str


class ChatTemplate:
    """Derives role prefixes/suffixes from a render function over message lists."""

    def __init__(self, render: Render, name: str = "chat_template", *, render_tools: RenderTools | None = None,
                 source: str | None = None):
        self._render = render
        self._render_tools = render_tools
        self.name = name
        self.source = source
        self._cache: dict[tuple[Any, ...], RoleText] = {}

    @property
    def can_render_tools(self) -> bool:
        return self._render_tools is not None

    def render(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None) -> str:
        if tools:
            if self._render_tools is None:
                raise ProgramError(f"chat template {self.name} cannot render tools")
            return self._render_tools([dict(m) for m in messages], [dict(t) for t in tools])
        return self._render([dict(m) for m in messages]) if messages else ""

    def role(self, role: str, history: Sequence[dict[str, Any]],
             tools: Sequence[dict[str, Any]] | None = None) -> RoleText:
        """The text that opens and closes a ``role`` turn that follows ``history`` (rendered
        with ``tools`` when given: the tool block lands in whichever turn the template puts it)."""
        key = (tuple(tuple(sorted((k, str(v)) for k, v in m.items())) for m in history), role,
               json.dumps(tools, sort_keys=True) if tools else None)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        try:
            full = self.render([*map(dict, history), {"role": role, "content": _SENTINEL}], tools)
            base = self.render(history, tools) if history else ""
        except Exception as exc:  # jinja errors: e.g. templates that reject a role order
            raise ProgramError(f"chat template {self.name} cannot render role {role!r} "
                               f"after {len(history)} message(s): {exc}") from exc
        at = full.find(_SENTINEL)
        if at < 0:
            raise ProgramError(f"chat template {self.name} dropped the content of a {role!r} turn")
        head = full[:at]
        n = 0
        if head.startswith(base):
            n = len(base)
        else:  # the template rewrote earlier turns: keep what follows the common prefix
            while n < min(len(head), len(base)) and head[n] == base[n]:
                n += 1
        out = RoleText(prefix=head[n:], suffix=full[at + len(_SENTINEL):])
        if len(self._cache) < 4096:
            self._cache[key] = out
        return out

    def continuation(self, history: Sequence[dict[str, Any]], new: Sequence[dict[str, Any]],
                     tools: Sequence[dict[str, Any]] | None = None) -> str:
        """The text that ``new`` complete messages add after ``history`` (several tool
        results, which templates often join into one turn)."""
        try:
            full = self.render([*map(dict, history), *map(dict, new)], tools)
            base = self.render(history, tools) if history else ""
        except Exception as exc:
            raise ProgramError(f"chat template {self.name} cannot render {len(new)} "
                               f"{new[0]['role'] if new else ''} message(s) after {len(history)}: {exc}") from exc
        n = 0
        if full.startswith(base):
            n = len(base)
        else:
            while n < min(len(full), len(base)) and full[n] == base[n]:
                n += 1
        return full[n:]
