"""Tools from a live MCP server, through the official ``mcp`` Python SDK (stdio transport).

    with MCPTools("python", ["my_server.py"]) as server:
        agent = sg.Agent(server.tools)          # each listed tool, with its input schema
        agent.run(question="...")

The server is started as a subprocess; its session lives on a private event loop in a
background thread, so tools are usable from sync programs and from the agent loop's own
event loop alike. Each :class:`~structgen.tools.definition.Tool` is async: a call is sent
to the session (``tools/call``) and awaited. A result flagged ``isError`` raises
:class:`MCPToolError` (the loop shows it to the model as an error result); structured
content is returned as data, text content as text. ``pip install 'structgen-lm[mcp]'``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from structgen.errors import BackendError, StructgenError
from structgen.tools.definition import Tool, clean_schema

__all__ = ["MCPToolError", "MCPTools"]


class MCPToolError(StructgenError):
    """An MCP tool reported an error (``isError``)."""


def _field(obj: Any, snake: str, camel: str) -> Any:
    """An SDK field by its mcp 2 (snake_case) or mcp 1 (camelCase) name."""
    value = getattr(obj, snake, None)
    return getattr(obj, camel, None) if value is None else value


def _content(result: Any) -> Any:
    structured = _field(result, "structured_content", "structuredContent")
    texts = [getattr(c, "text", None) for c in getattr(result, "content", None) or []]
    text = "\n".join(t for t in texts if isinstance(t, str))
    if _field(result, "is_error", "isError"):
        raise MCPToolError(text or "the MCP tool failed")
    if structured is not None:
        return structured
    return text


class MCPTools:
    """A connection to one MCP server over stdio and the tools it lists."""

    def __init__(self, command: str, args: Sequence[str] = (), *, env: dict[str, str] | None = None,
                 cwd: str | None = None, timeout: float = 30.0):
        try:
            import mcp  # noqa: F401
        except ImportError as exc:
            raise BackendError("MCP tools need the mcp SDK: pip install 'structgen-lm[mcp]'", backend="mcp") from exc
        self.command, self.args, self.env, self.cwd, self.timeout = command, list(args), env, cwd, timeout
        self.tools: tuple[Tool, ...] = ()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="structgen-mcp", daemon=True)
        self._session: Any = None
        self._stop: asyncio.Event | None = None
        self._main: Future[None] | None = None
        self._closed = False

    # -- lifecycle --------------------------------------------------------------------
    def start(self) -> MCPTools:
        self._thread.start()
        ready: Future[list[Any]] = Future()
        self._main = asyncio.run_coroutine_threadsafe(self._serve(ready), self._loop)
        try:
            listed = ready.result(timeout=self.timeout)
        except Exception as exc:
            self.close()
            raise BackendError(f"MCP server {self.command} {' '.join(self.args)} did not start: {exc}",
                               backend="mcp") from exc
        self.tools = tuple(self._tool(t) for t in listed)
        return self

    async def _serve(self, ready: Future[list[Any]]) -> None:
        from mcp import ClientSession, StdioServerParameters, stdio_client

        params = StdioServerParameters(command=self.command, args=self.args, env=self.env, cwd=self.cwd)
        self._stop = asyncio.Event()
        try:
            async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                listed = await session.list_tools()
                self._session = session
                ready.set_result(list(listed.tools))
                await self._stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._session = None

    def close(self) -> None:
        """Stop the server and the background loop (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._main is not None:
            with contextlib.suppress(Exception):  # the server's exit status is not ours to report
                self._main.result(timeout=self.timeout)
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=self.timeout)

    def __enter__(self) -> MCPTools:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- tools --------------------------------------------------------------------------
    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        """Call tool ``name`` on the server (from any event loop or thread)."""
        session = self._session
        if session is None:
            raise BackendError("the MCP connection is closed", backend="mcp")
        fut = asyncio.run_coroutine_threadsafe(session.call_tool(name, arguments), self._loop)
        return _content(await asyncio.wrap_future(fut))

    def _tool(self, listed: Any) -> Tool:
        name = str(listed.name)
        schema = dict(_field(listed, "input_schema", "inputSchema") or {"type": "object", "properties": {}})
        connection = self

        async def call(**kwargs: Any) -> Any:
            return await connection.call(name, kwargs)

        return Tool(name=name, description=str(getattr(listed, "description", "") or ""),
                    parameters=clean_schema(schema), fn=call, is_async=True, source="mcp",
                    meta={"server": self.command})
