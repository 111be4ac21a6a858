"""Item 3: the model's own format, on tiny random-weight Qwen2 / Llama / Mistral models.

The template renders the tools (the test's templates, written like their families'),
the grammar constrains the family's call syntax, and tool results go back in the
template's tool role. Random weights: only structure is asserted -- every call names a
tool and validates, the text is exactly what the template renders.
"""

from __future__ import annotations

from typing import Literal

import pytest

import structgen as sg
from structgen.tools.formats import detect_format
from tests.tools.tinymodels import build

pytestmark = pytest.mark.model

CASES = {"qwen2": ("hermes", "# Tools", "<tool_response>"),
         "llama": ("llama3_json", "Given the following functions", "<|start_header_id|>ipython"),
         "mistral": ("mistral", "[AVAILABLE_TOOLS]", "[TOOL_RESULTS]")}


@sg.tool
def switch(device: Literal["lamp", "fan"], state: Literal["on", "off"]) -> str:
    """Switch a device on or off."""
    return f"{device} is {state}"


@sg.tool
def level(value: Literal[1, 2, 3]) -> int:
    """Set the level."""
    return value


TOOLS = [switch, level]


@pytest.fixture(scope="module", params=sorted(CASES))
def tiny(request, tmp_path_factory):
    from structgen.backends.embedded import EmbeddedBackend

    path = build(request.param, tmp_path_factory.mktemp(request.param))
    be = EmbeddedBackend(str(path))
    yield request.param, be
    be.close()


@sg.program
def agent(s, question, k=2):
    s += sg.use_tools(TOOLS)
    s += sg.system("You control a house.")
    s += sg.user(question)
    s += sg.assistant(sg.gen("turn", tools=TOOLS, tool_choice="required", parallel_tool_calls=k, max_tokens=96))
    calls = s.tool_calls("turn")
    results = [sg.ToolResult(c, value=c.name + " done") for c in calls]
    s += sg.tool_results(results)
    s += sg.assistant(sg.gen("final", tools=TOOLS, tool_choice="none", max_tokens=8))


def test_native_format_detected_rendered_constrained(tiny):
    family, be = tiny
    fmt, tools_marker, tool_role = CASES[family]
    template = be.chat_template()
    assert detect_format(template).name == fmt
    st = agent.run(question="Turn the lamp on.", backend=be)
    text = st.text()
    assert tools_marker in text and '"name": "switch"' in text  # the template rendered the tools
    calls = st.tool_calls("turn")
    assert 1 <= len(calls) <= 2
    for c in calls:
        assert c.name in ("switch", "level")
        if c.name == "switch":
            assert c.arguments.device in ("lamp", "fan") and c.arguments.state in ("on", "off")
        else:
            assert c.arguments.value in (1, 2, 3)
    assert tool_role in text  # results in the template's own tool role
    msgs = st.messages()
    tools_openai = [t.openai() for t in TOOLS]
    assert text == template.render(msgs, tools=tools_openai)  # exactly what the template renders
    assert [m["role"] for m in msgs][-len(calls) - 2:] == ["assistant", *["tool"] * len(calls), "assistant"]
    final = st.value("turn")
    assert final.calls == calls


def test_parallel_false_is_exactly_one_call(tiny):
    _, be = tiny
    st = agent.run(question="Fan off.", k=False, backend=be)
    assert len(st.tool_calls("turn")) == 1
