"""What a program sees as ``s``: :class:`ProgramState` and :class:`ForkGroup`.

Appending (``s += ...``) only queues nodes in the state's interpreter; generation runs
when a value is needed (``s["x"]``, ``s.text()``, a fork, a join) or when the program
returns. Deferring lets a fork's children be sent to the backend as one batch. A state
reads its interpreter and asks its :class:`~structgen.lang.run.Run` to drive it; it owns
nothing of the run's lifecycle.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

from structgen.errors import ProgramError, StructgenError
from structgen.lang.interpreter import Interpreter
from structgen.lang.ir import Expr, RoleBegin, RoleEnd, VarScopeBegin, VarScopeEnd, as_node

if TYPE_CHECKING:
    from structgen.lang.run import Run

__all__ = ["ForkGroup", "ProgramState"]


class ProgramState:
    """The state of one running program (or one fork of it)."""

    def __init__(self, run: Run, interp: Interpreter, *, peers: Sequence[Interpreter] | None = None):
        self._run = run
        self._interp = interp
        self._peers = peers  # a fork group's interpreters, driven together

    # -- appending ---------------------------------------------------------------------------
    def __iadd__(self, other: Any) -> ProgramState:
        self._interp.submit(as_node(other))
        return self

    def submit(self, other: Any) -> None:
        self._interp.submit(as_node(other))

    # -- synchronisation -----------------------------------------------------------------------
    def sync(self) -> ProgramState:
        """Run everything appended so far."""
        self._run.sync(self._peers or [self._interp])
        return self

    @staticmethod
    def sync_all(states: Sequence[ProgramState]) -> None:
        """Run everything appended so far to ``states`` (states of one run, such as some of
        a fork group's children) together: their requests go to the backend as one batch."""
        if not states:
            return
        run = states[0]._run
        if any(st._run is not run for st in states):
            raise ProgramError("sync_all takes states of one run", program=run.program)
        run.sync([st._interp for st in states])

    def set_result(self, name: str, text: str, value: Any = None, meta: dict[str, Any] | None = None) -> None:
        """Record a result a helper computed on this state (an agent loop's answer, say):
        ``s[name]`` is ``text``, ``s.value(name)`` is ``value`` (``text`` when None) and
        ``s.get_meta_info(name)`` is ``meta``. The prompt text is not changed."""
        self._interp.variables[name] = text
        self._interp.values[name] = text if value is None else value
        if meta is not None:
            self._interp.meta[name] = dict(meta)

    def error(self) -> StructgenError | None:
        """The error this run failed with, or ``None``."""
        self.sync()
        return self._interp.error

    @property
    def finished(self) -> bool:
        """Whether everything appended so far has run without an error (does not wait)."""
        if self._interp is self._run.root:
            return self._run.finished
        return self._interp.idle and self._interp.error is None

    def raise_if_failed(self) -> None:
        """Raise the error this state's run stopped on, if any (does not wait)."""
        if self._interp.error is not None:
            raise self._interp.error

    # -- variables -------------------------------------------------------------------------------
    def __getitem__(self, name: str) -> Any:
        self.sync()
        if name in self._interp.variables:
            return self._interp.variables[name]
        self.raise_if_failed()
        raise ProgramError(f"no variable {name!r} (defined: {sorted(self._interp.variables)})",
                           program=self._run.program)

    def __setitem__(self, name: str, value: Any) -> None:
        self.sync()
        self._interp.set_variable(name, value)

    def __contains__(self, name: str) -> bool:
        self.sync()
        return name in self._interp.variables

    def get_var(self, name: str) -> Any:
        return self[name]

    def set_var(self, name: str, value: Any) -> None:
        self[name] = value

    def value(self, name: str) -> Any:
        """The validated, typed value of a variable: a pydantic model instance for
        ``json_schema=Model``, the parsed dict/list for a JSON schema, ``int``/``float``/
        ``bool`` for ``dtype=``, the chosen string for ``select``, else the text."""
        self.sync()
        if name in self._interp.values:
            return self._interp.values[name]
        return self[name]  # the text, or the right error

    def values(self) -> dict[str, Any]:
        """Every variable's typed value (see :meth:`value`)."""
        self.sync()
        return dict(self._interp.values)

    def confidence(self, name: str, source: str | None = None) -> dict[str, dict[str, Any]]:
        """Per-field confidence of a JSON variable generated with ``return_logprob=True``:
        ``{json path: {"mean": ..., "min": ...}}``, the token log-probabilities of each leaf
        value, in the constrained distribution where the backend reports it
        (:mod:`structgen.extract.confidence`); given the ``source`` text the values were
        read from, string and number leaves also get ``"grounded"`` (the value occurs in it);
        string and number list items get ``"repeated"`` (an earlier item wrote the same value
        for the same field)."""
        from structgen.extract.confidence import confidence_entries, leaf_confidence, token_spans

        text = self[name]
        entries = confidence_entries(self._interp.meta.get(name) or {})
        if not entries:
            raise ProgramError(f"variable {name!r} has no token logprobs: generate it with return_logprob=True",
                               program=self._run.program)
        tok = getattr(self._run.backend, "tokenizer", None)
        decode = None if tok is None else (lambda ids: str(tok.decode(ids, skip_special_tokens=True)))
        return leaf_confidence(text, token_spans(text, entries, decode), source=source)

    def tool_calls(self, name: str) -> list[Any]:
        """The typed calls of a ``gen(name, tools=...)`` turn (empty when it answered):
        each with ``id``, ``name``, validated ``arguments`` and the ``raw`` text."""
        turn = self.value(name)
        calls = getattr(turn, "calls", None)
        if calls is None:
            raise ProgramError(f"variable {name!r} is not a tool-calling gen(..., tools=...)",
                               program=self._run.program)
        return list(calls)

    def get_meta_info(self, name: str) -> dict[str, Any] | None:
        self.sync()
        return self._interp.meta.get(name)

    def text(self) -> str:
        self.sync()
        return self._interp.text

    def messages(self) -> list[dict[str, str]]:
        self.sync()
        return [dict(m) for m in self._interp.messages]

    # -- roles and scopes -------------------------------------------------------------------------
    def _role(self, role: str, expr: Any) -> AbstractContextManager[None] | None:
        if expr is not None:
            self._interp.submit(as_node([RoleBegin(role), as_node(expr), RoleEnd(role)]))
            return None

        @contextmanager
        def scope() -> Iterator[None]:
            self._interp.submit(RoleBegin(role))
            yield
            self._interp.submit(RoleEnd(role))

        return scope()

    def system(self, expr: Any = None) -> Any:
        return self._role("system", expr)

    def user(self, expr: Any = None) -> Any:
        return self._role("user", expr)

    def assistant(self, expr: Any = None) -> Any:
        return self._role("assistant", expr)

    @contextmanager
    def var_scope(self, name: str) -> Iterator[None]:
        """Capture the text appended inside the block into variable ``name``."""
        self._interp.submit(VarScopeBegin(name))
        yield
        self._interp.submit(VarScopeEnd(name))

    # -- forks -----------------------------------------------------------------------------------
    def fork(self, size: int = 1, position_ids_offset: Any = None) -> ForkGroup:
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ProgramError(f"fork size must be a positive int, not {size!r}", program=self._run.program)
        self.sync()
        self.raise_if_failed()
        backend = self._run.backend
        if size > 1 and backend.capabilities.prefix_cache and self._interp.text:
            # the parent's text is computed once; the children then share its KV (an
            # optimisation only: the children still run, and report, on their own)
            with contextlib.suppress(Exception):
                backend.warm(self._interp.text)
        group = self._run.fork_group_id()
        # children do not stream into the parent's stream
        children = [self._interp.fork(f"{group}/{i}") for i in range(size)]
        states = [ProgramState(self._run, c, peers=children) for c in children]
        return ForkGroup(self, states, base_vars=set(self._interp.variables), base_len=len(self._interp.text))

    # -- streaming --------------------------------------------------------------------------------
    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """Yield text as it is produced (a variable's only, if ``var_name`` is given).

        A ``gen`` with ``retries`` is held back until an attempt validates: the streamed
        text never includes a rejected attempt (it equals ``s.text()`` / ``s[var_name]``).
        """
        stream = self._run.stream
        if stream is None or self._interp is not self._run.root:
            self.sync()
            self.raise_if_failed()
            yield self._interp.variables.get(var_name, "") if var_name else self._interp.text
            return
        yield from stream.iter(var_name)
        self.sync()
        self.raise_if_failed()

    async def text_async_iter(self, var_name: str | None = None,
                              return_meta_data: bool = False) -> AsyncIterator[Any]:
        """Async twin of :meth:`text_iter`; with ``return_meta_data`` yields ``(chunk, meta)``."""
        loop = asyncio.get_running_loop()
        it = self.text_iter(var_name)
        done = object()
        while True:
            chunk = await loop.run_in_executor(None, next, it, done)
            if chunk is done:
                return
            if return_meta_data:
                yield chunk, dict(self._interp.meta.get(var_name, {})) if var_name else {}
            else:
                yield chunk

    def __repr__(self) -> str:
        return f"ProgramState(text={self._interp.text[-60:]!r}, vars={sorted(self._interp.variables)})"


class ForkGroup:
    """The children of ``s.fork(n)``: append to all, index one, join back."""

    def __init__(self, parent: ProgramState, states: list[ProgramState], *, base_vars: set[str],
                 base_len: int):
        self._parent = parent
        self._states = states
        self._base_vars = base_vars
        self._base_len = base_len

    def __len__(self) -> int:
        return len(self._states)

    def __getitem__(self, i: int) -> ProgramState:
        return self._states[i]

    def __setitem__(self, i: int, state: ProgramState) -> None:
        """``forks[i] += ...`` (SGLang's idiom) assigns the same state back: allowed."""
        if state is not self._states[i]:
            raise ProgramError("a fork's state cannot be replaced; append to it with forks[i] += ...",
                               program=self._parent._run.program)

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self._states)

    def __iadd__(self, other: Any) -> ForkGroup:
        if isinstance(other, (list, tuple)):
            if len(other) != len(self._states):
                raise ProgramError(f"{len(other)} items appended to {len(self._states)} forks")
            for s, o in zip(self._states, other, strict=True):
                s += o
        elif callable(other) and not isinstance(other, Expr):
            make: Callable[[int], Any] = other
            for i, s in enumerate(self._states):
                s += make(i)
        else:
            for s in self._states:
                s += other
        return self

    def sync(self) -> ForkGroup:
        self._parent._run.sync([s._interp for s in self._states])
        return self

    def join(self, mode: str = "gather_variable") -> None:
        """Bring the children back into the parent.

        ``gather_variable`` (default): each variable the children defined becomes, in the
        parent, the list of the children's values. ``concate_and_append``: the text each
        child added is appended to the parent, in order (parallel encoding). A failed
        child fails the parent with its error.
        """
        self.sync()
        self._parent._interp.join([s._interp for s in self._states], mode,
                                  base_vars=self._base_vars, base_len=self._base_len)
