"""The sans-I/O interpreter: IR nodes in, generation requests out, results back in.

One :class:`Interpreter` holds the state of one running program (or one fork of it):
its text, variables, typed values, messages and meta information. It never performs
I/O. A driver (:mod:`structgen.lang.run`) repeatedly asks :meth:`Interpreter.step` for the
next request, sends the requests of many interpreters to a backend together (batching
forks and concurrent runs), and hands each result back with :meth:`Interpreter.deliver`.
The same core serves sync runs, async runs, streaming, batches and tests with fakes.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Union

from structgen.contract.backend import (
    GenerateRequest,
    GenerateResult,
    Message,
    SamplingParams,
    SelectRequest,
    SelectResult,
)
from structgen.contract.chat_template import ChatTemplate
from structgen.errors import OutputValidationError, ProgramError, StructgenError
from structgen.lang.choices import method_by_name
from structgen.lang.ir import (
    Expr,
    Gen,
    RoleBegin,
    RoleEnd,
    Select,
    Text,
    ToolMessages,
    UseTools,
    VarScopeBegin,
    VarScopeEnd,
    flatten,
)

__all__ = ["Interpreter", "Request"]

Request = Union[GenerateRequest, SelectRequest]
#: ``emit(delta, variable)``: text appended to the state (variable None for prompt text).
Emit = Callable[[str, str | None], None]

_ROLES = ("system", "user", "assistant", "tool")


@dataclass
class _Pending:
    node: Gen | Select
    request: Request
    name: str
    attempt: int = 0
    streamed: int = 0  # characters already emitted through on_delta


@dataclass
class _OpenRole:
    role: str
    start: int
    suffix: str


class Interpreter:
    """State machine for one program run (or one fork)."""

    def __init__(self, *, program: str | None, defaults: SamplingParams,
                 chat_template: ChatTemplate | None, chat_messages: bool = False,
                 group: str | None = None, emit: Emit | None = None):
        self.program = program
        self.defaults = defaults
        self.chat_template = chat_template
        self.chat_messages = chat_messages
        self.group = group
        self.emit = emit
        self.text = ""
        self.variables: dict[str, Any] = {}
        self.values: dict[str, Any] = {}
        self.meta: dict[str, dict[str, Any]] = {}
        self.messages: list[dict[str, Any]] = []
        #: tools shown to the model (``use_tools``): role turns render with them
        self.tools: tuple[Any, ...] = ()
        self.error: StructgenError | None = None
        self._role: _OpenRole | None = None
        self._scopes: dict[str, int] = {}
        self._queue: deque[Expr] = deque()
        self._pending: _Pending | None = None
        self._anon = 0

    # -- forking ----------------------------------------------------------------------
    def fork(self, group: str, emit: Emit | None = None) -> Interpreter:
        """A child interpreter continuing from this one's current (idle) state."""
        if self._pending is not None or self._queue:
            raise ProgramError("cannot fork a state with work still pending", program=self.program)
        child = Interpreter(program=self.program, defaults=self.defaults,
                            chat_template=self.chat_template, chat_messages=self.chat_messages,
                            group=group, emit=emit)
        child.text = self.text
        child.variables = dict(self.variables)
        child.values = dict(self.values)
        child.meta = dict(self.meta)
        child.messages = [dict(m) for m in self.messages]
        child.tools = self.tools
        child._role = None if self._role is None else replace(self._role)
        child._scopes = dict(self._scopes)
        return child

    # -- input --------------------------------------------------------------------------
    def submit(self, node: Expr) -> None:
        if self.error is None:
            self._queue.extend(flatten(node))

    @property
    def idle(self) -> bool:
        return self.error is not None or (self._pending is None and not self._queue)

    def step(self) -> Request | None:
        """Process queued nodes up to the next generation; return its request, if any."""
        if self.error is not None:
            return None
        if self._pending is not None:
            return self._pending.request
        try:
            while self._queue:
                node = self._queue.popleft()
                req = self._exec(node)
                if req is not None:
                    return req
        except StructgenError as exc:
            self.fail(exc)
        return None

    def on_delta(self, delta: str) -> None:
        """Streaming: part of the pending generation's text arrived."""
        if self._pending is not None and delta:
            self._pending.streamed += len(delta)
            if self.emit is not None:
                self.emit(delta, self._pending.name)

    def deliver(self, result: GenerateResult | SelectResult | BaseException) -> None:
        pending = self._pending
        if pending is None:
            raise ProgramError("result delivered with no request pending", program=self.program)
        self._pending = None
        if isinstance(result, BaseException):
            # an output problem the backend found (e.g. its own check of a server's text):
            # re-sampled under retries= like one found here
            if (isinstance(result, OutputValidationError) and isinstance(pending.node, Gen)
                    and pending.attempt < pending.node.retries):
                self._retry(pending)
                return
            self.fail(result, variable=pending.name)
            return
        try:
            if isinstance(pending.node, Gen):
                self._finish_gen(pending, result)  # type: ignore[arg-type]
            else:
                self._finish_select(pending, result)  # type: ignore[arg-type]
        except StructgenError as exc:
            self.fail(exc, variable=pending.name)

    def fail(self, exc: BaseException, *, variable: str | None = None) -> None:
        if not isinstance(exc, StructgenError):
            err: StructgenError = ProgramError(f"{type(exc).__name__}: {exc}")
            err.__cause__ = exc
        else:
            err = exc
        err.with_context(program=self.program, variable=variable)
        if self.error is None:
            self.error = err
        self._queue.clear()
        self._pending = None

    # -- execution of one node ------------------------------------------------------------
    def _append(self, text: str, variable: str | None = None) -> None:
        if text:
            self.text += text
            if self.emit is not None:
                self.emit(text, variable)

    def _exec(self, node: Expr) -> Request | None:
        if isinstance(node, Text):
            self._append(node.value)
        elif isinstance(node, Gen):
            return self._start_gen(node)
        elif isinstance(node, Select):
            return self._start_select(node)
        elif isinstance(node, RoleBegin):
            self._role_begin(node.role)
        elif isinstance(node, RoleEnd):
            self._role_end(node.role)
        elif isinstance(node, UseTools):
            self._use_tools(node.tools)
        elif isinstance(node, ToolMessages):
            self._tool_messages(node)
        elif isinstance(node, VarScopeBegin):
            self._scopes[node.name] = len(self.text)
        elif isinstance(node, VarScopeEnd):
            start = self._scopes.pop(node.name, None)
            if start is None:
                raise ProgramError(f"var_scope {node.name!r} ended but never began")
            self.variables[node.name] = self.text[start:]
        else:
            raise ProgramError(f"unsupported node {type(node).__name__}")
        return None

    def _role_begin(self, role: str) -> None:
        if role not in _ROLES:
            raise ProgramError(f"unknown role {role!r}; use one of {list(_ROLES)}")
        if self._role is not None:
            raise ProgramError(f"role {role!r} begins inside an open {self._role.role!r} turn")
        prefix = suffix = ""
        if not self.chat_messages:
            template, tools = self._template()
            rt = template.role(role, self.messages, tools=tools)
            prefix, suffix = rt.prefix, rt.suffix
        self._append(prefix)
        self._role = _OpenRole(role, len(self.text), suffix)

    def _role_end(self, role: str) -> None:
        if self._role is None or self._role.role != role:
            open_ = self._role.role if self._role else None
            raise ProgramError(f"role {role!r} ends but the open turn is {open_!r}")
        content = self.text[self._role.start:]
        self._append(self._role.suffix)
        self.messages.append({"role": role, "content": content})
        self._role = None

    # -- tools (structgen.tools: imported only when a program uses them) ------------------
    def _template(self) -> tuple[ChatTemplate, list[dict[str, Any]] | None]:
        """The template role turns render with, and the tool list it shows (if any)."""
        if self.chat_template is None:
            raise ProgramError("the backend has no chat template, so roles cannot be rendered")
        if not self.tools:
            return self.chat_template, None
        from structgen.tools.formats import tools_template

        return tools_template(self.chat_template)[0], [t.openai() for t in self.tools]

    def _use_tools(self, tools: tuple[Any, ...]) -> None:
        if self._role is not None:
            raise ProgramError("use_tools(...) must come before or between role turns, not inside one")
        self.tools = tools
        if not self.chat_messages and self.chat_template is None:  # plain text: the block itself
            from structgen.tools.formats import injected_system_text

            self._append(injected_system_text([t.openai() for t in tools]) + "\n")

    def _tool_messages(self, node: ToolMessages) -> None:
        if self._role is not None:
            raise ProgramError(f"tool results cannot go inside an open {self._role.role!r} turn")
        new = [{"role": "tool", "content": content, **({"tool_call_id": cid} if cid else {}),
                **({"name": name} if name else {})} for content, cid, name in node.results]
        if not self.chat_messages:
            template, tools = self._template()
            self._append(template.continuation(self.messages, new, tools))
        self.messages.extend(new)

    def _resolve_tools(self, request: Any) -> Any:
        """A ``gen(tools=...)`` becomes the constraint for this backend's call format."""
        if not self.chat_messages:
            shown = {t.name for t in self.tools}
            missing = [t.name for t in request.tools if t.name not in shown]
            if missing:
                raise ProgramError(f"gen(tools=...) uses tools the prompt does not show: {missing}; "
                                   "add s += sg.use_tools([...]) before the conversation")
            template = None if self.chat_template is None else self._template()[0]
            return request.resolve(template)
        return request.resolve(None)

    def _request_messages(self) -> tuple[Message, ...]:
        msgs = [Message(m["role"], m["content"], m.get("tool_call_id"), m.get("name")) for m in self.messages]
        if self._role is not None:
            msgs.append(Message(self._role.role, self.text[self._role.start:]))
        return tuple(msgs)

    def _name(self, name: str | None) -> str:
        if name is None:
            self._anon += 1
            return f"_gen_{self._anon}"
        return name

    def _start_gen(self, node: Gen) -> Request:
        name = self._name(node.name)
        constraint = node.constraint
        if getattr(constraint, "kind", None) == "tool_request":
            constraint = self._resolve_tools(constraint)
        req = GenerateRequest(prompt=self.text, params=node.sampling(self.defaults),
                              constraint=constraint, messages=self._request_messages(),
                              program=self.program, variable=name, group=self.group)
        self._pending = _Pending(node, req, name=name)
        return req

    def _start_select(self, node: Select) -> Request:
        if not node.choices:
            raise ProgramError("select needs at least one choice", variable=node.name)
        name = self._name(node.name)
        method = method_by_name(node.method)
        req = SelectRequest(prompt=self.text, choices=node.choices, temperature=node.temperature,
                            method=None if node.method is None else method.name,
                            need_unconditional=method.requires_unconditional_logprobs,
                            messages=self._request_messages(), program=self.program,
                            variable=name, group=self.group)
        self._pending = _Pending(node, req, name=name)
        return req

    # -- results --------------------------------------------------------------------------
    def _finish_gen(self, pending: _Pending, result: GenerateResult) -> None:
        node: Gen = pending.node  # type: ignore[assignment]
        name, text = pending.name, result.text
        try:
            value = _typed_value(node, text, truncated=result.finish_reason == "length",
                                 constraint=pending.request.constraint)  # type: ignore[union-attr]
        except OutputValidationError:
            if pending.attempt < node.retries:
                self._retry(pending)
                return
            raise
        self.text += text
        rest = text[pending.streamed:]
        if self.emit is not None and rest:
            self.emit(rest, name)
        self.variables[name] = text
        self.values[name] = value
        meta = dict(result.meta)
        meta.setdefault("finish_reason", result.finish_reason)
        think = getattr(pending.request.constraint, "think", None)
        if think is not None:
            from structgen.tools.calls import split_thinking

            meta["thinking"] = split_thinking(text, think)[0]
        calls = getattr(value, "calls", None)
        if calls is not None and hasattr(value, "is_answer"):  # a tool-calling turn
            meta["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": c.raw_arguments} for c in calls]
        if pending.attempt:
            meta["attempts"] = pending.attempt + 1
        self.meta[name] = meta

    def _retry(self, pending: _Pending) -> None:
        """Re-sample after a failed validation (greedy would repeat itself)."""
        req: GenerateRequest = pending.request  # type: ignore[assignment]
        params = req.params
        attempt = pending.attempt + 1
        params = replace(params, temperature=max(params.temperature, 0.7),
                         seed=(params.seed or 0) + attempt)
        self._pending = _Pending(pending.node, replace(req, params=params), pending.name, attempt=attempt)

    def _finish_select(self, pending: _Pending, result: SelectResult) -> None:
        node: Select = pending.node  # type: ignore[assignment]
        if result.index is not None:
            index, meta = result.index, dict(result.meta)
        else:
            if result.input_token_logprobs is None:
                raise ProgramError("backend returned neither logprobs nor a choice for select")
            method = method_by_name(node.method)
            decision = method(choices=node.choices, token_logprobs=result.input_token_logprobs,
                              unconditional_token_logprobs=result.unconditional_token_logprobs)
            index, meta = decision.index, {**result.meta, **decision.meta_info}
            if node.temperature > 0:
                index = _sample_index(meta["normalized_prompt_logprobs"], node.temperature, index)
        if not 0 <= index < len(node.choices):
            raise ProgramError(f"backend chose option {index} of {len(node.choices)}")
        choice = node.choices[index]
        self._append(choice, pending.name)
        self.variables[pending.name] = choice
        self.values[pending.name] = choice
        self.meta[pending.name] = meta


def _sample_index(scores: list[float], temperature: float, default: int) -> int:
    import math
    import random

    finite = [s for s in scores if s != float("-inf")]
    if not finite:
        return default
    top = max(finite)
    weights = [math.exp((s - top) / temperature) if s != float("-inf") else 0.0 for s in scores]
    return random.choices(range(len(scores)), weights=weights)[0]


def _typed_value(node: Gen, text: str, *, truncated: bool, constraint: Any = None) -> Any:
    """Validate constrained output and convert it to its typed value."""
    constraint = constraint if constraint is not None else node.constraint
    if constraint is None:
        return text
    from structgen.constraints.validation import validate_output

    value = validate_output(constraint, text, truncated=truncated)
    if node.dtype is not None:
        return _convert_dtype(node.dtype, text)
    return value


def _convert_dtype(dtype: Any, text: str) -> Any:
    raw = text.strip()
    if dtype in (int, "int"):
        return int(raw)
    if dtype in (float, "float"):
        return float(raw)
    if dtype in (bool, "bool"):
        return raw == "True"
    if dtype in (str, "str"):
        return raw[1:-1] if len(raw) >= 2 and raw[0] == raw[-1] == '"' else raw
    return json.loads(raw)
