"""Tracing: find the prompt a program sends first, without generating anything.

``run_batch`` traces the program on each item's arguments up to its first generation
request. The longest common prefix of those prompts (the system prompt, the few-shot
examples) is handed to the backend once, before the batch fans out, so it is computed
once for the whole batch (:meth:`structgen.contract.backend.Backend.warm`).

Tracing runs the program body with a state whose appends are queued as usual; the
first point where the body needs a generated value ends the trace. Nothing is sent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from structgen.contract.backend import Backend, SamplingParams
from structgen.errors import StructgenError
from structgen.lang.options import split_options
from structgen.lang.run import Run, current_run

if TYPE_CHECKING:
    from structgen.lang.program import Program

__all__ = ["common_prefix", "trace_first_prompt"]


class _StopTrace(Exception):
    """Raised inside the traced body when it needs a generated value."""


class _TraceRun(Run):
    def drive(self, interps: Sequence[Any]) -> None:  # the body wants a value: stop here
        raise _StopTrace

    async def adrive(self, interps: Sequence[Any]) -> None:
        raise _StopTrace


def trace_first_prompt(program: Program[Any], kwargs: Mapping[str, Any], backend: Backend) -> str | None:
    """The prompt of the first request ``program`` would send for ``kwargs``, or None."""
    try:
        sampling, pargs = split_options(dict(kwargs), program.arg_names)
    except StructgenError:
        return None
    run = _TraceRun(backend, program=program.name, defaults=SamplingParams(**{**program.defaults, **sampling}))
    token = current_run.set(run)
    try:
        program.func(run.state, **{**program.bound, **pargs})
    except _StopTrace:
        pass
    except Exception:
        return None
    finally:
        current_run.reset(token)
    request = run.root.step()
    return None if request is None else request.prompt


def common_prefix(prompts: Sequence[str]) -> str:
    """The longest common prefix of ``prompts`` ("" for none)."""
    if not prompts:
        return ""
    lo, hi = min(prompts), max(prompts)  # the common prefix of all is that of the extremes
    n = 0
    while n < len(lo) and lo[n] == hi[n]:
        n += 1
    return lo[:n]
