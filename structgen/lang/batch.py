"""``run_batch``: many runs of one program, concurrently, each failing alone.

Every item is its own :class:`~structgen.lang.run.Run` on a worker thread; their requests
meet in the backend (the embedded engine batches them). Before the batch fans out, the
prompt text every item sends first is traced and warmed once (``Backend.warm``).

All items share one :class:`~structgen.contract.backend.Cancellation`. Ctrl-C while the
batch runs -- or a ``KeyboardInterrupt`` / ``SystemExit`` raised in an item -- sets it:
the backend stops the outstanding requests, items not started never start, and
:class:`~structgen.errors.BatchInterrupted` is raised with every item's state (finished
ones keep their results; the others failed with ``RequestCancelled``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from structgen.contract.backend import Backend, Cancellation
from structgen.contract.registry import resolve
from structgen.errors import BatchInterrupted, ProgramError, RequestCancelled, StructgenError
from structgen.lang.options import split_options
from structgen.lang.run import Run
from structgen.lang.state import ProgramState

if TYPE_CHECKING:
    from structgen.lang.program import Program

__all__ = ["Batch"]

#: seconds an interrupted batch waits for its cancelled items to wind down
CANCEL_GRACE_S = 10.0


class Batch:
    """One ``run_batch`` call: prepared at construction, run by iterating :meth:`states`."""

    def __init__(self, program: Program[Any], batch_kwargs: Iterable[Mapping[str, Any]], *,
                 backend: Backend | str | None, num_threads: int | str, progress_bar: bool,
                 kwargs: Mapping[str, Any]):
        self.program = program
        self.items = list(batch_kwargs)
        for i, item in enumerate(self.items):
            if not isinstance(item, Mapping):
                raise ProgramError(f"run_batch item {i} is a {type(item).__name__}, not a dict",
                                   program=program.name)
        # options shared by every item are checked once: a bad one fails the call itself
        split_options(dict(kwargs), program.arg_names, program=program.name)
        self.kwargs = dict(kwargs)
        self.backend = resolve(backend)
        if num_threads == "auto":
            self.workers = max(1, min(len(self.items), max(256, (os.cpu_count() or 1) * 16)))
        elif isinstance(num_threads, int) and not isinstance(num_threads, bool) and num_threads >= 1:
            self.workers = num_threads
        else:
            from structgen.errors import OptionError

            raise OptionError("num_threads", num_threads, "a positive int or 'auto'", program=program.name)
        self.progress_bar = progress_bar
        self.cancel = Cancellation()
        self._interrupts: list[BaseException] = []
        self._lock = threading.Lock()

    # -- one item (worker thread) ---------------------------------------------------------------
    def _failed(self, error: StructgenError) -> ProgramState:
        run = Run(self.backend, program=self.program.name, defaults=self.program.sampling_params,
                  cancel=self.cancel)
        run.root.fail(error)
        return run.state

    def _one(self, item: Mapping[str, Any]) -> ProgramState:
        if self.cancel.cancelled:
            return self._failed(self.cancel.error(program=self.program.name))
        try:
            run, body = self.program.new_run((), {**self.kwargs, **item}, backend=self.backend,
                                              cancel=self.cancel)
        except StructgenError as exc:  # a bad option or argument fails this item alone
            return self._failed(exc)
        try:
            run.execute(body)  # an interrupt in the body cancels the whole batch (shared token)
        except BaseException as exc:
            with self._lock:
                self._interrupts.append(exc)
            err = RequestCancelled(f"the item raised {type(exc).__name__}", program=self.program.name)
            err.__cause__ = exc
            run.root.fail(err)
        return run.state

    # -- the batch (caller's thread) ------------------------------------------------------------
    def _warm_shared_prefix(self) -> None:
        if len(self.items) < 2 or not self.backend.capabilities.prefix_cache:
            return
        prefix = self.program.shared_prefix(self.items, backend=self.backend, **self.kwargs)
        if prefix:
            with contextlib.suppress(Exception):  # an optimisation: the items run (and report) regardless
                self.backend.warm(prefix)

    def states(self) -> Iterator[ProgramState]:
        """Start the batch; yield each item's state in input order."""
        self._warm_shared_prefix()
        bar = None
        if self.progress_bar:
            from structgen.lang.progress import BatchProgress

            bar = BatchProgress(len(self.items), self.program.name)
        pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix=f"structgen-{self.program.name}")
        futures = [pool.submit(self._one, item) for item in self.items]
        if bar is not None:
            for fut in futures:
                fut.add_done_callback(bar.done)
        pool.shutdown(wait=False)
        return self._collect(futures, pool, bar)

    def _collect(self, futures: list[Future[ProgramState]], pool: ThreadPoolExecutor,
                 bar: Any) -> Iterator[ProgramState]:
        finished = False
        try:
            for fut in futures:
                try:
                    state = fut.result()
                except BaseException as exc:  # Ctrl-C while waiting
                    raise self._interrupted(futures, pool, exc) from exc
                if self._interrupts:
                    raise self._interrupted(futures, pool, self._interrupts[0]) from self._interrupts[0]
                yield state
            finished = True
        finally:
            if not finished:  # interrupted, or the caller stopped iterating: nothing waits for the rest
                self.cancel.cancel("the batch was abandoned")
            if bar is not None:
                bar.close()

    def _interrupted(self, futures: list[Future[ProgramState]], pool: ThreadPoolExecutor,
                     cause: BaseException) -> BatchInterrupted:
        """Cancel what is outstanding, wait (bounded) for it to stop, gather every state."""
        self.cancel.cancel(f"interrupted by {type(cause).__name__}")
        pool.shutdown(wait=False, cancel_futures=True)
        end = time.monotonic() + CANCEL_GRACE_S
        states: list[ProgramState] = []
        done = 0
        for fut in futures:
            try:
                state = fut.result(timeout=max(0.0, end - time.monotonic()))
            except (CancelledError, TimeoutError, Exception):  # never started, or still stuck
                state = self._failed(self.cancel.error(program=self.program.name))
            done += state.finished
            states.append(state)
        return BatchInterrupted(states, cause, finished=done)
