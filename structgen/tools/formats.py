"""Tool-call formats: how tools are shown to a model and how its calls are written.

A model trained for tool calling has its own syntax, and its chat template renders the
tool list itself (the ``tools`` argument of ``apply_chat_template``). Known syntaxes:

* ``hermes`` (Qwen2.5 / Qwen3, Hermes): ``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>``
  blocks, one per call, joined by ``\\n``; free text may come first.
* ``llama3_json`` (Llama 3.1 / 3.2 / 3.3): the whole answer is ``{"name": ..., "parameters": ...}``,
  several calls joined by ``; `` (as vLLM's ``llama3_json`` parser reads them).
* ``mistral`` (Mistral v3 tokenizers): ``[TOOL_CALLS][{"name": ..., "arguments": ...}, ...]``.

A template that does not render tools (SmolLM2-135M's, for one) gets the one documented
prompt-injected format, ``structgen``: the tool list as JSON lines inside ``<tools>`` in
the system turn, and calls written as ``<tool_call>[{"name": ..., "arguments": ...}, ...]</tool_call>``
(SmolLM2's own function-calling convention: the turn is the call block and nothing else, and
an empty list means no call). The rule for ``auto``: the turn always *opens* the block, so
the model stands at the decision point right after ``<tool_call>[`` -- it writes either
``]</tool_call>`` (no call), then its free-text answer, or one or more calls. So a turn
is ``<tool_call>[]</tool_call>The answer.`` or ``<tool_call>[{...}, {...}]</tool_call>``.
(A lazy trigger, free text first, lets a small model drift into prose and never call.)
On a backend that returns top log-probabilities, ``auto`` first asks the model whether the
turn opens the block at all (:mod:`structgen.tools.decision`): below a call probability
threshold the turn is a plain answer instead.
Native formats keep the lazy trigger under ``auto``: their models are trained to start a
call block unprompted.

Arguments are JSON as ``tojson`` writes it (``", "`` and ``": "``), the way the templates
render a call back into the history. :func:`detect_format` picks the format from a
template's source and a probe render.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from structgen.contract.chat_template import ChatTemplate

__all__ = ["FORMATS", "INJECTED", "ToolFormat", "detect_format", "inject_tools", "injected_system_text",
           "tools_template"]


@dataclass(frozen=True)
class ToolFormat:
    """One tool-call syntax. ``open``/``close`` wrap each call (``list_style=False``) or the
    JSON list of all calls (``list_style=True``); ``trigger`` is the text that starts a
    call (an answer may never contain it). ``opens_in_auto``: under ``auto`` the turn
    starts with the block; an empty list then the answer means no call (list style only)."""

    name: str
    open: str
    close: str
    separator: str
    args_key: str
    list_style: bool
    text_before: bool
    native: bool
    trigger: str
    opens_in_auto: bool = False

    def call_json(self, name: str, arguments: Any) -> str:
        return json.dumps({"name": name, self.args_key: arguments}, ensure_ascii=False)

    def render_calls(self, calls: Sequence[tuple[str, Any]], content: str = "") -> str:
        """The text a model writes for ``calls`` (canonical form), after ``content``."""
        if not calls:
            return content
        items = [self.call_json(n, a) for n, a in calls]
        if self.list_style:
            body = self.open + "[" + self.separator.join(items) + "]" + self.close
        else:
            body = self.separator.join(self.open + item + self.close for item in items)
        return (content + body) if self.text_before else body


HERMES = ToolFormat("hermes", "<tool_call>\n", "\n</tool_call>", "\n", "arguments", list_style=False,
                    text_before=True, native=True, trigger="<tool_call>")
LLAMA3_JSON = ToolFormat("llama3_json", "", "", "; ", "parameters", list_style=False, text_before=False,
                         native=True, trigger="{")
MISTRAL = ToolFormat("mistral", "[TOOL_CALLS]", "", ", ", "arguments", list_style=True, text_before=False,
                     native=True, trigger="[TOOL_CALLS]")
INJECTED = ToolFormat("structgen", "<tool_call>", "</tool_call>", ", ", "arguments", list_style=True,
                      text_before=True, native=False, trigger="<tool_call>", opens_in_auto=True)
FORMATS = {f.name: f for f in (HERMES, LLAMA3_JSON, MISTRAL, INJECTED)}

_PROBE_TOOL = {"type": "function", "function": {
    "name": "structgen_probe_tool", "description": "probe",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}


def _renders_tools(template: ChatTemplate) -> bool:
    if not template.can_render_tools:
        return False
    try:
        text = template.render([{"role": "user", "content": "hi"}], tools=[_PROBE_TOOL])
    except Exception:
        return False
    return "structgen_probe_tool" in text


def detect_format(template: ChatTemplate | None) -> ToolFormat:
    """The template's native format when it renders tools and its syntax is known, else
    the injected ``structgen`` format."""
    if template is None or not _renders_tools(template):
        return INJECTED
    source = template.source or ""
    if "<tool_call>" in source:
        return HERMES
    if "[TOOL_CALLS]" in source or "[AVAILABLE_TOOLS]" in source:
        return MISTRAL
    if '"parameters"' in source or "<|python_tag|>" in source or "ipython" in source:
        return LLAMA3_JSON
    return INJECTED


# -- the injected format -------------------------------------------------------------------
def injected_system_text(tools: Sequence[dict[str, Any]]) -> str:
    """The instruction block added to the system turn for the ``structgen`` format, laid out
    as SmolLM2's function-calling system prompt is: the task, the tools, then the output
    format (the call block and nothing else; an empty list when no call is needed)."""
    lines = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False) for t in tools)
    return ("You are an expert in composing functions. You are given a question and a set of possible "
            "functions. Based on the question, you will need to make one or more function/tool calls to "
            "achieve the purpose. If none of the functions can be used, make no call and point it out. "
            "If the given question lacks the parameters required by the function, also point it out.\n\n"
            "You have access to the following tools:\n<tools>\n" + lines + "\n</tools>\n\n"
            "The output MUST strictly follow the format below; write the tool calls first and nothing before "
            "them. Make sure every argument has the right type. If no function call is needed, make the tool "
            "calls an empty list: <tool_call>[]</tool_call>\n"
            "<tool_call>[{\"name\": \"func_name1\", \"arguments\": {\"argument1\": \"value1\", "
            "\"argument2\": \"value2\"}}, ... (more tool calls as required)]</tool_call>")


def inject_tools(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with the ``structgen`` tool block at the end of the system turn (one is
    added first when there is none): the prompt the injected format renders."""
    block = injected_system_text(tools)
    out = [dict(m) for m in messages]
    if out and out[0].get("role") == "system":
        content = out[0].get("content") or ""
        out[0]["content"] = f"{content}\n\n{block}" if content else block
    else:
        out.insert(0, {"role": "system", "content": block})
    return out


def tools_template(template: ChatTemplate) -> tuple[ChatTemplate, ToolFormat]:
    """A template that renders ``tools`` (natively, or by injecting the ``structgen`` block
    into the system turn) and the call format that goes with it."""
    cached = getattr(template, "_structgen_tools", None)
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    out = _tools_template(template)
    with contextlib.suppress(AttributeError):
        template._structgen_tools = out  # type: ignore[attr-defined]
    return out


def _tools_template(template: ChatTemplate) -> tuple[ChatTemplate, ToolFormat]:
    fmt = detect_format(template)
    if fmt.native:
        return template, fmt
    base = template

    def render(messages: list[dict[str, Any]]) -> str:
        return base.render(messages)

    def render_tools(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        return base.render(inject_tools(messages, tools))

    return ChatTemplate(render, name=f"{template.name} + structgen tools", render_tools=render_tools,
                        source=template.source), fmt
