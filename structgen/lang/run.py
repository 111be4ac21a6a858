"""Drivers: the thin I/O shells around the sans-I/O interpreter.

A :class:`Run` owns one top-level program run: its backend, its interpreters (the root
and any forks) and a lock. :meth:`Run.drive` steps every given interpreter to its next
request, checks each against the backend's capabilities (nothing unsupported is sent),
sends all generation requests in one ``backend.generate`` call and all selects in one
``backend.select`` call -- so the children of a fork are served as one batch -- and
delivers each result (or per-request error) back. :meth:`Run.adrive` is the same loop
over the backend's async API.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from contextvars import ContextVar
from typing import Any

from structgen.contract.backend import Backend, GenerateRequest, SamplingParams, SelectRequest
from structgen.errors import BackendError, StructgenError
from structgen.lang.interpreter import Emit, Interpreter, Request

__all__ = ["Run", "current_run"]

#: The run whose program body is executing in this context (thread / asyncio task).
current_run: ContextVar[Run | None] = ContextVar("structgen_current_run", default=None)

_run_ids = itertools.count()


class Run:
    """One top-level program run against one backend."""

    def __init__(self, backend: Backend, *, program: str | None, defaults: SamplingParams,
                 stream: bool = False):
        self.backend = backend
        self.program = program
        self.defaults = defaults
        self.stream = stream
        self.id = f"run{next(_run_ids)}"
        self.lock = threading.RLock()
        self._forks = itertools.count()

    def new_interpreter(self, emit: Emit | None = None) -> Interpreter:
        caps = self.backend.capabilities
        template = None if caps.chat_messages else self.backend.chat_template()
        return Interpreter(program=self.program, defaults=self.defaults, chat_template=template,
                           chat_messages=caps.chat_messages, group=self.id, emit=emit)

    def fork_group_id(self) -> str:
        return f"{self.id}/fork{next(self._forks)}"

    # -- one round: gather requests, check, send, deliver --------------------------------
    def _gather(self, interps: Sequence[Interpreter]) -> tuple[list, list]:
        gens: list[tuple[Interpreter, GenerateRequest]] = []
        sels: list[tuple[Interpreter, SelectRequest]] = []
        for it in interps:
            req: Request | None = it.step()
            if req is None:
                continue
            try:
                if isinstance(req, GenerateRequest):
                    self.backend.check_generate(req)
                    gens.append((it, req))
                else:
                    self.backend.check_select(req)
                    sels.append((it, req))
            except StructgenError as exc:
                it.deliver(exc)
        return gens, sels

    def _on_text(self, gens: list) -> Any:
        if not self.stream:
            return None
        return lambda i, delta: gens[i][0].on_delta(delta)

    def _deliver(self, pairs: list, results: Any) -> None:
        if not isinstance(results, list) or len(results) != len(pairs):
            err = BackendError(f"returned {len(results) if isinstance(results, list) else results!r} "
                               f"results for {len(pairs)} requests", backend=self.backend.name)
            results = [err] * len(pairs)
        for (it, _), res in zip(pairs, results):
            it.deliver(res)

    def _failure(self, exc: BaseException) -> StructgenError:
        if isinstance(exc, StructgenError):
            return exc
        err = BackendError(f"unexpected failure: {type(exc).__name__}: {exc}", backend=self.backend.name)
        err.__cause__ = exc
        return err

    def drive(self, interps: Sequence[Interpreter]) -> None:
        """Run ``interps`` until each is idle (done or failed)."""
        with self.lock:
            while True:
                gens, sels = self._gather(interps)
                if not gens and not sels:  # every interpreter is idle: done or failed
                    return
                if gens:
                    try:
                        results = self.backend.generate([r for _, r in gens], on_text=self._on_text(gens))
                    except BaseException as exc:
                        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                            raise
                        results = [self._failure(exc)] * len(gens)
                    self._deliver(gens, results)
                if sels:
                    try:
                        results = self.backend.select([r for _, r in sels])
                    except BaseException as exc:
                        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                            raise
                        results = [self._failure(exc)] * len(sels)
                    self._deliver(sels, results)

    async def adrive(self, interps: Sequence[Interpreter]) -> None:
        """The async twin of :meth:`drive`, over ``backend.agenerate`` / ``aselect``."""
        while True:
            gens, sels = self._gather(interps)
            if not gens and not sels:
                return
            if gens:
                try:
                    results = await self.backend.agenerate([r for _, r in gens],
                                                           on_text=self._on_text(gens))
                except Exception as exc:
                    results = [self._failure(exc)] * len(gens)
                self._deliver(gens, results)
            if sels:
                try:
                    results = await self.backend.aselect([r for _, r in sels])
                except Exception as exc:
                    results = [self._failure(exc)] * len(sels)
                self._deliver(sels, results)
