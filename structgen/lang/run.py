"""One program run, from body to result: the run lifecycle and the drive loop.

A :class:`Run` owns one top-level program run: its backend, sampling defaults, root
interpreter and state, the stream when it streams, and the :class:`Cancellation` its
requests carry. Its lifecycle is body -> drive -> fail -> raise: :meth:`Run.execute`
runs the program body on the state, drives what the body left queued, records any
failure in the root interpreter (mapped by :func:`~structgen.errors.map_error`: an error
raised below the body is never blamed on it), and :meth:`Run.raise_for_error` raises it.

The drive loop is sans-I/O (:meth:`Run._rounds`): it steps every interpreter to its next
request, checks each against the backend's capabilities (nothing unsupported is sent),
groups the requests by kind (:mod:`structgen.lang.kinds`) -- so the children of a fork go
to the backend as one batch -- and delivers each result or per-request error back.
:meth:`Run.drive` and :meth:`Run.adrive` are its thin sync and async shells with one
exception policy: an ``Exception`` from the backend fails the requests it was serving;
a ``KeyboardInterrupt``, ``SystemExit`` or task cancellation cancels the run's
outstanding requests and propagates.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable, Generator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from structgen.contract.backend import Backend, Cancellation, SamplingParams, TextCallback
from structgen.errors import BackendError, StructgenError, map_error
from structgen.lang.interpreter import Emit, Interpreter
from structgen.lang.kinds import RequestKind
from structgen.lang.state import ProgramState
from structgen.lang.stream import TextStream

__all__ = ["Run", "current_run"]

#: The run whose program body is executing in this context (thread / asyncio task).
current_run: ContextVar[Run | None] = ContextVar("structgen_current_run", default=None)

_run_ids = itertools.count()

#: a program body bound to its arguments: called with the run's state
Body = Callable[[ProgramState], object]


@dataclass
class _Round:
    """The requests of one kind that go to the backend together."""

    kind: RequestKind
    pairs: list[tuple[Interpreter, Any]]

    @property
    def requests(self) -> list[Any]:
        return [req for _, req in self.pairs]


class Run:
    """One top-level program run against one backend."""

    def __init__(self, backend: Backend, *, program: str | None, defaults: SamplingParams,
                 stream: bool = False, cancel: Cancellation | None = None):
        self.backend = backend
        self.program = program
        self.defaults = defaults
        self.id = f"run{next(_run_ids)}"
        self.lock = threading.RLock()
        #: set to stop this run's outstanding requests (shared by the items of a batch)
        self.cancel = cancel if cancel is not None else Cancellation()
        self.stream: TextStream | None = TextStream() if stream else None
        self.thread: threading.Thread | None = None  # a streaming run's program thread
        self._forks = itertools.count()
        caps = backend.capabilities
        self._chat_messages = caps.chat_messages
        self._template = None if caps.chat_messages else backend.chat_template()
        #: the backend streams deltas; else a streaming run gets each generation whole
        self._deltas = caps.streaming
        #: a tool turn's first decision is scored (a one-token probe) where the backend returns
        #: top log-probabilities with their text and its prefix cache makes the probe's prompt
        #: free to reuse
        self._scores = {"top_logprobs_num", "return_text_in_logprobs"} <= caps.sampling and caps.prefix_cache
        #: ... and by relevance (:mod:`structgen.tools.relevance`) where it scores select by
        #: log-probabilities and has a prefix cache (the tools' unconditional scores repeat for
        #: every turn with the same tools: computed once)
        self._ranks = caps.select == "logprobs" and caps.prefix_cache
        self.root = self.new_interpreter(emit=self.stream.emit if self.stream is not None else None)
        self.state = ProgramState(self, self.root)

    def new_interpreter(self, emit: Emit | None = None) -> Interpreter:
        return Interpreter(program=self.program, defaults=self.defaults, chat_template=self._template,
                           chat_messages=self._chat_messages, group=self.id, emit=emit,
                           cancel=self.cancel, scores=self._scores, ranks=self._ranks)

    def fork_group_id(self) -> str:
        return f"{self.id}/fork{next(self._forks)}"

    # -- the lifecycle: body -> drive -> fail -> raise ------------------------------------------
    def execute(self, body: Body) -> None:
        """Run ``body`` on this run's state, then everything it left queued. A failure is
        recorded in the root interpreter; an interrupt cancels the run and propagates."""
        token = current_run.set(self)
        try:
            body(self.state)
            self.drive([self.root])
        except Exception as exc:
            self.root.fail(map_error(exc, "body", program=self.program))
        except BaseException:
            self.cancel.cancel("interrupted")
            raise
        finally:
            current_run.reset(token)

    async def aexecute(self, body: Body) -> None:
        """:meth:`execute` for asyncio: the body runs in a worker thread, what it left
        queued is driven over the backend's async API."""
        def in_thread() -> None:
            token = current_run.set(self)
            try:
                body(self.state)
            finally:
                current_run.reset(token)

        try:
            await asyncio.to_thread(in_thread)
            await self.adrive([self.root])
        except Exception as exc:
            self.root.fail(map_error(exc, "body", program=self.program))
        except BaseException:
            self.cancel.cancel("interrupted")
            raise

    def start(self, body: Body) -> None:
        """Streaming: :meth:`execute` in a thread; the stream closes when the run ends."""
        def target() -> None:
            try:
                self.execute(body)
            finally:
                if self.stream is not None:
                    self.stream.close()

        self.thread = threading.Thread(target=target, name=f"structgen-{self.program}", daemon=True)
        self.thread.start()

    def raise_for_error(self) -> None:
        if self.root.error is not None:
            raise self.root.error

    @property
    def finished(self) -> bool:
        """Ran to the end without an error (for a streaming run: once its thread ended)."""
        thread = self.thread
        return (thread is None or not thread.is_alive()) and self.root.idle and self.root.error is None

    def sync(self, interps: Sequence[Interpreter]) -> None:
        """Run ``interps`` to idle -- or, from outside a streaming run, wait for it to end."""
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
            return
        self.drive(interps)

    # -- the drive loop (sans-I/O) and its two shells --------------------------------------------
    def _rounds(self, interps: Sequence[Interpreter]) -> Generator[_Round, Any, None]:
        """Yield each batch of requests to send; receive the backend's answer for it."""
        while True:
            if self.cancel.cancelled:
                for it in interps:
                    if not it.idle:
                        it.fail(self.cancel.error())
                return
            batches: dict[RequestKind, list[tuple[Interpreter, Any]]] = {}
            for it in interps:
                req = it.step()
                if req is None:
                    continue
                kind = it.pending.kind  # type: ignore[union-attr]  # step returned its request
                try:
                    kind.check(self.backend, req)
                except Exception as exc:
                    it.deliver(map_error(exc, "backend", backend=self.backend.name))
                    continue
                batches.setdefault(kind, []).append((it, req))
            if not batches:  # every interpreter is idle: done or failed
                return
            for kind, pairs in batches.items():
                outcome = yield _Round(kind, pairs)
                self._deliver(pairs, outcome)

    def _deliver(self, pairs: list[tuple[Interpreter, Any]], outcome: Any) -> None:
        if isinstance(outcome, BaseException):
            results: list[Any] = [outcome] * len(pairs)
        elif isinstance(outcome, list) and len(outcome) == len(pairs):
            results = outcome
        else:
            got = len(outcome) if isinstance(outcome, list) else type(outcome).__name__
            results = [BackendError(f"returned {got} results for {len(pairs)} requests",
                                    backend=self.backend.name)] * len(pairs)
        for (it, _), res in zip(pairs, results, strict=True):
            if isinstance(res, BaseException) and not isinstance(res, StructgenError):
                res = map_error(res, "backend", backend=self.backend.name)
            it.deliver(res)

    def _on_text(self, batch: _Round) -> TextCallback | None:
        if self.stream is None or not batch.kind.streams or not self._deltas:
            return None
        pairs = batch.pairs
        return lambda i, delta: pairs[i][0].on_delta(delta)

    def drive(self, interps: Sequence[Interpreter]) -> None:
        """Run ``interps`` until each is idle (done or failed), over the backend's sync API."""
        with self.lock:
            rounds = self._rounds(interps)
            outcome: Any = None
            while True:
                try:
                    batch = rounds.send(outcome)
                except StopIteration:
                    return
                try:
                    outcome = batch.kind.send(self.backend, batch.requests, self._on_text(batch))
                except Exception as exc:
                    outcome = exc
                except BaseException:
                    self.cancel.cancel("interrupted")
                    raise

    async def adrive(self, interps: Sequence[Interpreter]) -> None:
        """:meth:`drive` over the backend's async API."""
        rounds = self._rounds(interps)
        outcome: Any = None
        while True:
            try:
                batch = rounds.send(outcome)
            except StopIteration:
                return
            try:
                outcome = await batch.kind.asend(self.backend, batch.requests, self._on_text(batch))
            except Exception as exc:
                outcome = exc
            except BaseException:
                self.cancel.cancel("interrupted")
                raise
