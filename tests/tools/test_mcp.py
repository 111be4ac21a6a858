"""Item 1 (MCP): tools listed by a live MCP server (official SDK, stdio), called by the loop."""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("mcp")

import structgen as sg
from structgen.backends.fake import FakeBackend
from structgen.tools.formats import INJECTED
from structgen.tools.mcp import MCPTools


@pytest.fixture(scope="module")
def server():
    with MCPTools(sys.executable, ["-m", "programs.mcp_server"], env={"PYTHONPATH": "."}) as srv:
        yield srv


def test_tools_are_listed_with_their_schemas(server):
    names = {t.name: t for t in server.tools}
    assert set(names) == {"lookup_capital", "convert_length", "fail"}
    conv = names["convert_length"]
    assert conv.source == "mcp" and conv.is_async and conv.description == "Convert a length between units."
    assert conv.parameters["required"] == ["value", "from_unit", "to_unit"]
    assert conv.validate({"value": 1, "from_unit": "km", "to_unit": "m"})
    with pytest.raises(sg.ProgramError):
        conv.validate({"value": 1, "from_unit": "parsec", "to_unit": "m"})


def test_the_loop_calls_the_server(server):
    tools = list(server.tools)
    script = [INJECTED.render_calls([("convert_length", {"value": 2, "from_unit": "km", "to_unit": "m"}),
                                     ("lookup_capital", {"country": "Peru"}),
                                     ("fail", {"reason": "boom"})]), "Done."]
    be = FakeBackend(script)

    @sg.program
    def agent(s):
        s += sg.use_tools(tools)
        s += sg.user("go")
        sg.run_tools(s, tools, max_tokens=512)  # room for three calls at one token per character

    st = agent.run(backend=be)
    calls = st.value("agent").steps[0].calls
    assert float(calls[0].result["result"] if isinstance(calls[0].result, dict) else calls[0].result) == 2000.0
    assert "Lima" in str(calls[1].result)
    assert calls[2].error is not None and "boom" in calls[2].error
    assert "boom" in be.requests[1].prompt  # the model sees the server's error
