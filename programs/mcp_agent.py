"""An agent whose tools come from a live MCP server (``programs/mcp_server.py``, stdio).

The server is started as a subprocess through the official ``mcp`` SDK; the tools it
lists (with their JSON schemas) become structgen tools, and each call goes to the server.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import structgen as sg
from structgen.tools.mcp import MCPTools

ROOT = Path(__file__).resolve().parents[1]


def server() -> MCPTools:
    """The demo MCP server, not yet started (use it as a context manager)."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # the caller's path too
    return MCPTools(sys.executable, ["-m", "programs.mcp_server"], env={"PYTHONPATH": path}, cwd=str(ROOT))


@sg.program
def mcp_agent(s, question, tools):
    s += sg.use_tools(tools)
    s += sg.system("Use the tools to answer.")
    s += sg.user(question)
    sg.run_tools(s, tools, name="answer", max_steps=3, max_tokens=96)


if __name__ == "__main__":
    with server() as srv:
        state = mcp_agent.run(question="What is the capital of Peru, and how many metres is 2 km?",
                              tools=list(srv.tools))
        print(state.text())
