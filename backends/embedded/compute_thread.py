"""The one thread that runs an embedded engine's torch work, model loading included.

Why one thread: torch's CPU kernels parallelise with OpenMP, and libgomp keeps a team of
worker threads for every thread that has run a parallel region. Once the process counts
more OpenMP threads than cores (two teams of two on two cores), libgomp stops spinning
between parallel regions ("throttled" waits): each kernel then wakes its workers through
the kernel, which costs more than a small kernel itself. Loading a model on the caller's
thread and decoding on the engine's thread made exactly that second team. Measured on
2 cores: a bfloat16 multiply of ``[256, 576]`` took 18-22 us on the only thread to run
torch work and 44-100 us on a second one; the extraction job (512 of
``bench/extract.py``'s documents) went from 11.0-11.2 to 14.7 docs/s, and from 1.40 to
1.83 cores busy, once the load and the engine ran on one thread.

So :class:`~structgen.backends.embedded.engine.Engine` builds its model, pools and loop
on a :class:`ComputeThread`, and :class:`~structgen.backends.embedded.adapter.EmbeddedBackend`
loads the transformers model on the same one. Torch work a caller runs on its own thread
(another model, its own tensors) still makes a second team; the engine then runs as
before, only slower. The thread takes the caller's ``torch.get_num_threads()`` when it is
created, so ``torch.set_num_threads(n)`` before building a backend still bounds it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = ["ComputeThread"]

T = TypeVar("T")


class ComputeThread:
    """A daemon thread that runs submitted callables one after another, in order.

    A callable may run for as long as it likes (an engine's loop does, until it is
    closed); later ones wait for it. :meth:`stop` ends the thread once the queue before
    it has run.
    """

    def __init__(self, name: str = "structgen-engine", *, num_threads: int | None = None) -> None:
        if num_threads is None:
            import torch
            num_threads = torch.get_num_threads()
        self.num_threads = num_threads
        self._queue: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """Queue ``fn``; its future holds what it returns or raises."""
        fut: Future[T] = Future()
        self._queue.put((fn, fut))
        return fut

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the thread and wait for it; its exception is raised here."""
        if self.is_current():
            return fn()
        return self.submit(fn).result()

    def is_current(self) -> bool:
        return threading.current_thread() is self._thread

    def stop(self, timeout: float | None = 30) -> None:
        """End the thread after what is queued; wait up to ``timeout`` seconds for it."""
        self._queue.put(None)
        if not self.is_current():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        import torch
        if torch.get_num_threads() != self.num_threads:
            torch.set_num_threads(self.num_threads)
        while (item := self._queue.get()) is not None:
            fn, fut = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as exc:
                fut.set_exception(exc)
