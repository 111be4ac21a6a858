"""Programs: decorated functions and the ways to run them.

``@program`` (alias ``function``) wraps ``def f(s, ...)``. ``f.run(...)`` (or ``f(...)``)
runs it once and returns its :class:`~structgen.lang.state.ProgramState`; ``run(stream=True)``
returns at once and streams; ``run_batch`` runs many argument sets concurrently, each
item's failure reported on that item (:mod:`structgen.lang.batch`); ``arun`` is the async
entry point. Each run is a :class:`~structgen.lang.run.Run`, which owns its lifecycle.

The decorator keeps the function's signature for type checkers (``ParamSpec``): a wrong
argument name or type in ``f.run(...)`` / ``f(...)`` is a type error. Run options
(``backend=``, ``stream=``, sampling options such as ``temperature=``) are accepted by
``run`` at runtime, as in SGLang; type-checked code passes them through
``f.with_options(...)``, whose keywords are typed (:class:`RunOptions`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Concatenate, Generic, Literal, ParamSpec, TypedDict, Unpack, overload

from structgen.contract.backend import Backend, Cancellation, SamplingParams
from structgen.contract.registry import resolve
from structgen.errors import ProgramError
from structgen.lang.options import split_options
from structgen.lang.run import Body, Run, current_run
from structgen.lang.state import ProgramState
from structgen.lang.tracer import common_prefix, trace_first_prompt

__all__ = ["Program", "RunOptions", "function", "program"]

P = ParamSpec("P")

#: a program function: ``def f(s, ...)``
ProgramFunc = Callable[Concatenate[ProgramState, P], Any]


class RunOptions(TypedDict, total=False):
    """Sampling options a run (or ``@program``) takes as defaults for its ``gen`` calls."""

    max_tokens: int
    max_new_tokens: int
    min_tokens: int
    min_new_tokens: int
    n: int
    stop: str | Sequence[str]
    stop_token_ids: Sequence[int]
    stop_regex: str | Sequence[str]
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    frequency_penalty: float
    presence_penalty: float
    ignore_eos: bool
    return_logprob: bool
    logprob_start_len: int
    top_logprobs_num: int
    return_text_in_logprobs: bool
    seed: int
    use_thread: bool  # SGLang's; no meaning here
    num_api_spec_tokens: int  # SGLang's; no meaning here


class Program(Generic[P]):
    """A structured LLM program: a Python function over a state ``s``."""

    def __init__(self, func: ProgramFunc[P], *, name: str | None = None,
                 backend: Backend | str | None = None, bound: Mapping[str, Any] | None = None,
                 stream: bool = False, **defaults: Any):
        if not callable(func):
            raise ProgramError(f"@program needs a function, not {func!r}")
        self.func = func
        self.name: str = name or str(getattr(func, "__name__", "program"))
        self.backend = backend
        self.stream = stream
        self.bound = dict(bound or {})
        sampling, extra = split_options(defaults, program=self.name)
        if extra:
            raise ProgramError(f"unknown program options {sorted(extra)}", program=self.name)
        self.defaults = sampling
        #: the sampling defaults of a run that sets none of its own
        self.sampling_params = SamplingParams(**sampling)
        params = list(inspect.signature(func).parameters.values())
        if not params:
            raise ProgramError("a program's first parameter is the state `s`", program=self.name)
        self.arg_names = [p.name for p in params[1:]
                          if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        self._var_kw = any(p.kind is p.VAR_KEYWORD for p in params[1:])
        self.__doc__ = func.__doc__
        self.__name__ = self.name
        self.__wrapped__ = func

    def bind(self, **kwargs: Any) -> Program[...]:
        """A copy with some arguments fixed."""
        return Program(self.func, name=self.name, backend=self.backend, stream=self.stream,
                       bound={**self.bound, **kwargs}, **self.defaults)

    def with_options(self, *, backend: Backend | str | None = None, stream: bool | None = None,
                     **options: Unpack[RunOptions]) -> Program[P]:
        """A copy whose runs use ``backend`` / ``stream`` and these sampling defaults
        (typed: ``f.with_options(temperature=0.2).run(...)``)."""
        return Program(self.func, name=self.name, backend=backend or self.backend,
                       stream=self.stream if stream is None else stream, bound=self.bound,
                       **{**self.defaults, **options})

    # -- one run ---------------------------------------------------------------------------------
    def new_run(self, args: Sequence[Any], kwargs: Mapping[str, Any], *, backend: Backend | str | None,
                stream: bool = False, cancel: Cancellation | None = None) -> tuple[Run, Body]:
        """The run for one call (``run``, ``arun``, each ``run_batch`` item) and its body;
        OptionError / ProgramError for bad arguments. Nothing runs yet."""
        sampling, pargs = split_options(dict(kwargs), self.arg_names, program=self.name)
        if len(args) > len(self.arg_names):
            raise ProgramError(f"takes {len(self.arg_names)} argument(s), got {len(args)}",
                               program=self.name)
        call_kwargs = {**self.bound, **dict(zip(self.arg_names, args, strict=False)), **pargs}
        unknown = [k for k in pargs if k not in self.arg_names]
        if unknown and not self._var_kw:
            raise ProgramError(f"unknown argument(s) {sorted(unknown)}; the program takes "
                               f"{self.arg_names} and sampling options", program=self.name)
        outer = current_run.get()  # a program called inside another's body: its backend, its cancel flag
        chosen = backend or self.backend or (outer.backend if outer is not None else None)
        if cancel is None and outer is not None:
            cancel = outer.cancel
        defaults = SamplingParams(**{**self.defaults, **sampling}) if sampling else self.sampling_params
        run = Run(resolve(chosen), program=self.name, defaults=defaults, stream=stream, cancel=cancel)
        func: Callable[..., Any] = self.func
        return run, lambda state: func(state, **call_kwargs)

    def run(self, *args: P.args, **kwargs: P.kwargs) -> ProgramState:
        """Run once and return the state; raises the run's :class:`StructgenError` if it
        failed (except when streaming: then the text iterators raise it, and ``error()``
        returns it). Also takes ``backend=``, ``stream=`` and sampling options."""
        options: dict[str, Any] = dict(kwargs)
        backend = options.pop("backend", None)
        stream = bool(options.pop("stream", self.stream))
        run, body = self.new_run(args, options, backend=backend, stream=stream)
        if stream:
            run.start(body)
            return run.state
        run.execute(body)
        run.raise_for_error()
        return run.state

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> ProgramState:
        """``f(...)`` is ``f.run(...)``."""
        return self.run(*args, **kwargs)

    async def arun(self, *args: P.args, **kwargs: P.kwargs) -> ProgramState:
        """Async run: the body runs off the event loop; what it leaves queued is driven
        with the backend's async API. Also takes ``backend=`` and sampling options."""
        options: dict[str, Any] = dict(kwargs)
        backend = options.pop("backend", None)
        run, body = self.new_run(args, options, backend=backend)
        await run.aexecute(body)
        run.raise_for_error()
        return run.state

    # -- many runs --------------------------------------------------------------------------------
    @overload
    def run_batch(self, batch_kwargs: Iterable[Mapping[str, Any]], *, backend: Backend | str | None = None,
                  num_threads: int | str = "auto", progress_bar: bool = False,
                  generator_style: Literal[False] = False, **kwargs: Any) -> list[ProgramState]: ...

    @overload
    def run_batch(self, batch_kwargs: Iterable[Mapping[str, Any]], *, backend: Backend | str | None = None,
                  num_threads: int | str = "auto", progress_bar: bool = False,
                  generator_style: Literal[True], **kwargs: Any) -> Iterator[ProgramState]: ...

    def run_batch(self, batch_kwargs: Iterable[Mapping[str, Any]], *, backend: Backend | str | None = None,
                  num_threads: int | str = "auto", progress_bar: bool = False,
                  generator_style: bool = False, **kwargs: Any) -> list[ProgramState] | Iterator[ProgramState]:
        """Run once per argument dict, concurrently; states in input order.

        Never raises for one item: each state's ``error()`` says whether that item failed
        (a bad option in one item fails that item alone). ``progress_bar=True`` shows a
        progress bar (rich) on stderr. ``generator_style=True`` returns an iterator.
        Ctrl-C (or a KeyboardInterrupt / SystemExit in an item) cancels the batch's
        outstanding requests and raises :class:`~structgen.errors.BatchInterrupted` with
        every item's state: finished ones with their results.
        """
        from structgen.lang.batch import Batch

        batch = Batch(self, batch_kwargs, backend=backend or self.backend, num_threads=num_threads,
                      progress_bar=progress_bar, kwargs=kwargs)
        states = batch.states()
        return states if generator_style else list(states)

    def shared_prefix(self, batch_kwargs: Iterable[Mapping[str, Any]], *,
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

    def __repr__(self) -> str:
        return f"<structgen program {self.name}({', '.join(self.arg_names)})>"


@overload
def program(func: ProgramFunc[P], /) -> Program[P]: ...


@overload
def program(*, name: str | None = None, backend: Backend | str | None = None,
            **options: Unpack[RunOptions]) -> Callable[[ProgramFunc[P]], Program[P]]: ...


def program(func: Any = None, /, **options: Any) -> Any:
    """Decorate ``def f(s, ...)`` as a program; usable bare or with options
    (``@program(max_tokens=64, backend=...)``)."""
    if func is not None:
        return Program(func, **options)

    def decorate(f: ProgramFunc[P]) -> Program[P]:
        return Program(f, **options)

    return decorate


function = program
