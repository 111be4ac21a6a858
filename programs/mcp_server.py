"""A small MCP server (stdio) written with the official SDK's own server API.

Tools: ``lookup_capital(country)``, ``convert_length(value, from_unit, to_unit)`` and
``fail(reason)`` (always errors). Used by ``programs/mcp_agent.py`` and the MCP tests.
Run: ``python -m programs.mcp_server`` (it speaks MCP on stdin/stdout).
"""

from __future__ import annotations

from enum import StrEnum

try:  # mcp 2.x
    from mcp.server.mcpserver import MCPServer as _Server
    from mcp.server.mcpserver.exceptions import ToolError
except ImportError:  # mcp 1.x
    from mcp.server.fastmcp import FastMCP as _Server  # type: ignore[no-redef]
    from mcp.server.fastmcp.exceptions import ToolError  # type: ignore[no-redef]

CAPITALS = {"france": "Paris", "japan": "Tokyo", "kenya": "Nairobi", "peru": "Lima"}
METERS = {"m": 1.0, "km": 1000.0, "cm": 0.01, "ft": 0.3048, "mi": 1609.344}


class LengthUnit(StrEnum):
    m = "m"
    km = "km"
    cm = "cm"
    ft = "ft"
    mi = "mi"


server = _Server("structgen-demo")


@server.tool()
def lookup_capital(country: str) -> str:
    """The capital city of a country."""
    try:
        return CAPITALS[country.strip().lower()]
    except KeyError:
        raise ToolError(f"no capital known for {country!r}") from None


@server.tool()
def convert_length(value: float, from_unit: LengthUnit, to_unit: LengthUnit) -> float:
    """Convert a length between units."""
    return value * METERS[LengthUnit(from_unit).value] / METERS[LengthUnit(to_unit).value]


@server.tool()
def fail(reason: str) -> str:
    """Always fails (for tests)."""
    raise ToolError(reason)


if __name__ == "__main__":
    server.run("stdio")
