"""The DSL's functions, with SGLang's names and signatures."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from structgen.constraints.spec import (
    dtype_spec,
    grammar_spec,
    json_schema_spec,
    regex_spec,
)
from structgen.errors import ConstraintError, OptionError, ProgramError
from structgen.lang.choices import ChoicesSamplingMethod, method_by_name
from structgen.lang.ir import Concat, Expr, Gen, RoleBegin, RoleEnd, Select, ToolMessages, UseTools, as_node
from structgen.lang.options import check_option

__all__ = [
    "assistant",
    "assistant_begin",
    "assistant_end",
    "gen",
    "gen_int",
    "gen_string",
    "image",
    "select",
    "system",
    "system_begin",
    "system_end",
    "tool_message",
    "tool_results",
    "use_tools",
    "user",
    "user_begin",
    "user_end",
    "video",
]


#: (name in gen()'s signature, SamplingParams field) for each sampling argument, in order
_GEN_OPTIONS = (("max_tokens", "max_new_tokens"), ("min_tokens", "min_new_tokens"), ("n", "n"),
                ("stop", "stop"), ("stop_token_ids", "stop_token_ids"), ("stop_regex", "stop_regex"),
                ("temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k"), ("min_p", "min_p"),
                ("frequency_penalty", "frequency_penalty"), ("presence_penalty", "presence_penalty"),
                ("ignore_eos", "ignore_eos"), ("return_logprob", "return_logprob"),
                ("logprob_start_len", "logprob_start_len"), ("top_logprobs_num", "top_logprobs_num"),
                ("return_text_in_logprobs", "return_text_in_logprobs"))


def gen(
    name: str | None = None,
    max_tokens: int | None = None,
    min_tokens: int | None = None,
    n: int | None = None,
    stop: str | Sequence[str] | None = None,
    stop_token_ids: Sequence[int] | None = None,
    stop_regex: str | Sequence[str] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
    dtype: type | str | None = None,
    choices: Sequence[str] | None = None,
    choices_method: ChoicesSamplingMethod | str | None = None,
    regex: str | None = None,
    json_schema: Any = None,
    *,
    grammar: str | None = None,
    whitespace: Literal["compact", "flexible"] = "compact",
    strict: bool = True,
    retries: int = 0,
    tools: Sequence[Any] | None = None,
    tool_choice: Any = "auto",
    parallel_tool_calls: bool | int = False,
    think: bool | tuple[str, str] | None = None,
) -> Expr:
    """Generate into variable ``name``.

    Constraints (at most one): ``regex``, ``json_schema`` (a JSON string, a dict, or a
    pydantic model class -- the typed value is then a model instance), ``grammar`` (a Lark
    grammar, llguidance's dialect: on the embedded backend and engines that take grammars),
    ``dtype`` (int/float/str/bool), or ``choices`` (which makes this a :func:`select`).
    ``whitespace``: ``"compact"`` JSON (default) or ``"flexible"``. ``strict`` (default):
    objects of the schema that declare ``properties`` and say nothing about other keys
    allow only those keys (``additionalProperties: false``); ``strict=False`` keeps JSON
    Schema's open default, where the model may add keys. ``retries``: how many times to
    re-sample when the output fails validation (e.g. cut short by max_tokens); when
    streaming, such a gen's text is streamed once an attempt validates.
    Malformed constraints raise :class:`ConstraintError` and bad sampling options
    :class:`~structgen.errors.OptionError` here, before anything runs.

    ``tools`` (functions, ``@tool`` s, pydantic models, OpenAI tool dicts, MCP tools) makes
    this a tool-calling turn (see :mod:`structgen.tools`): the output is an answer or calls
    of the allowed tools with schema-valid arguments, in the model's own call format;
    ``state.tool_calls(name)`` returns them. ``tool_choice``: ``"auto"``, ``"required"``,
    ``"none"``, a tool's name or ``{"allowed": [...]}``; ``parallel_tool_calls``: ``False``
    (one call), ``True`` or a bound ``k``. ``think=True`` (or a tag pair) lets the model
    write a thinking section first, then the constrained part.
    """
    if name is not None and not isinstance(name, str):
        raise ProgramError(f"a gen's variable name must be a string, not {name!r}")
    if choices is not None:
        return select(name, list(choices), temperature=0.0 if temperature is None else temperature,
                      choices_method=choices_method)
    given = [k for k, v in (("regex", regex), ("json_schema", json_schema), ("grammar", grammar),
                            ("dtype", dtype), ("tools", tools)) if v is not None]
    if len(given) > 1:
        raise ConstraintError(f"gen({name!r}) takes one constraint, got {given}")
    constraint: Any = None
    if tools is not None:
        from structgen.tools.spec import ToolRequest

        constraint = ToolRequest.make(tools, tool_choice, parallel_tool_calls, think)
    elif think is not None and think is not False:
        if grammar is not None:
            raise ConstraintError(f"gen({name!r}): think= takes a regex, json_schema or dtype, not a "
                                  "grammar; write the thinking section into the grammar instead")
        from structgen.tools.thinking import thinking_spec

        constraint = thinking_spec(think, regex=regex, json_schema=json_schema, dtype=dtype, whitespace=whitespace)
    elif regex is not None:
        constraint = regex_spec(regex)
    elif json_schema is not None:
        constraint = json_schema_spec(json_schema, whitespace=whitespace, strict=strict)
    elif grammar is not None:
        constraint = grammar_spec(grammar)
    elif dtype is not None:
        constraint = dtype_spec(dtype)
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        raise OptionError("retries", retries, "an int >= 0", variable=name)
    values = (max_tokens, min_tokens, n, stop, stop_token_ids, stop_regex, temperature, top_p, top_k, min_p,
              frequency_penalty, presence_penalty, ignore_eos, return_logprob, logprob_start_len,
              top_logprobs_num, return_text_in_logprobs)
    set_params = tuple((field, check_option(field, v, spelled=spelled))
                       for (spelled, field), v in zip(_GEN_OPTIONS, values, strict=True) if v is not None)
    typed = None if getattr(constraint, "think", None) is not None else dtype  # thinking converts itself
    return Gen(name=name, params=set_params, constraint=constraint, dtype=typed, retries=retries)


def gen_int(name: str | None = None, **kwargs: Any) -> Expr:
    """``gen(name, dtype=int, ...)``."""
    return gen(name, dtype=int, **kwargs)


def gen_string(name: str | None = None, **kwargs: Any) -> Expr:
    """``gen(name, dtype=str, ...)``."""
    return gen(name, dtype=str, **kwargs)


def select(name: str | None = None, choices: Sequence[str] | None = None, temperature: float = 0.0,
           choices_method: ChoicesSamplingMethod | str | None = None) -> Expr:
    """Choose one of ``choices`` by log-probability scoring into variable ``name``.

    ``choices_method``: ``token_length_normalized`` (default), ``greedy_token_selection``
    or ``unconditional_likelihood_normalized`` (objects or names).
    """
    if not choices:
        raise ProgramError(f"select({name!r}) needs a non-empty list of choices")
    opts = tuple(choices)
    if not all(isinstance(c, str) for c in opts):
        raise ProgramError(f"select({name!r}) choices must be strings")
    if len(set(opts)) != len(opts):
        raise ProgramError(f"select({name!r}) has duplicate choices")
    if choices_method is not None:
        method_by_name(choices_method)  # validate now
    temperature = check_option("temperature", 0.0 if temperature is None else temperature)
    return Select(name=name, choices=opts, temperature=float(temperature), method=choices_method)


def _role(role: str, expr: Any = None) -> Expr:
    if expr is None:
        return Concat((RoleBegin(role), RoleEnd(role)))
    return Concat((RoleBegin(role), as_node(expr), RoleEnd(role)))


def system(expr: Any = None) -> Expr:
    return _role("system", expr)


def user(expr: Any = None) -> Expr:
    return _role("user", expr)


def assistant(expr: Any = None) -> Expr:
    return _role("assistant", expr)


def system_begin() -> Expr:
    return RoleBegin("system")


def system_end() -> Expr:
    return RoleEnd("system")


def user_begin() -> Expr:
    return RoleBegin("user")


def user_end() -> Expr:
    return RoleEnd("user")


def assistant_begin() -> Expr:
    return RoleBegin("assistant")


def assistant_end() -> Expr:
    return RoleEnd("assistant")


def use_tools(tools: Sequence[Any]) -> Expr:
    """Show ``tools`` to the model from here on: the chat template renders them (or the
    documented ``structgen`` block is added to the system turn when it cannot)."""
    from structgen.tools.definition import as_tools

    return UseTools(as_tools(tools))


def tool_message(content: Any, call_id: str | None = None, name: str | None = None) -> Expr:
    """One tool result in the template's ``tool`` role (``content``: text, or a value shown
    as JSON). (``sg.tool`` is the decorator that makes tools.)"""
    from structgen.tools.calls import to_text

    return ToolMessages(((to_text(content), call_id, name),))


def tool_results(results: Sequence[Any]) -> Expr:
    """Several tool results (:class:`~structgen.tools.calls.ToolResult` s) as one block of
    tool turns, rendered together as the template joins them."""
    return ToolMessages(tuple((r.content(), r.call.id, r.call.name) for r in results))


def image(*_: Any, **__: Any) -> Expr:
    raise ProgramError("image inputs are not supported by structgen's backends yet")


def video(*_: Any, **__: Any) -> Expr:
    raise ProgramError("video inputs are not supported by structgen's backends yet")

