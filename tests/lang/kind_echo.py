"""A request kind defined outside structgen, as a third party would add one: ``echo``.

``echo(name, text)`` asks the backend to repeat ``text`` (a stand-in for any new kind of
work: embeddings, scoring, classification). It is one module: the IR node, the request
and result, the DSL function, and one :func:`structgen.lang.kinds.register` call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from structgen.contract.backend import Backend
from structgen.errors import CapabilityError
from structgen.lang.ir import Expr
from structgen.lang.kinds import RequestKind, register


@dataclass(frozen=True)
class Echo(Expr):
    name: str | None
    text: str


@dataclass(frozen=True)
class EchoRequest:
    text: str
    prompt: str
    program: str | None = None
    variable: str | None = None


@dataclass
class EchoResult:
    text: str


def echo(name: str | None, text: str) -> Echo:
    return Echo(name, text)


def _start(interp: Any, node: Echo, name: str) -> EchoRequest:
    return EchoRequest(text=node.text, prompt=interp.text, program=interp.program, variable=name)


def _finish(interp: Any, pending: Any, result: EchoResult) -> None:
    interp.record(pending.name, result.text, result.text, {"kind": "echo"})


def _check(backend: Backend, request: EchoRequest) -> None:
    if not hasattr(backend, "echo"):
        raise CapabilityError("echo requests", backend=backend.name, program=request.program,
                              variable=request.variable)


def _send(backend: Any, requests: Sequence[EchoRequest], on_text: Any) -> list[Any]:
    return list(backend.echo(requests))


async def _asend(backend: Any, requests: Sequence[EchoRequest], on_text: Any) -> list[Any]:
    return list(backend.echo(requests))


ECHO = register(RequestKind(name="echo", node=Echo, request=EchoRequest, start=_start, finish=_finish,
                            check=_check, send=_send, asend=_asend))
