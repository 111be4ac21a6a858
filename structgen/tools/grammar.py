"""The grammar of a tool-calling turn, in llguidance's Lark dialect.

One grammar says everything a turn may be: a free-text answer (never containing the
format's trigger, so a malformed call cannot pass as text), or 1..k calls of the allowed
tools, each a literal ``{"name": "<tool>", "<args key>": `` followed by a ``%json`` of that
tool's argument schema. Where the format lets text precede a call, a lazy lexeme takes
any text up to the first trigger. An optional thinking section (``<think>`` ... ``</think>``)
comes first: free text, then the constrained part -- thinking never turns it off.
Text before a call is allowed only in ``auto`` mode: under ``required`` (or a named tool)
the call starts at once, and after the last allowed call the grammar ends, so a required
call can never ramble or loop to ``max_tokens``.

A format with ``opens_in_auto`` (the injected ``structgen`` format) has no lazy trigger:
under ``auto`` the turn opens the call block at once and the model decides right after
``<tool_call>[`` -- ``]</tool_call>`` and then an optional free-text answer (no call), or
1..k calls and the grammar ends.

A *staged* turn (:mod:`structgen.tools.staging`) is written one call per request: the
first stage's grammar (``stage="first"``) is the turn's opening (an answer, lead text, the
block's opener) and one call, ending right after it; each next one's (``stage="next"``)
is the block's end, or the separator and one more call (``stage="more"``: the separator and
one more call, no end).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from structgen.tools.budget import bounded_schema
from structgen.tools.definition import Tool
from structgen.tools.formats import ToolFormat

__all__ = ["JSON_STYLE", "STAGES", "lark_literal", "think_prefix", "tool_grammar"]

#: a staged turn's grammars: its first request's, each later one's, and a later one that
#: must write a call (asked for by coverage, :mod:`structgen.tools.coverage`)
STAGES = ("first", "next", "more")

#: how arguments are written: as ``tojson`` writes them (templates render calls this way)
JSON_STYLE = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}


def lark_literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _no_trigger(name: str, trigger: str, *, first_not: str | None = None) -> str:
    """A terminal: non-empty text that never contains ``trigger``."""
    esc = re.escape(trigger).replace("/", "\\/")
    base = "/(?s:.+)/" if first_not is None else f"/[^{re.escape(first_not)}](?s:.*)/"
    return f"{name}: {base} & ~/(?s:.*){esc}(?s:.*)/"


def think_prefix(think: tuple[Any, ...] | None) -> tuple[str, list[str]]:
    """The start-rule prefix and rules of a thinking section (none when ``think`` is None);
    ``think`` is ``(open, close)`` or ``(open, close, max_chars)``."""
    if think is None:
        return "", []
    open_, close = think[0], think[1]
    esc = re.escape(close).replace("/", "\\/")
    body = "(?s:.*)" if len(think) < 3 else f"(?s:.{{0,{int(think[2])}}})"
    rules = [f"think_body[lazy]: /{body}{esc}/",  # any text up to the first closing tag
             f"thinking: {lark_literal(open_)} think_body \"\\n\""]
    return "thinking ", rules


def _args_schema(tool: Tool, cap: int | None = None) -> str:
    schema: dict[str, Any] = dict(tool.parameters) if cap is None else bounded_schema(tool.parameters, cap)
    schema["x-guidance"] = JSON_STYLE
    return json.dumps(schema, ensure_ascii=False)


def tool_grammar(fmt: ToolFormat, tools: Sequence[Tool], *, mode: str, max_calls: int,
                 think: tuple[Any, ...] | None = None, caps: Sequence[int] | None = None,
                 stage: str | None = None) -> str:
    """The Lark grammar for one turn. ``mode``: ``"auto"`` (answer or calls),
    ``"required"`` (1..max_calls calls) or ``"none"`` (an answer only). ``caps``: per
    tool, a bound on its arguments' strings and arrays (:mod:`structgen.tools.budget`).
    ``stage``: one stage of a staged turn (``"first"``: the turn's opening and a call;
    ``"next"``: the block's end, or the separator and a call; ``"more"``: the separator and a
    call); ``max_calls`` is then 1."""
    if mode not in ("auto", "required", "none"):
        raise ValueError(f"mode must be auto, required or none, not {mode!r}")
    if max_calls < 1:
        raise ValueError("max_calls must be at least 1")
    if stage is not None and (stage not in STAGES or mode == "none" or max_calls != 1):
        raise ValueError(f"a stage is {' or '.join(STAGES)}, of one call of an auto or required turn")
    head, rules = think_prefix(think)
    lines = ["%llguidance {}"]
    first_not = fmt.trigger if fmt.trigger == "{" else None
    answer_rule = _no_trigger("ANSWER", fmt.trigger, first_not=first_not)
    if mode == "none":
        lines += [f"start: {head}ANSWER", answer_rule, *rules]
        return "\n".join(lines) + "\n"
    if mode == "auto" and stage not in ("next", "more"):
        lines.append(answer_rule)
    # a staged turn's first stage is the turn of one call, its block left open after it
    turn = (_next_rules(fmt, forced=stage == "more") if stage in ("next", "more")
            else _turn_rules(fmt, mode, max_calls, head, closed=stage is None))
    lines += [*turn, *rules]
    names = []
    for i, t in enumerate(tools):
        rule = f"call_{i}"
        names.append(rule)
        prefix = lark_literal(f'{{"name": {json.dumps(t.name)}, "{fmt.args_key}": ')
        lines.append(f"{rule}: {prefix} args_{i} \"}}\"")
        lines.append(f"args_{i}: %json {_args_schema(t, None if caps is None else caps[i])}")
    lines.append(f"call: {' | '.join(names)}")
    return "\n".join(lines) + "\n"


def _turn_rules(fmt: ToolFormat, mode: str, max_calls: int, head: str, closed: bool = True) -> list[str]:
    """``start`` and the rules that frame the calls (``call`` itself comes after). ``closed``
    False: a list-style block is left open after its calls (a staged turn's first stage)."""
    more = f"{{0,{max_calls - 1}}}" if max_calls > 1 else ""
    sep = lark_literal(fmt.separator)
    if fmt.list_style:
        opener, closer = lark_literal(fmt.open + "["), lark_literal("]" + fmt.close)
        rest = f"({sep} call){more}" if more else ""
        end = closer if closed else ""
        if mode == "auto" and fmt.opens_in_auto:  # the decision point: "[]" then the answer, or calls
            return [f"start: {head}{opener} (call {rest} {end} | {closer} ANSWER?)"]
        if mode == "required":
            return [f"start: {head}calls", f"calls: {opener} call {rest} {end}"]
        if fmt.text_before:  # "[]": no call
            return [f"start: {head}(ANSWER | calls)", f"calls: lead (call {rest} {end} | {closer})",
                    f"lead[lazy]: /(?s:.*)/ {opener}"]
        return [f"start: {head}(ANSWER | calls)", f"calls: {opener} call {rest} {end}"]
    open_, close = lark_literal(fmt.open) if fmt.open else "", lark_literal(fmt.close) if fmt.close else ""
    block = _wrapped(fmt)
    rest = f"({sep} {block}){more}" if more else ""
    start = f"start: {head}calls" if mode == "required" else f"start: {head}(ANSWER | calls)"
    if fmt.text_before and fmt.open and mode == "auto":  # a lazy trigger: free text, then the first call
        return [start, f"calls: lead call {close} {rest}", f"lead[lazy]: /(?s:.*)/ {open_}"]
    return [start, f"calls: {block} {rest}"]


def _next_rules(fmt: ToolFormat, forced: bool = False) -> list[str]:
    """A staged turn's next stage: the block's end, or the separator and one more call
    (``forced``: the separator and one more call)."""
    sep = lark_literal(fmt.separator)
    if fmt.list_style:
        return [f"start: {sep} call" if forced else f"start: {lark_literal(']' + fmt.close)} | {sep} call"]
    return [f"start: {sep} {_wrapped(fmt)}" if forced else f"start: ({sep} {_wrapped(fmt)})?"]


def _wrapped(fmt: ToolFormat) -> str:
    """One call with its own tags (a format that wraps each call)."""
    return " ".join(p for p in (lark_literal(fmt.open) if fmt.open else "", "call",
                                lark_literal(fmt.close) if fmt.close else "") if p)
