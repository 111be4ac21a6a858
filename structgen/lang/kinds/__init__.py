"""Request kinds: the one table the interpreter and the drive loop dispatch through.

A program asks a backend for two kinds of work today: ``generate`` (:mod:`.generate`, from
``gen``) and ``select`` (:mod:`.select`, from ``select`` / ``gen(choices=...)``); a third,
``tool_relevance`` (:mod:`.relevance`), is a ``select`` that a tool turn's ``generate``
sends first to decide the turn (no node of its own). Each kind is
one :class:`RequestKind`: the IR node that starts it, how the interpreter turns the node
into a request and records the result, how a backend's capabilities are checked, and how
a batch of its requests is sent (sync and async). Adding a kind is one new module that
defines its node, request and result and calls :func:`register` (steps in
backends/README.md, "Adding a request kind").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from structgen.contract.backend import Backend, TextCallback
from structgen.errors import StructgenError

if TYPE_CHECKING:
    from structgen.lang.interpreter import Interpreter, Pending

__all__ = ["RequestKind", "kind_for_node", "kind_of", "kinds", "register"]

#: a backend's answer for a batch: per request a result or the error it failed with
Results = list[Any]


@dataclass(frozen=True, eq=False)
class RequestKind:
    """One kind of request: from IR node to backend and back.

    ``start(interp, node, name)`` builds the request for ``node`` (its variable ``name``);
    ``finish(interp, pending, result)`` records a result in the interpreter (or raises a
    :class:`StructgenError`, or calls ``interp.resend`` to retry); ``check(backend, req)``
    raises :class:`~structgen.errors.CapabilityError` before sending what the backend
    cannot honour; ``send`` / ``asend`` serve a batch. ``streams``: results arrive as text
    deltas through ``on_text`` (generation), not whole. ``on_error(interp, pending, error)``,
    if given, may recover from an error the backend returned (retry): True when it did.
    """

    name: str
    #: the IR node that starts it; None for a kind another kind's ``finish`` starts (a tool
    #: turn's relevance scoring)
    node: type[Any] | None
    request: type[Any]
    start: Callable[[Interpreter, Any, str], Any]
    finish: Callable[[Interpreter, Pending, Any], None]
    check: Callable[[Backend, Any], None]
    send: Callable[[Backend, Sequence[Any], TextCallback | None], Results]
    asend: Callable[[Backend, Sequence[Any], TextCallback | None], Awaitable[Results]]
    streams: bool = False
    on_error: Callable[[Interpreter, Pending, BaseException], bool] | None = None

    def __repr__(self) -> str:
        return f"<RequestKind {self.name}>"


_by_node: dict[type[Any], RequestKind] = {}
_by_request: dict[type[Any], RequestKind] = {}


def register(kind: RequestKind) -> RequestKind:
    """Add ``kind`` to the table (its node and request classes must be new to it)."""
    for table, key in ((_by_node, kind.node), (_by_request, kind.request)):
        if key is None:
            continue
        other = table.get(key)
        if other is not None and other is not kind:
            raise ValueError(f"{key.__name__} already belongs to request kind {other.name!r}")
    if kind.node is not None:
        _by_node[kind.node] = kind
    _by_request[kind.request] = kind
    return kind


def kind_for_node(node_type: type[Any]) -> RequestKind | None:
    """The kind an IR node starts, or None for prompt-side nodes (text, roles, scopes)."""
    return _by_node.get(node_type)


def kind_of(request: Any) -> RequestKind:
    kind = _by_request.get(type(request))
    if kind is None:
        raise StructgenError(f"no request kind is registered for {type(request).__name__}")
    return kind


def kinds() -> list[RequestKind]:
    """Every registered kind, in registration order."""
    return list(_by_request.values())


# the built-in kinds register themselves
from structgen.lang.kinds import generate as _generate  # noqa: E402, F401
from structgen.lang.kinds import relevance as _relevance  # noqa: E402, F401
from structgen.lang.kinds import select as _select  # noqa: E402, F401
