"""Tool calls as a constraint kind: what ``gen(..., tools=...)`` asks of a backend.

``gen(name, tools=[...], tool_choice=..., parallel_tool_calls=..., think=...)`` records a
:class:`ToolRequest`. When the program reaches it, the interpreter resolves it against
the backend's chat template (:meth:`ToolRequest.resolve`): the template decides the call
format (:mod:`structgen.tools.formats`), and the result is a :class:`ToolCallSpec`.

A :class:`ToolCallSpec` *is* a grammar constraint (a subclass of ``GrammarSpec`` carrying
the Lark grammar of :mod:`structgen.tools.grammar`), so every engine and backend translation
registered for grammars serves it unchanged; it is also its own constraint kind (``tools``,
:mod:`structgen.constraints.kind`) so a backend says with ``Capabilities.tools`` whether it
serves tool turns, and a backend with native tool calling registers its own translation.
Either way the output is checked by :meth:`ToolCallSpec.validate_output`, which parses the turn
and validates every call.

``tool_choice``: ``"auto"`` (answer or calls), ``"required"`` (calls), ``"none"`` (an
answer, no call), a tool's name (calls of that tool), or ``{"allowed": [names], "mode":
"auto"|"required", "call_threshold": p, "relevance_threshold": r, "grounding_threshold": g,
"coverage": c, "route": b}`` (``p``: see :mod:`structgen.tools.decision`; ``r``:
:mod:`structgen.tools.relevance`; ``g``: :mod:`structgen.tools.grounding`; ``None`` = off;
``c``: True (the default) or False, :mod:`structgen.tools.coverage`; ``b``: True (the
default) or False, whether relevance also picks a one-call turn's tool,
:func:`structgen.tools.relevance.routed_tool`).
``parallel_tool_calls``: ``False`` (one call), ``True`` (up to
:data:`MAX_PARALLEL`) or ``k`` (up to ``k``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from structgen.constraints.kind import ConstraintKind, register_kind
from structgen.constraints.spec import GrammarSpec
from structgen.contract.chat_template import ChatTemplate
from structgen.errors import ProgramError
from structgen.tools.budget import fit_calls
from structgen.tools.calls import ToolTurn, parse_turn
from structgen.tools.definition import Tool, as_tools
from structgen.tools.formats import FORMATS, INJECTED, ToolFormat, tools_template
from structgen.tools.grammar import tool_grammar
from structgen.tools.staging import first_stage

__all__ = ["MAX_PARALLEL", "ToolCallSpec", "ToolRequest", "normalize_choice", "normalize_think"]

#: the most calls one turn may make with ``parallel_tool_calls=True``
MAX_PARALLEL = 16
DEFAULT_THINK = ("<think>", "</think>")


def normalize_choice(tool_choice: Any, tools: Sequence[Tool]) -> tuple[str, tuple[str, ...]]:
    """``(mode, allowed tool names)`` for a ``tool_choice`` value."""
    names = tuple(t.name for t in tools)
    if tool_choice is None or tool_choice == "auto":
        return "auto", names
    if tool_choice in ("required", "none"):
        return str(tool_choice), names
    if isinstance(tool_choice, str):
        if tool_choice not in names:
            raise ProgramError(f"tool_choice {tool_choice!r} names no tool (tools: {list(names)})")
        return "required", (tool_choice,)
    if isinstance(tool_choice, Mapping):
        if any(k in tool_choice for k in ("allowed", "call_threshold", "relevance_threshold", "grounding_threshold",
                                          "coverage", "route")):
            allowed = tuple(tool_choice.get("allowed", names))
            mode = str(tool_choice.get("mode", "auto"))
            if mode not in ("auto", "required"):
                raise ProgramError(f"tool_choice mode must be 'auto' or 'required', not {mode!r}")
            unknown = [n for n in allowed if n not in names]
            if unknown or not allowed:
                raise ProgramError(f"tool_choice allows unknown or no tools: {unknown or '[]'}")
            return mode, allowed
        fn = tool_choice.get("function")
        if tool_choice.get("type") == "function" and isinstance(fn, Mapping):  # OpenAI's shape
            return normalize_choice(fn.get("name"), tools)
    raise ProgramError(f"tool_choice must be 'auto', 'required', 'none', a tool name or "
                       f"{{'allowed': [...]}}, not {tool_choice!r}")


def choice_threshold(tool_choice: Any) -> float | None:
    """``auto``'s call threshold when ``tool_choice`` sets one (``{"call_threshold": p}``)."""
    if not isinstance(tool_choice, Mapping) or "call_threshold" not in tool_choice:
        return None
    p = tool_choice["call_threshold"]
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
        raise ProgramError(f"call_threshold must be a probability in [0, 1], not {p!r}")
    return float(p)


_UNSET = object()


def choice_relevance(tool_choice: Any) -> Any:
    """``auto``'s relevance threshold when ``tool_choice`` sets one (``{"relevance_threshold":
    r}``: a number, or ``None`` = off); a private marker when it does not."""
    if not isinstance(tool_choice, Mapping) or "relevance_threshold" not in tool_choice:
        return _UNSET
    r = tool_choice["relevance_threshold"]
    if r is not None and (isinstance(r, bool) or not isinstance(r, (int, float)) or math.isnan(r)):
        raise ProgramError(f"relevance_threshold must be a number (nats per token) or None, not {r!r}")
    return None if r is None else float(r)


def choice_grounding(tool_choice: Any) -> Any:
    """``auto``'s grounding threshold when ``tool_choice`` sets one (``{"grounding_threshold":
    g}``: a share in [0, 1], or ``None`` = off); a private marker when it does not."""
    if not isinstance(tool_choice, Mapping) or "grounding_threshold" not in tool_choice:
        return _UNSET
    g = tool_choice["grounding_threshold"]
    if g is not None and (isinstance(g, bool) or not isinstance(g, (int, float)) or not 0 <= g <= 1):
        raise ProgramError(f"grounding_threshold must be a share in [0, 1] or None, not {g!r}")
    return None if g is None else float(g)


def _choice_flag(tool_choice: Any, key: str) -> bool:
    """A True/False option of a ``tool_choice`` dict; True when it is not given."""
    if not isinstance(tool_choice, Mapping) or key not in tool_choice:
        return True
    flag = tool_choice[key]
    if not isinstance(flag, bool):
        raise ProgramError(f"{key} must be True or False, not {flag!r}")
    return flag


def choice_coverage(tool_choice: Any) -> bool:
    """Whether a staged parallel turn asks for calls until the user's numbers are covered
    (:mod:`structgen.tools.coverage`; ``{"coverage": False}`` turns it off)."""
    return _choice_flag(tool_choice, "coverage")


def choice_route(tool_choice: Any) -> bool:
    """Whether ``auto``'s relevance decision also picks the tool of a one-call turn
    (:mod:`structgen.tools.relevance`; ``{"route": False}`` leaves the choice to the model)."""
    return _choice_flag(tool_choice, "route")


def normalize_parallel(parallel: Any) -> int:
    if parallel is False or parallel is None:
        return 1
    if parallel is True:
        return MAX_PARALLEL
    if isinstance(parallel, int) and parallel >= 1:
        return parallel
    raise ProgramError(f"parallel_tool_calls must be False, True or a positive int, not {parallel!r}")


def normalize_think(think: Any) -> tuple[Any, ...] | None:
    """``(open tag, close tag)`` or ``(open, close, max_chars)`` for a ``think`` value:
    ``True``, a tag pair, or ``{"tags": (open, close), "max_chars": n}`` (a bound on the
    thinking text, enforced by the grammar)."""
    if think is None or think is False:
        return None
    if think is True:
        return DEFAULT_THINK
    if isinstance(think, Mapping):
        tags = normalize_think(think.get("tags", True))
        limit = think.get("max_chars")
        if tags is None or (limit is not None and (not isinstance(limit, int) or limit < 0)):
            raise ProgramError(f"think dict needs 'tags' and a non-negative int 'max_chars', not {think!r}")
        return (tags[0], tags[1]) if limit is None else (tags[0], tags[1], limit)
    if isinstance(think, (tuple, list)) and len(think) == 2 and all(isinstance(t, str) and t for t in think):
        return (think[0], think[1])
    if (isinstance(think, tuple) and len(think) == 3 and isinstance(think[2], int)  # already normalized
            and think[2] >= 0 and normalize_think(think[:2]) is not None):
        return think
    raise ProgramError(f"think must be True, a pair of tags such as ('<think>', '</think>') or "
                       f"{{'tags': ..., 'max_chars': n}}, not {think!r}")


@dataclass(frozen=True)
class ToolCallSpec(GrammarSpec):
    """A tool-calling turn: the grammar plus what native tool APIs need."""

    tools: tuple[Tool, ...] = field(default=(), compare=False, hash=False)
    #: the tools' definitions as JSON (what equality and caching compare)
    tools_json: str = ""
    format: str = INJECTED.name
    mode: Literal["auto", "required", "none"] = "auto"
    allowed: tuple[str, ...] = ()
    max_calls: int = 1
    think: tuple[Any, ...] | None = None
    #: ``auto``'s scored first decision (:mod:`structgen.tools.decision`): None = off
    call_threshold: float | None = None
    #: the model's probability of opening the call block, once the decision is made
    call_probability: float | None = field(default=None, compare=False)
    #: ``auto``'s first decision by relevance (:mod:`structgen.tools.relevance`): None = off
    relevance_threshold: float | None = None
    #: the turn's relevance (the best tool's), once the decision is made
    relevance: float | None = field(default=None, compare=False)
    #: per allowed tool: (the model's gain, the lexical count) the relevance combines
    relevance_parts: tuple[tuple[float, float], ...] | None = field(default=None, compare=False)
    #: the tools those parts score (the turn's allowed tools before any routing)
    relevance_names: tuple[str, ...] | None = field(default=None, compare=False)
    #: a one-call turn committed by relevance calls its most relevant tool (False = off)
    route: bool = True
    #: the tool the relevance decision routed the call to, once made
    routed: str | None = field(default=None, compare=False)
    #: a call committed to by relevance is withdrawn below this grounding
    #: (:mod:`structgen.tools.grounding`): None = off
    grounding_threshold: float | None = None
    #: the committed calls' grounding, once they are checked
    grounding: float | None = field(default=None, compare=False)
    #: the text of calls withdrawn for their grounding (the turn then answers)
    declined_calls: str | None = field(default=None, compare=False)
    #: a staged turn's ``max_tokens`` (:mod:`structgen.tools.staging`): its calls are written
    #: one request each, as many as the tokens left allow; None = one request
    staged_budget: int | None = None
    #: the calls a staged turn can always make (the worst-case plan's ``k'``)
    staged_promise: int = 1
    #: a staged parallel turn asks for one more call while the user's numbers are not all
    #: used (:mod:`structgen.tools.coverage`)
    coverage: bool = True

    def describe(self) -> str:
        return f"tool calls ({self.mode}, {self.format}, tools {list(self.allowed)}, up to {self.max_calls})"

    @property
    def call_format(self) -> ToolFormat:
        return FORMATS[self.format]

    @property
    def allowed_tools(self) -> tuple[Tool, ...]:
        return tuple(t for t in self.tools if t.name in self.allowed)

    def validate_output(self, text: str, *, truncated: bool = False) -> ToolTurn:
        return parse_turn(text, self.call_format, self.tools, allowed=self.allowed, max_calls=self.max_calls,
                          mode=self.mode, think=self.think, truncated=truncated)

    def render_calls(self, calls: Sequence[tuple[str, Any]], content: str = "") -> str:
        """The canonical text of ``calls`` in this spec's format (native API results)."""
        text = self.call_format.render_calls(calls, content)
        return text


#: a tool-calling turn is its own kind: backends declare ``Capabilities.tools`` when they serve
#: it (by the grammar, which it also is, or by a native tool API)
register_kind(ConstraintKind(name="tools", spec_type=ToolCallSpec, feature="tools", description="tool calls",
                             validate=lambda spec, text, truncated: spec.validate_output(text, truncated=truncated)))


def build_spec(tools: Sequence[Tool], fmt: ToolFormat, *, tool_choice: Any = "auto", parallel: Any = False,
               think: Any = None, max_tokens: int | None = None, bound_calls: bool = True) -> ToolCallSpec:
    """The spec of one turn; with ``max_tokens`` the whole turn fits that budget
    (:func:`structgen.tools.budget.fit_calls`: bounded arguments; a parallel turn asking for
    more calls than fit at their longest is staged, :mod:`structgen.tools.staging` -- unless
    ``bound_calls`` is False: a chat API writes its calls in its own syntax, so only the
    arguments are bounded there)."""
    mode, allowed = normalize_choice(tool_choice, tools)
    k = normalize_parallel(parallel)
    th = normalize_think(think)
    chosen = [t for t in tools if t.name in allowed]
    fitted, caps = chosen, None
    staged, promised = False, 1
    reserved = 0 if th is None or len(th) < 3 else len(th[0]) + len(th[1]) + 1 + int(th[2])
    if max_tokens is not None and mode != "none":
        fit_k, bounded = fit_calls(fmt, chosen, max_tokens=max_tokens, max_calls=k, reserved=reserved)
        staged = bound_calls and fit_k < k  # more calls asked for than fit at their longest
        promised = fit_k if staged else 1
        fitted, caps = [t for t, _ in bounded], [c for _, c in bounded]
    if staged and max_tokens is not None:  # one request per call (structgen.tools.staging)
        grammar = first_stage(fmt, chosen, mode=mode, max_tokens=max_tokens, promised=promised, reserved=reserved,
                              think=th)
    else:
        grammar = tool_grammar(fmt, fitted, mode=mode, max_calls=k, think=th, caps=caps)
    tools_json = json.dumps([t.openai() for t in tools], sort_keys=True)
    threshold = relevance = grounding = None
    if mode == "auto" and fmt.opens_in_auto and th is None:  # auto's first decision, scored by the model
        from structgen.tools.decision import DEFAULT_CALL_THRESHOLD
        from structgen.tools.relevance import DEFAULT_RELEVANCE_THRESHOLD

        given = choice_threshold(tool_choice)
        threshold = DEFAULT_CALL_THRESHOLD if given is None else (given or None)
        r = choice_relevance(tool_choice)
        probe_chosen = isinstance(tool_choice, Mapping) and "call_threshold" in tool_choice
        # the default: relevance decides; a call_threshold given alone chooses the probe
        relevance = (None if probe_chosen else DEFAULT_RELEVANCE_THRESHOLD) if r is _UNSET else r
        if relevance is not None:  # a call committed to by relevance is checked for its grounding
            from structgen.tools.grounding import DEFAULT_GROUNDING_THRESHOLD

            g = choice_grounding(tool_choice)
            grounding = DEFAULT_GROUNDING_THRESHOLD if g is _UNSET else g
    return ToolCallSpec(grammar=grammar, tools=tuple(tools), tools_json=tools_json, format=fmt.name,
                        mode=mode, allowed=allowed, max_calls=k, think=th,  # type: ignore[arg-type]
                        call_threshold=threshold, relevance_threshold=relevance, grounding_threshold=grounding,
                        staged_budget=max_tokens if staged else None, staged_promise=promised,
                        coverage=choice_coverage(tool_choice), route=choice_route(tool_choice))


@dataclass(frozen=True)
class ToolRequest:
    """``gen(tools=...)`` before the backend is known: resolved by the interpreter."""

    tools: tuple[Tool, ...]
    tool_choice: Any = "auto"
    parallel: Any = False
    think: Any = None
    kind: str = "tool_request"

    @classmethod
    def make(cls, tools: Any, tool_choice: Any = "auto", parallel: Any = False, think: Any = None) -> ToolRequest:
        resolved = as_tools(tools)
        normalize_choice(tool_choice, resolved)  # errors now, at gen(), not mid-run
        choice_threshold(tool_choice)
        choice_relevance(tool_choice)
        choice_grounding(tool_choice)
        choice_coverage(tool_choice)
        choice_route(tool_choice)
        normalize_parallel(parallel)
        normalize_think(think)
        choice = json.dumps(tool_choice, sort_keys=True) if isinstance(tool_choice, Mapping) else tool_choice
        return cls(resolved, choice, parallel, normalize_think(think))

    def choice(self) -> Any:
        c = self.tool_choice
        return json.loads(c) if isinstance(c, str) and c.startswith("{") else c

    def committed(self, only: str | None = None) -> ToolRequest:
        """The same turn with a call forced among its allowed tools (``only``: that one):
        ``auto`` once its first decision (:mod:`structgen.tools.relevance`) chose to call."""
        _, allowed = normalize_choice(self.choice(), self.tools)
        if only is not None:
            if only not in allowed:
                raise ProgramError(f"cannot route the call to {only!r}: not an allowed tool {list(allowed)}")
            allowed = (only,)
        forced: dict[str, Any] = {"mode": "required", "allowed": list(allowed)}
        if not choice_coverage(self.choice()):
            forced["coverage"] = False
        choice = json.dumps(forced, sort_keys=True)
        return dataclasses.replace(self, tool_choice=choice)

    def resolve(self, template: ChatTemplate | None, max_tokens: int | None = None) -> ToolCallSpec:
        """The spec for a backend whose template is ``template`` (None: chat APIs, which
        take tools natively; their results are written in the injected format), its
        calls fitted to ``max_tokens`` when given."""
        fmt = INJECTED if template is None else tools_template(template)[1]
        # the count, not the value, is the key: True == 1 as a dataclass field, 16 calls vs 1
        key = (self, fmt, max_tokens, template is not None, normalize_parallel(self.parallel))
        try:
            hash(key)
        except TypeError:  # built by hand with an unhashable field: not memoized
            return _build(*key)
        return _resolved(*key)

    def describe(self) -> str:
        return f"tool calls ({', '.join(t.name for t in self.tools)})"


def _build(request: ToolRequest, fmt: ToolFormat, max_tokens: int | None, bound_calls: bool,
           parallel: int) -> ToolCallSpec:
    return build_spec(request.tools, fmt, tool_choice=request.choice(), parallel=parallel,
                      think=request.think, max_tokens=max_tokens, bound_calls=bound_calls)


#: a turn's spec, built once: a probed ``auto`` turn resolves its request twice (the probe,
#: then the decided turn), and a program run again with the same tools resolves the same
#: request. A pure function of its key (tools compare by identity; a tool's schema is not
#: expected to change in place once it is in use).
_resolved = functools.lru_cache(maxsize=256)(_build)
