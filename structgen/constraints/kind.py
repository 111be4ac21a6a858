"""The constraint-kind registry: each kind of constraint declared once, dispatched by spec class.

A *kind* (regex, JSON schema, choices, grammar, ...) is a frozen spec class plus one
:class:`ConstraintKind` entry that says everything the core needs to know about it: the
:class:`~structgen.contract.backend.Capabilities` flag a backend must declare, the words
used in error messages, and the final validator. :func:`kind_of` finds the entry for a spec.

Code that turns specs into something engine-specific (an engine's grammar, a server's
request fields) owns a :class:`Translations` table and registers one function per spec
class, next to the code that uses it::

    FIELDS: Translations[dict[str, Any]] = Translations("vllm request fields")

    @FIELDS.register(RegexSpec)
    def _regex(spec: RegexSpec, backend: VLLMBackend) -> dict[str, Any]:
        return {"structured_outputs": {"regex": spec.pattern}}

    FIELDS(spec, backend)   # CapabilityError naming the backend for an unregistered kind

No ``isinstance`` chains: a new kind is one module (spec class, builder, validator,
:func:`register_kind`) plus a registration in each table that can serve it
(backends/README.md, "Adding a constraint kind").
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, NoReturn, TypeVar

from structgen.errors import CapabilityError, ConstraintError, OutputValidationError, StructgenError

__all__ = [
    "ConstraintKind",
    "ConstraintSpec",
    "Translations",
    "all_kinds",
    "kind_of",
    "output_failed",
    "register_kind",
]


class ConstraintSpec:
    """Base of every constraint spec: frozen, engine-independent data (part of the IR).

    Subclasses are frozen dataclasses with a ``kind`` name and a :meth:`describe`; what a
    kind *means* is declared once in its :class:`ConstraintKind` (:func:`register_kind`).
    """

    __slots__ = ()
    kind: str

    def describe(self) -> str:
        """A short human description for error messages."""
        raise NotImplementedError


S = TypeVar("S", bound=ConstraintSpec)
R = TypeVar("R")

#: ``validate(spec, text, truncated)`` -> the typed value, or raise OutputValidationError
Validator = Callable[[Any, str, bool], Any]


@dataclass(frozen=True)
class ConstraintKind:
    """Everything the core knows about one kind of constraint.

    ``feature`` is the :class:`~structgen.contract.backend.Capabilities` attribute a
    backend sets to say it honours the kind (checked before anything is sent);
    ``description`` names the kind in capability errors ("regex constraints");
    ``validate(spec, text, truncated)`` is the final validation of generated text and
    returns the typed value.
    """

    name: str
    spec_type: type[ConstraintSpec]
    feature: str
    description: str
    validate: Validator


_KINDS: dict[type[Any], ConstraintKind] = {}
_lock = threading.Lock()


def register_kind(kind: ConstraintKind) -> ConstraintKind:
    """Declare a kind. Registering the same spec class twice is an error (not a silent swap)."""
    with _lock:
        known = _KINDS.get(kind.spec_type)
        if known is not None and known != kind:
            raise ValueError(f"constraint kind for {kind.spec_type.__name__} is already registered")
        if any(k.name == kind.name and k.spec_type is not kind.spec_type for k in _KINDS.values()):
            raise ValueError(f"constraint kind name {kind.name!r} is already taken")
        _KINDS[kind.spec_type] = kind
    return kind


def _lookup(table: dict[type[Any], R], cls: type[Any]) -> R | None:
    for base in cls.__mro__:
        found = table.get(base)
        if found is not None:
            return found
    return None


def kind_of(spec: Any) -> ConstraintKind:
    """The kind ``spec`` belongs to; :class:`ConstraintError` for anything that is not a spec."""
    found = _lookup(_KINDS, type(spec))
    if found is None:
        raise ConstraintError(f"unknown constraint spec {type(spec).__name__} (no registered constraint kind)")
    return found


def all_kinds() -> tuple[ConstraintKind, ...]:
    """Every registered kind (the built-in ones once :mod:`structgen.constraints.spec` is imported)."""
    with _lock:
        return tuple(_KINDS.values())


def _capability_miss(spec: ConstraintSpec, ctx: Any, what: str) -> StructgenError:
    name = getattr(ctx, "name", None)
    backend = name if isinstance(name, str) else what
    version = getattr(ctx, "version", None)
    return CapabilityError(kind_of(spec).description, backend=backend,
                           version=version if isinstance(version, str) else None)


class Translations(Generic[R]):
    """A dispatch table ``spec class -> translate(spec, ctx, ...)`` owned by one consumer.

    ``ctx`` is whatever the owner passes (a backend adapter passes itself, so a
    translation can read its version). Lookup follows the spec class's MRO. A spec with
    no entry goes to ``default`` when given, else raises the error ``missing`` builds --
    by default a :class:`~structgen.errors.CapabilityError` naming ``ctx.name`` (or
    ``what``) and the kind, so an untranslatable constraint fails before sending.
    """

    def __init__(self, what: str, *, default: Callable[..., R] | None = None,
                 missing: Callable[[ConstraintSpec, Any, str], StructgenError] | None = None):
        self.what = what
        self._table: dict[type[Any], Callable[..., R]] = {}
        self._default = default
        self._missing = missing or _capability_miss

    def register(self, *spec_types: type[S]) -> Callable[[Callable[..., R]], Callable[..., R]]:
        """Decorator: ``fn`` translates each of ``spec_types``."""
        if not spec_types:
            raise TypeError("register needs at least one spec class")

        def add(fn: Callable[..., R]) -> Callable[..., R]:
            for cls in spec_types:
                if cls in self._table:
                    raise ValueError(f"{self.what}: {cls.__name__} already has a translation")
                self._table[cls] = fn
            return fn

        return add

    def handler(self, spec: ConstraintSpec) -> Callable[..., R] | None:
        """The function registered for ``spec``'s class (or the default), or None."""
        return _lookup(self._table, type(spec)) or self._default

    def supports(self, spec: ConstraintSpec) -> bool:
        return _lookup(self._table, type(spec)) is not None

    def kinds(self) -> Iterator[type[Any]]:
        return iter(tuple(self._table))

    def __call__(self, spec: ConstraintSpec, ctx: Any = None, *args: Any, **kwargs: Any) -> R:
        fn = self.handler(spec)
        if fn is None:
            raise self._missing(spec, ctx, self.what)
        return fn(spec, ctx, *args, **kwargs)

    def __repr__(self) -> str:
        names = ", ".join(sorted(c.__name__ for c in self._table))
        return f"Translations({self.what!r}: {names})"


def output_failed(text: str, truncated: bool, message: str, errors: Sequence[str]) -> NoReturn:
    """Raise the :class:`OutputValidationError` a validator reports (noting a cut-off)."""
    if truncated:
        message = f"{message} (output was cut short by max_tokens)"
    raise OutputValidationError(message, raw=text, errors=errors, truncated=truncated)
