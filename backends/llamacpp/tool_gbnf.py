"""Tool-calling turns as llama.cpp GBNF (llama.cpp reads no Lark).

The same language as structgen's Lark tool grammar (:mod:`structgen.tools.grammar`), with
one approximation GBNF forces: free text (an answer, text before a call, a thinking
section) may not contain the first character of the format's trigger (``<`` for
``<tool_call>``, ``{`` for Llama 3 JSON, ``[`` for Mistral), which keeps a malformed call
from passing as text. Arguments follow each tool's schema through
:func:`~structgen.backends.llamacpp.gbnf_schema.json_schema_to_gbnf` (compact JSON; numeric bounds
loosened); the adapter parses and validates every call afterwards. Under ``auto`` a format
that opens its call block (the injected one) starts with it: ``[]`` then the answer, or calls.
"""

from __future__ import annotations

import re
from typing import Any

from structgen.backends.llamacpp.gbnf import gbnf_literal
from structgen.backends.llamacpp.gbnf_schema import json_schema_to_gbnf

__all__ = ["tool_gbnf"]

_RULE = re.compile(r"^([A-Za-z][A-Za-z0-9-]*)\s*::=", re.M)


def _prefixed(grammar: str, prefix: str) -> str:
    names = set(_RULE.findall(grammar))
    return re.sub(r"(?<![\w\"-])(" + "|".join(sorted(map(re.escape, names), key=len, reverse=True)) + r")(?![\w-])",
                  lambda m: prefix + m.group(1), grammar) if names else grammar


def _text(first: str, *, empty: bool) -> str:
    cls = "[^" + ("\\\\" if first == "\\" else ("\\" + first if first in "[]^-" else first)) + "]"
    return f"{cls}{'*' if empty else '+'}"


def tool_gbnf(spec: Any) -> str:
    """GBNF for a :class:`~structgen.tools.spec.ToolCallSpec`."""
    fmt = spec.call_format
    first = fmt.trigger[0]
    rules = [f"answer ::= {_text(first, empty=False)}"]
    head = ""
    if spec.think is not None:
        rules.append(f"thinking ::= {gbnf_literal(spec.think[0])} [^<]* {gbnf_literal(spec.think[1] + chr(10))}")
        head = "thinking "
    if spec.mode == "none":
        return "\n".join([f"root ::= {head}answer", *rules]) + "\n"
    names = []
    for i, tool in enumerate(t for t in spec.tools if t.name in spec.allowed):
        args = _prefixed(json_schema_to_gbnf(tool.parameters), f"t{i}-")
        rules.append(args)
        prefix = gbnf_literal(f'{{"name": "{tool.name}", "{fmt.args_key}": ')
        rules.append(f"call{i} ::= {prefix} t{i}-root \"}}\"")
        names.append(f"call{i}")
    rules.append("call ::= " + " | ".join(names))
    more = f"{{0,{spec.max_calls - 1}}}" if spec.max_calls > 1 else ""
    sep = gbnf_literal(fmt.separator)
    lead = ""
    if fmt.text_before and spec.mode == "auto" and not fmt.opens_in_auto:
        rules.append(f"lead ::= {_text(first, empty=True)}")
        lead = "lead "
    if fmt.list_style and fmt.opens_in_auto and spec.mode == "auto":  # "[]" then the answer, or calls
        rest = f"({sep} call){more}" if more else ""
        close = gbnf_literal("]" + fmt.close)
        rules.append(f"calls ::= {gbnf_literal(fmt.open + '[')} (call {rest} {close} | {close} answer?)")
        return "\n".join([f"root ::= {head}calls", *rules]) + "\n"
    if fmt.list_style:
        rest = f"({sep} call){more}" if more else ""
        rules.append(f"calls ::= {lead}{gbnf_literal(fmt.open + '[')} call {rest} {gbnf_literal(']' + fmt.close)}")
    else:
        block = " ".join(p for p in (gbnf_literal(fmt.open) if fmt.open else "", "call",
                                     gbnf_literal(fmt.close) if fmt.close else "") if p)
        rest = f"({sep} {block}){more}" if more else ""
        rules.append(f"calls ::= {lead}{block} {rest}")
    start = "calls" if spec.mode == "required" else "(answer | calls)"
    return "\n".join([f"root ::= {head}{start}", *rules]) + "\n"
