"""The sans-I/O interpreter: IR nodes in, backend requests out, results back in.

One :class:`Interpreter` holds the state of one running program (or one fork of it):
its text, variables, typed values, messages and meta information. It never performs
I/O. The drive loop (:mod:`structgen.lang.run`) repeatedly asks :meth:`Interpreter.step`
for the next request, sends the requests of many interpreters to a backend together
(batching forks and concurrent runs), and hands each result back with
:meth:`Interpreter.deliver`. Prompt-side nodes (text, roles, variable scopes) are handled
here (the tool list a prompt shows and tool-result turns too: :mod:`structgen.tools` is
imported only when a program uses them); nodes that need a backend are dispatched through
the request-kind table (:mod:`structgen.lang.kinds`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from structgen.contract.backend import Cancellation, Message, SamplingParams
from structgen.contract.chat_template import ChatTemplate
from structgen.errors import ProgramError, StructgenError, map_error
from structgen.lang.ir import (
    Expr,
    RoleBegin,
    RoleEnd,
    Text,
    ToolMessages,
    UseTools,
    VarScopeBegin,
    VarScopeEnd,
    flatten,
)
from structgen.lang.kinds import RequestKind, kind_for_node, kind_of

__all__ = ["Emit", "Interpreter", "Pending", "register_prompt_node"]

#: ``emit(delta, variable)``: text appended to the state (variable None for prompt text).
Emit = Callable[[str, str | None], None]

_ROLES = ("system", "user", "assistant", "tool")
JOIN_MODES = ("gather_variable", "concate_and_append")


@dataclass
class Pending:
    """The request an interpreter waits on."""

    kind: RequestKind
    node: Any
    request: Any
    name: str
    attempt: int = 0
    streamed: int = 0  # characters already emitted through on_delta
    #: deltas are not streamed (the text is emitted whole once it validates: retries)
    hold: bool = False
    #: what the kind keeps between requests of one node (a staged tool turn's earlier stages)
    carry: Any = None


@dataclass
class _OpenRole:
    role: str
    start: int
    suffix: str


class Interpreter:
    """State machine for one program run (or one fork)."""

    def __init__(self, *, program: str | None, defaults: SamplingParams,
                 chat_template: ChatTemplate | None, chat_messages: bool = False,
                 group: str | None = None, emit: Emit | None = None,
                 cancel: Cancellation | None = None, scores: bool = False, ranks: bool = False):
        self.program = program
        #: the backend returns top log-probabilities (a tool turn's first decision is scored)
        self.scores = scores
        #: the backend scores ``select`` by log-probabilities (a tool turn's relevance is scored)
        self.ranks = ranks
        self.defaults = defaults
        self.chat_template = chat_template
        self.chat_messages = chat_messages
        self.group = group
        self.emit = emit
        self.cancel = cancel
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
        self._pending: Pending | None = None
        self._anon = 0

    # -- forking and joining ---------------------------------------------------------------
    def fork(self, group: str, emit: Emit | None = None) -> Interpreter:
        """A child interpreter continuing from this one's current (idle) state."""
        if self._pending is not None or self._queue:
            raise ProgramError("cannot fork a state with work still pending", program=self.program)
        child = Interpreter(program=self.program, defaults=self.defaults,
                            chat_template=self.chat_template, chat_messages=self.chat_messages,
                            group=group, emit=emit, cancel=self.cancel, scores=self.scores, ranks=self.ranks)
        child.text = self.text
        child.variables = dict(self.variables)
        child.values = dict(self.values)
        child.meta = dict(self.meta)
        child.messages = [dict(m) for m in self.messages]
        child.tools = self.tools
        child._role = None if self._role is None else replace(self._role)
        child._scopes = dict(self._scopes)
        return child

    def join(self, children: Sequence[Interpreter], mode: str, *, base_vars: set[str],
             base_len: int) -> None:
        """Bring forked ``children`` (idle) back: the first child error fails this
        interpreter and is raised; else ``gather_variable`` makes each variable the
        children defined a list of their values here, ``concate_and_append`` appends the
        text each child added, in order."""
        if mode not in JOIN_MODES:
            raise ProgramError(f"unknown join mode {mode!r}; use 'gather_variable' or 'concate_and_append'",
                               program=self.program)
        for child in children:
            if child.error is not None:
                self.fail(child.error)
                raise child.error
        if mode == "gather_variable":
            names = dict.fromkeys(n for c in children for n in c.variables if n not in base_vars)
            for name in names:
                self.variables[name] = [c.variables.get(name) for c in children]
                self.values[name] = [c.values.get(name) for c in children]
                self.meta[name] = {"forks": [c.meta.get(name) for c in children]}
        else:
            self.submit(Text("".join(c.text[base_len:] for c in children)))

    # -- input ------------------------------------------------------------------------------
    def submit(self, node: Expr) -> None:
        if self.error is None:
            self._queue.extend(flatten(node))

    def set_variable(self, name: str, value: Any) -> None:
        """``s[name] = value``: a variable the program sets itself."""
        self.variables[name] = value
        self.values[name] = value

    @property
    def idle(self) -> bool:
        return self.error is not None or (self._pending is None and not self._queue)

    @property
    def pending(self) -> Pending | None:
        return self._pending

    def step(self) -> Any:
        """Process queued nodes up to the next request; return it (None when idle)."""
        if self.error is not None:
            return None
        if self._pending is not None:
            return self._pending.request
        try:
            while self._queue:
                node = self._queue.popleft()
                handler = _PROMPT_NODES.get(type(node))
                if handler is not None:
                    handler(self, node)
                    continue
                kind = kind_for_node(type(node))
                if kind is None:
                    raise ProgramError(f"unsupported node {type(node).__name__}")
                name = self._name(getattr(node, "name", None))
                request = kind.start(self, node, name)
                # a node that may be retried, or whose first request is a probe (a tool turn's
                # scored decision), is streamed only once its text is final; a first request
                # of another kind (a tool turn's relevance scoring) is sent as that kind
                if type(request) is not kind.request:
                    kind = kind_of(request)
                self._pending = Pending(kind, node, request, name,
                                        hold=getattr(node, "retries", 0) > 0 or _is_probe(node, request))
                return self._pending.request
        except Exception as exc:  # a DSL misuse (ProgramError), or the chat template failing
            self.fail(exc)
        return None

    # -- results ------------------------------------------------------------------------------
    def on_delta(self, delta: str) -> None:
        """Streaming: part of the pending generation's text arrived."""
        pending = self._pending
        if pending is not None and delta and not pending.hold:
            pending.streamed += len(delta)
            if self.emit is not None:
                self.emit(delta, pending.name)

    def deliver(self, result: Any) -> None:
        """The result (or the error) of the pending request."""
        pending = self._pending
        if pending is None:
            raise ProgramError("result delivered with no request pending", program=self.program)
        self._pending = None
        if isinstance(result, BaseException):
            # the kind may recover (an output problem the backend found is re-sampled under
            # retries=, like one found here)
            if pending.kind.on_error is not None and pending.kind.on_error(self, pending, result):
                return
            self.fail(result, variable=pending.name)
            return
        try:
            pending.kind.finish(self, pending, result)
        except Exception as exc:  # a result that cannot be recorded is the backend's fault
            self.fail(map_error(exc, "backend"), variable=pending.name)

    def resend(self, pending: Pending) -> None:
        """Make ``pending`` (a new attempt) the request this interpreter waits on."""
        self._pending = pending

    def record(self, name: str, text: str, value: Any, meta: dict[str, Any], *, streamed: int = 0) -> None:
        """A request's outcome: ``text`` joins the state (emitting what was not streamed yet)
        and becomes variable ``name``, with its typed ``value`` and ``meta``."""
        self.text += text
        rest = text[streamed:]
        if self.emit is not None and rest:
            self.emit(rest, name)
        self.variables[name] = text
        self.values[name] = value
        self.meta[name] = meta

    def fail(self, exc: BaseException, *, variable: str | None = None) -> None:
        err = map_error(exc, "backend", program=self.program, variable=variable)
        if self.error is None:
            self.error = err
        self._queue.clear()
        self._pending = None

    # -- prompt-side nodes ----------------------------------------------------------------------
    def append(self, text: str) -> None:
        """Append prompt text (emitted to a streaming run's readers)."""
        self._append(text)

    def _append(self, text: str) -> None:
        if text:
            self.text += text
            if self.emit is not None:
                self.emit(text, None)

    def _role_begin(self, node: RoleBegin) -> None:
        role = node.role
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

    def _role_end(self, node: RoleEnd) -> None:
        role = node.role
        if self._role is None or self._role.role != role:
            open_ = self._role.role if self._role else None
            raise ProgramError(f"role {role!r} ends but the open turn is {open_!r}")
        content = self.text[self._role.start:]
        self._append(self._role.suffix)
        self.messages.append({"role": role, "content": content})
        self._role = None

    def _scope_begin(self, node: VarScopeBegin) -> None:
        self._scopes[node.name] = len(self.text)

    def _scope_end(self, node: VarScopeEnd) -> None:
        start = self._scopes.pop(node.name, None)
        if start is None:
            raise ProgramError(f"var_scope {node.name!r} ended but never began")
        self.variables[node.name] = self.text[start:]

    # -- tools (structgen.tools: imported only when a program uses them) ---------------------
    def _template(self) -> tuple[ChatTemplate, list[dict[str, Any]] | None]:
        """The template role turns render with, and the tool list it shows (if any)."""
        if self.chat_template is None:
            raise ProgramError("the backend has no chat template, so roles cannot be rendered")
        if not self.tools:
            return self.chat_template, None
        from structgen.tools.formats import tools_template

        return tools_template(self.chat_template)[0], [t.openai() for t in self.tools]

    def _use_tools(self, node: UseTools) -> None:
        if self._role is not None:
            raise ProgramError("use_tools(...) must come before or between role turns, not inside one")
        self.tools = node.tools
        if not self.chat_messages and self.chat_template is None:  # plain text: the block itself
            from structgen.tools.formats import injected_system_text

            self._append(injected_system_text([t.openai() for t in node.tools]) + "\n")

    def _tool_messages(self, node: ToolMessages) -> None:
        if self._role is not None:
            raise ProgramError(f"tool results cannot go inside an open {self._role.role!r} turn")
        new = [{"role": "tool", "content": content, **({"tool_call_id": cid} if cid else {}),
                **({"name": name} if name else {})} for content, cid, name in node.results]
        if not self.chat_messages:
            template, tools = self._template()
            self._append(template.continuation(self.messages, new, tools))
        self.messages.extend(new)

    def resolve_tools(self, request: Any, max_tokens: int | None = None) -> Any:
        """A ``gen(tools=...)`` becomes the constraint for this backend's call format, its
        calls bounded to fit ``max_tokens`` (see :mod:`structgen.tools.budget`)."""
        if not self.chat_messages:
            shown = {t.name for t in self.tools}
            missing = [t.name for t in request.tools if t.name not in shown]
            if missing:
                raise ProgramError(f"gen(tools=...) uses tools the prompt does not show: {missing}; "
                                   "add s += sg.use_tools([...]) before the conversation")
            template = None if self.chat_template is None else self._template()[0]
            return request.resolve(template, max_tokens)
        return request.resolve(None, max_tokens)

    def request_messages(self) -> tuple[Message, ...]:
        """The conversation so far for chat-API backends (an open turn is the last message)."""
        msgs = [Message(m["role"], m["content"], m.get("tool_call_id"), m.get("name")) for m in self.messages]
        if self._role is not None:
            msgs.append(Message(self._role.role, self.text[self._role.start:]))
        return tuple(msgs)

    def _name(self, name: str | None) -> str:
        if name is None:
            self._anon += 1
            return f"_gen_{self._anon}"
        return name


def _is_probe(node: Any, request: Any) -> bool:
    """A ``gen(tools=...)`` whose request carries no constraint: its scored first decision
    (a probe, or a relevance scoring)."""
    return (getattr(request, "constraint", None) is None
            and getattr(getattr(node, "constraint", None), "kind", None) == "tool_request")


#: IR nodes handled without a request: ``handler(interp, node)`` edits the interpreter's state
_PROMPT_NODES: dict[type[Any], Callable[[Interpreter, Any], None]] = {
    Text: lambda it, node: it._append(node.value),
    RoleBegin: Interpreter._role_begin,
    RoleEnd: Interpreter._role_end,
    VarScopeBegin: Interpreter._scope_begin,
    VarScopeEnd: Interpreter._scope_end,
    UseTools: Interpreter._use_tools,
    ToolMessages: Interpreter._tool_messages,
}


def register_prompt_node(node_type: type[Any], handler: Callable[[Interpreter, Any], None]) -> None:
    """Handle IR nodes of ``node_type`` that need no backend (a tool list shown to the model,
    tool results as a turn...): ``handler(interp, node)`` runs when the node is reached."""
    if node_type in _PROMPT_NODES or kind_for_node(node_type) is not None:
        raise ValueError(f"{node_type.__name__} already has a handler")
    _PROMPT_NODES[node_type] = handler
