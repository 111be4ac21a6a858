"""Programs compose: a program called as a tool, and an agent as a program.

:func:`program_tool` makes a structgen program a :class:`~structgen.tools.definition.Tool`:
its arguments (after ``s``) become the tool's schema (typed like ``@tool`` functions), and
a call runs the program on the caller's backend, returning its ``output`` variable's value
(``"answer"`` by default, else every variable). :class:`Agent` is the usual shape of an
agent program -- tools shown, an optional system prompt, the user's question, the loop --
as a program: ``run``, ``run_batch`` (whose shared system prompt and tool block the backend
computes once) and ``as_tool`` (an agent as another agent's tool).
"""

from __future__ import annotations

import inspect
import typing
from typing import Any

from structgen.errors import ProgramError
from structgen.tools.definition import Tool, _doc_parts, _function_model, as_tools, clean_schema

__all__ = ["Agent", "program_tool"]


def program_tool(program: Any, *, name: str | None = None, description: str | None = None,
                 timeout: float | None = None, output: str | None = None) -> Tool:
    func = program.func
    params = list(inspect.signature(func).parameters.values())[1:]
    tool_name = name or program.name
    doc, arg_docs = _doc_parts(func.__doc__)

    def signature_only(**kwargs: Any) -> None:  # the program's arguments, without ``s``
        return None

    hints = typing.get_type_hints(func, include_extras=True)
    annotations: dict[str, Any] = {}
    for p in params:  # an untyped argument is a string (or its default's type)
        default_type = type(p.default) if p.default not in (inspect.Parameter.empty, None) else str
        annotations[p.name] = hints.get(p.name, default_type)
    signature_only.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [p.replace(annotation=annotations[p.name]) for p in params])
    signature_only.__annotations__ = annotations
    model = _function_model(signature_only, tool_name, arg_docs)

    def call(**kwargs: Any) -> Any:
        state = program.run(**kwargs)  # the caller's backend, through the copied run context
        key = output or ("answer" if "answer" in state else None)
        if key is not None:
            return state.value(key) if output else state[key]
        return {k: v for k, v in state.values().items() if isinstance(v, (str, int, float, bool, list, dict))}

    return Tool(name=tool_name, description=description if description is not None else doc,
                parameters=clean_schema(model.model_json_schema()), fn=call, timeout=timeout, args_model=model,
                source="program")


class Agent:
    """An agent program: ``Agent(tools, system=...).run(question=...)``.

    ``loop`` options go to :func:`structgen.tools.loop.run_tools`; the answer is the
    variable ``answer`` and the :class:`~structgen.tools.loop.AgentResult` its value.
    """

    def __init__(self, tools: Any, *, system: str | None = None, name: str = "agent",
                 backend: Any = None, **loop: Any):
        from structgen.lang.program import Program

        self.tools = as_tools(tools)
        self.system = system
        self.loop = loop
        self.name = name
        agent = self

        def body(s: Any, question: str) -> None:
            agent.conversation(s, question)

        body.__name__ = name
        self.program = Program(body, name=name, backend=backend)

    def conversation(self, s: Any, question: str) -> Any:
        from structgen.lang.api import system, use_tools, user
        from structgen.tools.loop import run_tools

        s += use_tools(self.tools)
        if self.system:
            s += system(self.system)
        s += user(question)
        return run_tools(s, self.tools, name="answer", **self.loop)

    def run(self, question: str, **kwargs: Any) -> Any:
        return self.program.run(question=question, **kwargs)

    def run_batch(self, questions: list[str], **kwargs: Any) -> Any:
        if not isinstance(questions, list):
            raise ProgramError("run_batch takes a list of questions")
        return self.program.run_batch([{"question": q} for q in questions], **kwargs)

    def as_tool(self, *, name: str | None = None, description: str | None = None) -> Tool:
        """This agent as a tool of another agent (its argument: ``question``)."""
        return program_tool(self.program, name=name or self.name,
                            description=description or self.system or f"ask the {self.name} agent",
                            output=None)
