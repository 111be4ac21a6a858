"""Role rendering from a tokenizer's own chat template.

A :class:`ChatTemplate` wraps a render function ``render(messages) -> str`` (for a
Hugging Face tokenizer: ``apply_chat_template(messages, tokenize=False)``) and derives
the text that opens and closes each role turn by rendering a sentinel message in
context. Nothing about any model's format is hard-coded here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from structgen.errors import ProgramError

__all__ = ["ChatTemplate", "RoleText"]

_SENTINEL = "\u2063STRUCTGEN\u2063CONTENT\u2063"

Render = Callable[[list[dict[str, str]]], str]


@dataclass(frozen=True)
class RoleText:
    prefix: str
    suffix: str


class ChatTemplate:
    """Derives role prefixes/suffixes from a render function over message lists."""

    def __init__(self, render: Render, name: str = "chat_template"):
        self._render = render
        self.name = name
        self._cache: dict[tuple[tuple[tuple[str, str], ...], str], RoleText] = {}

    def render(self, messages: Sequence[dict[str, str]]) -> str:
        return self._render([dict(m) for m in messages]) if messages else ""

    def role(self, role: str, history: Sequence[dict[str, str]]) -> RoleText:
        """The text that opens and closes a ``role`` turn that follows ``history``."""
        key = (tuple((m["role"], m["content"]) for m in history), role)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        try:
            full = self._render([*map(dict, history), {"role": role, "content": _SENTINEL}])
            base = self.render(history)
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
