"""The agent loop: generate a turn, run its calls, show the results, until an answer.

``run_tools(s, tools, ...)`` appends assistant turns to a program state ``s``, each a
constrained tool-calling ``gen``; runs the calls of each turn concurrently
(:class:`~structgen.tools.executor.ToolExecutor`); appends their results in the
template's tool role; and stops at an answer or a limit:

* ``max_steps`` turns, ``max_calls`` calls in all, ``max_seconds`` of wall time;
* the loop guard: a call identical (same tool, same arguments) to one already made;
  (a turn stopped by a limit or the guard keeps its calls in the record, each with the
  error ``not run (<reason>)``)
* a call of a tool without an implementation (a pydantic model as a "final answer"
  tool): its validated arguments are the result.

Every step is recorded (:class:`StepRecord`: each call's tool, arguments, result or error
and duration; tokens computed vs reused from the cache) and readable from the state:
``s[name]`` is the answer text, ``s.value(name)`` the :class:`AgentResult`. Given a
:class:`~structgen.lang.state.ForkGroup`, the children run as parallel sub-agents: their
turns are generated as one batch and their calls run together.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from structgen.errors import ProgramError
from structgen.tools.calls import ToolCall, ToolResult, ToolTurn
from structgen.tools.definition import Tool, as_tools
from structgen.tools.executor import ToolExecutor

__all__ = ["AgentResult", "CallRecord", "StepRecord", "run_tools"]


@dataclass
class CallRecord:
    id: str
    tool: str
    arguments: dict[str, Any]
    result: Any = None
    error: str | None = None
    duration_s: float = 0.0


@dataclass
class StepRecord:
    index: int
    variable: str
    content: str
    calls: list[CallRecord] = field(default_factory=list)
    prompt_tokens: int | None = None
    #: prompt tokens reused from the backend's cache / computed (when the backend says)
    cached_tokens: int | None = None
    computed_tokens: int | None = None
    duration_s: float = 0.0


@dataclass
class AgentResult:
    answer: str | None
    steps: list[StepRecord] = field(default_factory=list)
    #: why the loop ended: answer, final_tool, max_steps, max_calls, max_seconds, loop_guard
    stopped: str = "answer"
    final: Any = None

    @property
    def calls(self) -> list[CallRecord]:
        return [c for s in self.steps for c in s.calls]


@dataclass
class _Agent:
    state: Any
    result: AgentResult = field(default_factory=lambda: AgentResult(answer=None))
    seen: Counter[str] = field(default_factory=Counter)
    done: bool = False


def _states(target: Any) -> tuple[list[Any], bool]:
    from structgen.lang.state import ForkGroup, ProgramState

    if isinstance(target, ForkGroup):
        return list(target), True
    if isinstance(target, ProgramState):
        return [target], False
    raise ProgramError(f"run_tools needs a program state or a fork group, not {type(target).__name__}")


def _record(agent: _Agent, name: str, answer: str | None, stopped: str) -> None:
    agent.done = True
    agent.result.answer = answer
    agent.result.stopped = stopped
    agent.state.set_result(name, answer or "", agent.result,
                           {"stopped": stopped, "steps": len(agent.result.steps), "calls": len(agent.result.calls)})


def run_tools(s: Any, tools: Any, *, name: str = "agent", max_steps: int = 6, tool_choice: Any = "auto",
              parallel_tool_calls: bool | int = True, max_calls: int = 32, max_seconds: float | None = None,
              tool_timeout: float | None = 30.0, loop_guard: bool = True, think: Any = None,
              max_tokens: int = 256, **gen_options: Any) -> Any:
    """Run the tool loop on ``s`` (a state whose prompt shows ``tools``, see
    :func:`structgen.use_tools`). Returns the :class:`AgentResult` (a list of them for a
    fork group). The step variables are ``{name}_{i}``."""
    from structgen.lang.api import assistant, gen, tool_results
    from structgen.lang.state import ProgramState

    tool_list = as_tools(tools)
    if max_steps < 1 or max_calls < 1:
        raise ProgramError("max_steps and max_calls must be at least 1")
    states, many = _states(s)
    agents = [_Agent(st) for st in states]
    start = time.monotonic()
    deadline = None if max_seconds is None else start + max_seconds
    with ToolExecutor(tool_list, timeout=tool_timeout) as executor:
        for step in range(max_steps):
            live = [a for a in agents if not a.done]
            if not live:
                break
            var = f"{name}_{step}"
            t0 = time.perf_counter()
            for a in live:
                a.state += assistant(gen(var, tools=tool_list, tool_choice=tool_choice,
                                         parallel_tool_calls=parallel_tool_calls, think=think,
                                         max_tokens=max_tokens, **gen_options))
            ProgramState.sync_all([a.state for a in live])
            pending: list[tuple[_Agent, StepRecord, list[ToolCall]]] = []
            for a in live:
                a.state.raise_if_failed()
                turn: ToolTurn = a.state.value(var)
                meta = a.state.get_meta_info(var) or {}
                rec = StepRecord(step, var, turn.content, prompt_tokens=meta.get("prompt_tokens"),
                                 cached_tokens=meta.get("cached_tokens"), computed_tokens=meta.get("computed_tokens"),
                                 duration_s=time.perf_counter() - t0)
                a.result.steps.append(rec)
                for c in turn.calls:
                    rec.calls.append(CallRecord(c.id, c.name, c.raw_arguments))
                if not turn.calls:
                    _record(a, name, turn.content, "answer")
                    continue
                final = next((c for c in turn.calls if _tool(tool_list, c.name).fn is None), None)
                if final is not None:
                    a.result.final = final.arguments
                    _record(a, name, turn.content or None, "final_tool")
                    continue
                stop = None
                if loop_guard and any(a.seen[c.key()] for c in turn.calls):
                    stop = "loop_guard"
                elif sum(len(x.calls) for x in a.result.steps) > max_calls:
                    stop = "max_calls"
                elif deadline is not None and time.monotonic() >= deadline:
                    stop = "max_seconds"
                if stop is not None:  # this turn's calls are recorded, not run
                    for cr in rec.calls:
                        cr.error = f"not run ({stop})"
                    _record(a, name, None, stop)
                    continue
                a.seen.update(c.key() for c in turn.calls)
                pending.append((a, rec, list(turn.calls)))
            if not pending:
                continue
            flat = [c for _, _, calls in pending for c in calls]
            results = executor.run(flat, deadline=deadline)
            i = 0
            for a, rec, calls in pending:
                mine: list[ToolResult] = results[i:i + len(calls)]
                i += len(calls)
                for cr, res in zip(rec.calls, mine, strict=True):
                    cr.result, cr.error, cr.duration_s = res.value, res.error, res.duration_s
                a.state += tool_results(mine)
        for a in agents:
            if not a.done:
                _record(a, name, None, "max_steps")
    out = [a.result for a in agents]
    return out if many else out[0]


def _tool(tools: Sequence[Tool], name: str) -> Tool:
    return next(t for t in tools if t.name == name)
