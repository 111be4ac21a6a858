"""The program IR: frozen data, no behaviour beyond composition.

Users build these nodes with the DSL (``gen``, ``select``, ``user(...)``, ``"text" + gen()``)
and append them to a state with ``s += node``. The interpreter walks them; backends
never see them (they see :mod:`structgen.contract.backend` requests). No node knows an engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from structgen.constraints.spec import (  # the dtype regexes: SGLang keeps them in sglang.lang.ir
    REGEX_BOOL,
    REGEX_FLOAT,
    REGEX_INT,
    REGEX_STR,
    ConstraintSpec,
)
from structgen.contract.backend import SamplingParams

__all__ = [
    "REGEX_BOOL",
    "REGEX_FLOAT",
    "REGEX_INT",
    "REGEX_STR",
    "Concat",
    "Expr",
    "Gen",
    "Node",
    "RoleBegin",
    "RoleEnd",
    "Select",
    "Text",
    "ToolMessages",
    "UseTools",
    "VarScopeBegin",
    "VarScopeEnd",
    "as_node",
    "flatten",
]


class Expr:
    """Base of all IR nodes: ``a + b`` concatenates."""

    __slots__ = ()

    def __add__(self, other: Any) -> Concat:
        return Concat((self, as_node(other)))

    def __radd__(self, other: Any) -> Concat:
        return Concat((as_node(other), self))


@dataclass(frozen=True)
class Text(Expr):
    value: str


@dataclass(frozen=True)
class Gen(Expr):
    """Generate text into variable ``name`` under an optional constraint.

    ``params`` holds only what the user set explicitly (validated by ``gen``); run-level
    defaults fill in the rest. ``dtype`` converts the typed value (int/float/bool/str).
    """

    name: str | None
    params: tuple[tuple[str, Any], ...] = ()
    constraint: ConstraintSpec | None = None
    dtype: Any = None
    retries: int = 0

    def sampling(self, defaults: SamplingParams) -> SamplingParams:
        return _merge(defaults, self.params) if self.params else defaults


@lru_cache(maxsize=1024)
def _merge(defaults: SamplingParams, params: tuple[tuple[str, Any], ...]) -> SamplingParams:
    return replace(defaults, **dict(params))


@dataclass(frozen=True)
class Select(Expr):
    """Choose one of ``choices`` by scoring, into variable ``name``."""

    name: str | None
    choices: tuple[str, ...]
    temperature: float = 0.0
    method: Any = field(default=None, compare=False)


@dataclass(frozen=True)
class RoleBegin(Expr):
    role: str


@dataclass(frozen=True)
class RoleEnd(Expr):
    role: str


@dataclass(frozen=True)
class VarScopeBegin(Expr):
    name: str


@dataclass(frozen=True)
class VarScopeEnd(Expr):
    name: str


@dataclass(frozen=True)
class UseTools(Expr):
    """Show ``tools`` to the model: role turns from here on render with the tool list."""

    tools: tuple[Any, ...]


@dataclass(frozen=True)
class ToolMessages(Expr):
    """Tool results, each ``(content, call_id, tool name)``, as the template's tool turn(s)."""

    results: tuple[tuple[str, str | None, str | None], ...]


@dataclass(frozen=True)
class Concat(Expr):
    items: tuple[Expr, ...]


Node = Text | Gen | Select | RoleBegin | RoleEnd | VarScopeBegin | VarScopeEnd | UseTools | ToolMessages | Concat


def as_node(value: Any) -> Expr:
    """Coerce ``str`` (and lists of nodes) to IR nodes; reject anything else."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, str):
        return Text(value)
    if isinstance(value, (list, tuple)):
        return Concat(tuple(as_node(v) for v in value))
    from structgen.errors import ProgramError

    raise ProgramError(f"cannot append a {type(value).__name__} to a program state "
                       "(use a str, gen(...), select(...) or a role)")


def flatten(node: Expr) -> Iterator[Expr]:
    """The leaf nodes of ``node`` in order (``Concat`` flattened)."""
    if isinstance(node, Concat):
        for item in node.items:
            yield from flatten(item)
    else:
        yield node
