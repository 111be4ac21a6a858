"""Running tool calls: registered tools only, per-tool timeouts, concurrently.

:class:`ToolExecutor` runs a turn's calls at once: async tools natively on an event loop,
sync tools in a thread pool (with the caller's context, so a program called as a tool
runs on the caller's backend), each under its timeout. A tool that raises, times out,
or is not registered becomes a :class:`~structgen.tools.calls.ToolResult` with an
``error`` the model reads -- never a stack trace for the user. Arguments were validated
when the turn was parsed; nothing is ``eval``'d. A sync tool that times out cannot be
killed: its thread finishes in the background and its result is dropped.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from structgen.tools.calls import ToolCall, ToolResult
from structgen.tools.definition import Tool

__all__ = ["ToolExecutor"]


class ToolExecutor:
    """Runs calls of ``tools`` (and only those). ``timeout``: seconds per call unless the
    tool sets its own."""

    def __init__(self, tools: Sequence[Tool], *, timeout: float | None = 30.0, max_workers: int = 8):
        self.tools = {t.name: t for t in tools}
        self.timeout = timeout
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="structgen-tool")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> ToolExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one call --------------------------------------------------------------------------
    async def acall(self, call: ToolCall, *, deadline: float | None = None) -> ToolResult:
        start = time.perf_counter()
        tool = self.tools.get(call.name)
        if tool is None:
            return ToolResult(call, error=f"unknown tool {call.name!r}")
        if tool.fn is None:
            return ToolResult(call, error=f"tool {call.name!r} has no implementation")
        timeout = tool.timeout if tool.timeout is not None else self.timeout
        if deadline is not None:
            left = deadline - time.monotonic()
            timeout = left if timeout is None else min(timeout, left)
            if timeout <= 0:
                return ToolResult(call, error="the run's time limit was reached before this call ran")
        args, kwargs = tool.bind_arguments(call.arguments)
        try:
            if tool.is_async:
                value = await asyncio.wait_for(tool.fn(*args, **kwargs), timeout)
            else:
                ctx = contextvars.copy_context()
                loop = asyncio.get_running_loop()
                fut = loop.run_in_executor(self._pool, lambda: ctx.run(tool.fn, *args, **kwargs))  # type: ignore[arg-type]
                value = await asyncio.wait_for(fut, timeout)
            if asyncio.iscoroutine(value):  # a sync wrapper that returned a coroutine
                value = await asyncio.wait_for(value, timeout)
        except TimeoutError:
            return ToolResult(call, error=f"tool {call.name!r} timed out after {timeout:.3g} s",
                              duration_s=time.perf_counter() - start)
        except Exception as exc:  # the model sees the error; the user's program goes on
            return ToolResult(call, error=f"{type(exc).__name__}: {exc}", duration_s=time.perf_counter() - start)
        return ToolResult(call, value=value, duration_s=time.perf_counter() - start)

    async def arun(self, calls: Sequence[ToolCall], *, deadline: float | None = None) -> list[ToolResult]:
        """All ``calls`` concurrently; results in call order."""
        return list(await asyncio.gather(*(self.acall(c, deadline=deadline) for c in calls)))

    def run(self, calls: Sequence[ToolCall], *, deadline: float | None = None) -> list[ToolResult]:
        """Sync shell over :meth:`arun` (a private event loop; a thread when the caller
        already runs one)."""
        if not calls:
            return []
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.arun(calls, deadline=deadline))
        box: dict[str, Any] = {}
        ctx = contextvars.copy_context()

        def work() -> None:
            try:
                box["out"] = ctx.run(asyncio.run, self.arun(calls, deadline=deadline))
            except BaseException as exc:
                box["err"] = exc

        t = threading.Thread(target=work, name="structgen-tools")
        t.start()
        t.join()
        if "err" in box:
            raise box["err"]
        return box["out"]  # type: ignore[no-any-return]
