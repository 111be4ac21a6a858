"""SGLang's ``separate_reasoning``: split a reasoning model's thinking out of a variable.

``s += sgl.separate_reasoning(sgl.gen("answer"), model_type="deepseek-r1")`` generates as
usual, then sets ``answer`` to the text after the thinking section and
``answer_reasoning_content`` to the thinking itself (SGLang's names and its non-streaming
reasoning parsers' rules; the state's text keeps everything the model wrote). This is
post-processing only: to *constrain* a thinking section, use ``gen(..., think=True)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from structgen.errors import ProgramError
from structgen.lang.interpreter import register_prompt_node
from structgen.lang.ir import Concat, Expr, Gen, Select

if TYPE_CHECKING:
    from structgen.lang.interpreter import Interpreter

__all__ = ["REASONING_FORMATS", "SeparateReasoning", "separate_reasoning", "split_reasoning"]

#: SGLang's reasoning parser names -> (start tag, end tag, whether the model starts inside
#: the thinking section without writing the start tag)
REASONING_FORMATS: dict[str, tuple[str, str, bool]] = {
    "deepseek-r1": ("<think>", "</think>", True),
    "deepseek-v3": ("<think>", "</think>", False),
    "qwen3": ("<think>", "</think>", False),
    "qwen3-thinking": ("<think>", "</think>", True),
    "glm45": ("<think>", "</think>", False),
    "kimi": ("\u25c1think\u25b7", "\u25c1/think\u25b7", False),
}


def split_reasoning(text: str, model_type: str) -> tuple[str, str]:
    """``(reasoning, normal_text)`` of ``text`` under ``model_type``'s tags. Text outside
    any thinking section is all normal; an unclosed section is all reasoning."""
    start, end, forced = REASONING_FORMATS[model_type]
    if not forced and start not in text:
        return "", text
    body = text.replace(start, "").strip()
    if end not in body:
        return body, ""
    reasoning, normal = body.split(end, 1)
    return reasoning, normal.strip()


@dataclass(frozen=True)
class SeparateReasoning(Expr):
    """After variable ``name`` is generated: split its thinking into ``{name}_reasoning_content``."""

    name: str
    model_type: str


def separate_reasoning(expr: Expr, model_type: str | None = None) -> Expr:
    """``expr`` (a named ``gen`` or ``select``), then its reasoning split off (see the module)."""
    if model_type is None or model_type not in REASONING_FORMATS:
        raise ProgramError(f"separate_reasoning needs a model_type, one of {sorted(REASONING_FORMATS)}; "
                           f"got {model_type!r}")
    if not isinstance(expr, (Gen, Select)) or not isinstance(expr.name, str):
        raise ProgramError("separate_reasoning takes a named gen(...) or select(...), "
                           f"not {type(expr).__name__}")
    return Concat((expr, SeparateReasoning(expr.name, model_type)))


def _apply(interp: Interpreter, node: SeparateReasoning) -> None:
    text = interp.variables.get(node.name)
    if not isinstance(text, str):
        raise ProgramError(f"separate_reasoning: variable {node.name!r} holds no generated text")
    reasoning, normal = split_reasoning(text, node.model_type)
    interp.set_variable(node.name, normal)
    interp.set_variable(f"{node.name}_reasoning_content", reasoning)


register_prompt_node(SeparateReasoning, _apply)
