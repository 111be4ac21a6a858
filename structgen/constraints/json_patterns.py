"""JSON-schema ``pattern`` checks in linear time: RE2, never Python's backtracking ``re``.

jsonschema evaluates ``pattern``, ``patternProperties`` and the pattern part of
``additionalProperties`` / ``unevaluatedProperties`` with ``re.search``, which can take
exponential time on model output (``(a+)+b`` against a run of ``a`` s) while holding the
GIL. :func:`linear_validator_class` returns a draft's validator class whose keyword
functions search with :func:`search` instead: RE2 (the ``google-re2`` wheel; linear time,
ECMA-262's ASCII ``\\d \\w \\s`` as JSON Schema specifies).

Patterns RE2 cannot compile (look-around, back-references: no linear-time engine checks
them) are searched by the ``regex`` module with a time bound and the GIL released; past
the bound :class:`PatternTimeout` is raised and validation fails the output -- it never
passes an output it could not check.

The keyword functions are jsonschema's own, re-bound to this module's ``search``
(their code is not copied), so they follow the installed jsonschema's semantics.
"""

from __future__ import annotations

import functools
import threading
import types
from typing import Any

__all__ = ["PATTERN_TIMEOUT_S", "PatternTimeout", "linear_validator_class", "search"]

#: time bound of one search with the fallback engine (patterns RE2 cannot compile)
PATTERN_TIMEOUT_S = 0.25


class PatternTimeout(Exception):  # an internal signal, mapped to OutputValidationError
    """A pattern RE2 cannot run did not finish within :data:`PATTERN_TIMEOUT_S`."""

    def __init__(self, pattern: str):
        self.pattern = pattern
        super().__init__(f"pattern {pattern!r} could not be checked within {PATTERN_TIMEOUT_S} s "
                         "(RE2 cannot run it: look-around or back-reference)")


_lock = threading.Lock()


@functools.lru_cache(maxsize=512)
def _compiled(pattern: str) -> tuple[str, Any]:
    """``("re2", compiled)`` or ``("bounded", compiled)`` for ``pattern``."""
    import re2

    options = re2.Options()
    options.log_errors = False
    try:
        return "re2", re2.compile(pattern, options)
    except re2.error:
        pass
    import regex

    try:
        return "bounded", regex.compile(pattern)
    except (regex.error, RecursionError, OverflowError) as exc:
        raise ValueError(f"pattern {pattern!r} does not compile: {exc}") from exc


def search(pattern: str, text: str) -> bool:
    """Whether ``pattern`` matches somewhere in ``text`` (JSON Schema's unanchored rule)."""
    engine, compiled = _compiled(pattern)
    if engine == "re2":
        try:
            return compiled.search(text) is not None
        except UnicodeEncodeError:  # lone surrogates: not UTF-8, RE2 cannot see them
            engine, compiled = "bounded", __import__("regex").compile(pattern)
    try:
        return compiled.search(text, timeout=PATTERN_TIMEOUT_S, concurrent=True) is not None
    except TimeoutError:
        raise PatternTimeout(pattern) from None


class _LinearRe:
    """Stands in for the ``re`` module inside jsonschema's keyword functions."""

    @staticmethod
    def search(pattern: str, text: str) -> bool:
        return search(pattern, text)


def _rebind(namespace: dict[str, Any], module_name: str) -> dict[str, Any]:
    """Copies of the module's functions whose globals are ``namespace``."""
    for name, obj in list(namespace.items()):
        if isinstance(obj, types.FunctionType) and obj.__module__ == module_name:
            clone = types.FunctionType(obj.__code__, namespace, obj.__name__, obj.__defaults__, obj.__closure__)
            clone.__kwdefaults__ = obj.__kwdefaults__
            clone.__qualname__ = obj.__qualname__
            namespace[name] = clone
    return namespace


@functools.cache
def _linear_keywords() -> dict[Any, Any]:
    """original keyword function -> its clone searching with RE2."""
    from jsonschema import _keywords, _legacy_keywords, _utils

    utils = _rebind({**vars(_utils), "re": _LinearRe}, _utils.__name__)
    utils_ns = types.SimpleNamespace(**utils)
    out: dict[Any, Any] = {}
    for module in (_keywords, _legacy_keywords):
        namespace = {**vars(module), "re": _LinearRe, "_utils": utils_ns}
        for name in ("find_additional_properties", "find_evaluated_item_indexes_by_schema",
                     "find_evaluated_property_keys_by_schema"):
            if name in namespace:
                namespace[name] = utils[name]
        originals = dict(vars(module))
        clones = _rebind(namespace, module.__name__)
        for name, obj in originals.items():
            if isinstance(obj, types.FunctionType) and clones.get(name) is not obj:
                out[obj] = clones[name]
    return out


@functools.cache
def linear_validator_class(cls: Any) -> Any:
    """``cls`` (a jsonschema validator class) with every pattern search done by :func:`search`."""
    import jsonschema.validators

    clones = _linear_keywords()
    replaced = {kw: clones[fn] for kw, fn in cls.VALIDATORS.items() if fn in clones}
    with _lock:
        return jsonschema.validators.extend(cls, replaced)  # type: ignore[no-untyped-call]
