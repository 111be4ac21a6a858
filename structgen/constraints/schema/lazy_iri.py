"""Build rfc3987-syntax's IRI parsers when an IRI is first checked, not at import.

jsonschema's ``format-nongpl`` extra checks ``"format": "iri"`` and ``"iri-reference"``
with the package ``rfc3987_syntax``, which jsonschema imports when it is itself imported;
that package builds three Earley parsers of RFC 3987's grammar at import: 0.9 s of CPU,
three quarters of ``import structgen``, paid by every process that imports it (each CLI
run, each Ray worker) whether or not any schema names an IRI format. :func:`install` puts
a stand-in package in ``sys.modules`` before jsonschema is imported: its
``is_valid_syntax`` (the one function jsonschema takes) and every other attribute load the
real package's parsers on first use, so IRI checking works as before.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import types
from typing import Any

__all__ = ["install"]

_NAME = "rfc3987_syntax"


@functools.cache
def _real() -> types.ModuleType:
    """The real parsers (``rfc3987_syntax.syntax_helpers``, found through the stand-in's
    ``__path__``), loaded once and copied into the stand-in so later lookups go straight
    to them (jsonschema keeps :func:`_is_valid_syntax`, which calls this per check)."""
    helpers = importlib.import_module(f"{_NAME}.syntax_helpers")
    shim = sys.modules.get(_NAME)
    if shim is not None:
        for name, value in vars(helpers).items():
            if not name.startswith("__"):
                setattr(shim, name, value)
    return helpers


def _is_valid_syntax(term: str, value: str) -> Any:
    return _real().is_valid_syntax(term, value)


def _getattr(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    if name == "syntax_helpers":
        return _real()
    try:
        return getattr(_real(), name)
    except AttributeError:
        raise AttributeError(f"module {_NAME!r} has no attribute {name!r}") from None


def install() -> bool:
    """Put the stand-in in place unless jsonschema or the package is already imported or
    the package is not installed; True if it is in place."""
    current = sys.modules.get(_NAME)
    if current is not None:
        return getattr(current, "__getattr__", None) is _getattr
    if "jsonschema" in sys.modules:
        return False
    spec = importlib.util.find_spec(_NAME)
    if spec is None or not spec.submodule_search_locations:
        return False
    shim = types.ModuleType(_NAME, __doc__)
    shim.__path__ = list(spec.submodule_search_locations)
    shim.__file__ = spec.origin
    shim.__getattr__ = _getattr  # type: ignore[method-assign]
    shim.is_valid_syntax = _is_valid_syntax  # type: ignore[attr-defined]
    sys.modules[_NAME] = shim
    return True
