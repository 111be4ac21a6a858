"""Programs: decorated functions and the ways to run them.

``@program`` (alias ``function``) wraps ``def f(s, ...)``. ``f.run(...)`` (or ``f(...)``)
runs it once and returns its :class:`~structgen.lang.state.ProgramState`; ``run(stream=True)``
returns at once and streams; ``run_batch`` runs many argument sets concurrently, each
item's failure reported on that item; ``arun`` is the async entry point.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields
from typing import Any

from structgen.contract.backend import Backend, SamplingParams
from structgen.contract.registry import resolve
from structgen.errors import ProgramError, StructgenError
from structgen.lang.run import Run, current_run
from structgen.lang.state import ProgramState, _Stream
from structgen.lang.tracer import common_prefix, trace_first_prompt

__all__ = ["Program", "function", "program"]

_SAMPLING_NAMES = {f.name for f in fields(SamplingParams)}
_RUN_ALIASES = {"max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens"}
#: SGLang options with no meaning here (its executor threads, API speculative decoding).
_IGNORED = {"use_thread", "num_api_spec_tokens"}


def _split_kwargs(kwargs: dict[str, Any], arg_names: Iterable[str] = ()) -> tuple[dict[str, Any], dict[str, Any]]:
    """Separate run-level sampling defaults from program arguments (a program's own
    parameter names win: ``def f(s, n)`` takes ``n`` as its argument)."""
    sampling, args = {}, {}
    own = set(arg_names)
    for k, v in kwargs.items():
        if k in _IGNORED and k not in own:
            continue
        key = _RUN_ALIASES.get(k, k)
        if key in _SAMPLING_NAMES and k not in own:
            if v is not None:
                sampling[key] = tuple(v) if isinstance(v, list) else (
                    (v,) if key in ("stop", "stop_regex") and isinstance(v, str) else v)
        else:
            args[k] = v
    return sampling, args


class Program:
    """A structured LLM program: a Python function over a state ``s``."""

    def __init__(self, func: Callable[..., Any], *, name: str | None = None,
                 backend: Backend | str | None = None, bound: dict[str, Any] | None = None,
                 **defaults: Any):
        if not callable(func):
            raise ProgramError(f"@program needs a function, not {func!r}")
        self.func = func
        self.name = name or getattr(func, "__name__", "program")
        self.backend = backend
        self.bound = dict(bound or {})
        sampling, extra = _split_kwargs(defaults)
        if extra:
            raise ProgramError(f"unknown program options {sorted(extra)}", program=self.name)
        self.defaults = sampling
        params = list(inspect.signature(func).parameters.values())
        if not params:
            raise ProgramError("a program's first parameter is the state `s`", program=self.name)
        self.arg_names = [p.name for p in params[1:]]
        self.__doc__ = func.__doc__
        self.__name__ = self.name
        self.__wrapped__ = func

    def bind(self, **kwargs: Any) -> Program:
        """A copy with some arguments fixed."""
        return Program(self.func, name=self.name, backend=self.backend,
                       bound={**self.bound, **kwargs}, **self.defaults)

    # -- one run -------------------------------------------------------------------------------
    def _prepare(self, args: tuple, kwargs: dict[str, Any], backend: Backend | str | None,
                 stream: bool) -> tuple[Run, ProgramState, dict[str, Any]]:
        sampling, pargs = _split_kwargs(kwargs, self.arg_names)
        if len(args) > len(self.arg_names):
            raise ProgramError(f"takes {len(self.arg_names)} argument(s), got {len(args)}",
                               program=self.name)
        call_kwargs = {**self.bound, **dict(zip(self.arg_names, args)), **pargs}
        outer = current_run.get()
        chosen = backend or self.backend or (outer.backend if outer is not None else None)
        be = resolve(chosen)
        defaults = SamplingParams(**{**self.defaults, **sampling})
        run = Run(be, program=self.name, defaults=defaults, stream=stream)
        s_stream = _Stream() if stream else None
        interp = run.new_interpreter(emit=s_stream.emit if s_stream else None)
        return run, ProgramState(run, interp, stream=s_stream), call_kwargs

    def _execute(self, run: Run, state: ProgramState, call_kwargs: dict[str, Any]) -> None:
        """Run the body, then everything it queued; failures land in the state."""
        token = current_run.set(run)
        try:
            self.func(state, **call_kwargs)
            run.drive([state._interp])
        except StructgenError as exc:
            state._interp.fail(exc)
        except Exception as exc:
            err = ProgramError(f"the program body raised {type(exc).__name__}: {exc}")
            err.__cause__ = exc
            state._interp.fail(err)
        finally:
            current_run.reset(token)

    def run(self, *args: Any, backend: Backend | str | None = None, stream: bool = False,
            **kwargs: Any) -> ProgramState:
        """Run once. Raises the run's :class:`StructgenError` if it failed (except when
        streaming: then the error is raised by the text iterators and kept in ``error()``)."""
        run, state, call_kwargs = self._prepare(args, kwargs, backend, stream)
        if stream:
            def body() -> None:
                try:
                    self._execute(run, state, call_kwargs)
                finally:
                    state._stream.close()  # type: ignore[union-attr]

            thread = threading.Thread(target=body, name=f"structgen-{self.name}", daemon=True)
            state._thread = thread
            thread.start()
            return state
        self._execute(run, state, call_kwargs)
        if state._interp.error is not None:
            raise state._interp.error
        return state

    __call__ = run

    async def arun(self, *args: Any, backend: Backend | str | None = None, **kwargs: Any) -> ProgramState:
        """Async run: the body runs off the event loop; what it leaves queued is driven
        with the backend's async API."""
        run, state, call_kwargs = self._prepare(args, kwargs, backend, False)

        def body() -> None:
            token = current_run.set(run)
            try:
                self.func(state, **call_kwargs)
            finally:
                current_run.reset(token)

        try:
            await asyncio.to_thread(body)
            await run.adrive([state._interp])
        except StructgenError as exc:
            state._interp.fail(exc)
        except Exception as exc:
            err = ProgramError(f"the program body raised {type(exc).__name__}: {exc}")
            err.__cause__ = exc
            state._interp.fail(err)
        if state._interp.error is not None:
            raise state._interp.error
        return state

    # -- many runs --------------------------------------------------------------------------------
    def run_batch(self, batch_kwargs: Iterable[dict[str, Any]], *, backend: Backend | str | None = None,
                  num_threads: int | str = "auto", progress_bar: bool = False,
                  generator_style: bool = False, **kwargs: Any) -> list[ProgramState] | Iterator[ProgramState]:
        """Run once per argument dict, concurrently. Never raises for one item: each
        returned state's ``error()`` says whether that item failed. With
        ``generator_style=True`` returns an iterator yielding states in input order."""
        items = list(batch_kwargs)
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise ProgramError(f"run_batch item {i} is a {type(item).__name__}, not a dict",
                                   program=self.name)
        be = resolve(backend or self.backend)
        if num_threads == "auto":
            workers = max(1, min(len(items), max(64, (os.cpu_count() or 1) * 16)))
        else:
            workers = max(1, int(num_threads))

        def one(item: dict[str, Any]) -> ProgramState:
            try:
                run, state, call_kwargs = self._prepare((), {**kwargs, **item}, be, False)
            except StructgenError as exc:
                run = Run(be, program=self.name, defaults=SamplingParams())
                state = ProgramState(run, run.new_interpreter())
                state._interp.fail(exc)
                return state
            self._execute(run, state, call_kwargs)
            return state

        if len(items) > 1 and be.capabilities.prefix_cache:
            self._warm_shared_prefix(items, kwargs, be)
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"structgen-{self.name}")
        futures = [pool.submit(one, item) for item in items]
        pool.shutdown(wait=False)

        def gen() -> Iterator[ProgramState]:
            done = 0
            for fut in futures:
                state = fut.result()
                done += 1
                if progress_bar:
                    print(f"\r{self.name}: {done}/{len(futures)}", end="", file=sys.stderr, flush=True)
                yield state
            if progress_bar:
                print(file=sys.stderr)

        return gen() if generator_style else list(gen())

    def shared_prefix(self, batch_kwargs: Iterable[dict[str, Any]], *,
                      backend: Backend | str | None = None, **kwargs: Any) -> str:
        """The text every item of a batch sends first (found by tracing, nothing sent),
        cut after its last newline so the tokenization of the cut is stable."""
        be = resolve(backend or self.backend)
        prompts = []
        for item in batch_kwargs:
            prompt = trace_first_prompt(self, {**kwargs, **item}, be)
            if prompt is None:
                return ""
            prompts.append(prompt)
        prefix = common_prefix(prompts)
        cut = prefix.rfind("\n")
        return prefix[:cut + 1] if cut >= 0 else ""

    def _warm_shared_prefix(self, items: list[dict[str, Any]], kwargs: dict[str, Any], be: Backend) -> None:
        prefix = self.shared_prefix(items, backend=be, **kwargs)
        if prefix:
            try:
                be.warm(prefix)
            except StructgenError:
                pass  # warming is an optimisation: the items run (and report) regardless

    def __repr__(self) -> str:
        return f"<structgen program {self.name}({', '.join(self.arg_names)})>"


def program(func: Callable[..., Any] | None = None, **options: Any) -> Any:
    """Decorate ``def f(s, ...)`` as a program; usable bare or with options
    (``@program(max_tokens=64, backend=...)``)."""
    if func is not None:
        return Program(func, **options)

    def decorate(f: Callable[..., Any]) -> Program:
        return Program(f, **options)

    return decorate


function = program
