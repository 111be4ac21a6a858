"""Tool calling: tools from code, constrained calls in the model's own format, the agent loop.

* :mod:`~structgen.tools.definition` -- :class:`Tool`, ``@tool``, :func:`as_tools` (functions,
  pydantic models, OpenAI tool dicts, programs; MCP servers in :mod:`~structgen.tools.mcp`).
* :mod:`~structgen.tools.formats` -- call syntaxes (Hermes, Llama 3 JSON, Mistral, and the
  documented injected ``structgen`` format) and their detection from the chat template.
* :mod:`~structgen.tools.grammar` -- the Lark grammar of a tool-calling turn.
* :mod:`~structgen.tools.spec` -- ``gen(tools=...)`` as a constraint kind.
* :mod:`~structgen.tools.calls` -- typed calls, results and turns; the parser.
* :mod:`~structgen.tools.thinking` -- ``gen(..., think=True)``: reasoning first.
* :mod:`~structgen.tools.executor`, :mod:`~structgen.tools.loop` -- running calls; ``run_tools``.
* :mod:`~structgen.tools.compose` -- programs as tools, :class:`Agent`.
"""

from structgen.tools.calls import ToolCall, ToolResult, ToolTurn
from structgen.tools.compose import Agent, program_tool
from structgen.tools.definition import Tool, ToolArgumentsError, as_tool, as_tools, tool
from structgen.tools.executor import ToolExecutor
from structgen.tools.formats import FORMATS, ToolFormat, detect_format
from structgen.tools.loop import AgentResult, CallRecord, StepRecord, run_tools
from structgen.tools.spec import ToolCallSpec, ToolRequest

__all__ = [
    "FORMATS",
    "Agent",
    "AgentResult",
    "CallRecord",
    "StepRecord",
    "Tool",
    "ToolArgumentsError",
    "ToolCall",
    "ToolCallSpec",
    "ToolExecutor",
    "ToolFormat",
    "ToolRequest",
    "ToolResult",
    "ToolTurn",
    "as_tool",
    "as_tools",
    "detect_format",
    "program_tool",
    "run_tools",
    "tool",
]
