"""Run and sampling options: their names, SGLang's aliases, and their validation.

Sampling options reach a program from four places: ``gen(...)``, ``f.run(...)`` /
``f.arun(...)``, each ``run_batch`` item (and the batch's shared keywords), and
``@program(...)`` defaults. Each value is checked here, where it is passed (type and
range), so a bad one raises :class:`~structgen.errors.OptionError` naming the option as
the caller spelled it (``max_tokens=24.5`` -> "max_tokens must be a positive int") before
anything is sent: in ``run_batch`` only that item fails.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import fields
from typing import Any

from structgen.contract.backend import SamplingParams
from structgen.errors import OptionError

__all__ = ["SAMPLING_NAMES", "check_option", "split_options"]

#: every SamplingParams field
SAMPLING_NAMES = frozenset(f.name for f in fields(SamplingParams))
#: SGLang's run-level spellings of SamplingParams fields
ALIASES = {"max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens"}
#: SGLang options with no meaning here (its executor threads, API speculative decoding)
IGNORED = frozenset({"use_thread", "num_api_spec_tokens"})


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _strings(v: Any) -> tuple[str, ...] | None:
    if v == "":
        return ()  # no stop string
    items = (v,) if isinstance(v, str) else tuple(v) if isinstance(v, (list, tuple)) else None
    if items is None or not all(isinstance(s, str) and s for s in items):
        return None
    return items


def _regexes(v: Any) -> tuple[str, ...] | None:
    items = _strings(v)
    if items is None:
        return None
    for pattern in items:
        try:
            re.compile(pattern)
        except (re.error, OverflowError, RecursionError):
            return None
    return items


def _token_ids(v: Any) -> tuple[int, ...] | None:
    items = tuple(v) if isinstance(v, (list, tuple)) else None
    if items is None or not all(_is_int(t) and t >= 0 for t in items):
        return None
    return items


def _check(test: Callable[[Any], bool]) -> Callable[[Any], Any]:
    """A normaliser from a predicate: the value itself, or None when the test fails."""
    return lambda v: v if test(v) else None


_BOOL = (_check(lambda v: isinstance(v, bool)), "True or False")

#: field -> (normaliser returning the value to store or None when invalid, what is expected)
_RULES: dict[str, tuple[Callable[[Any], Any], str]] = {
    "max_new_tokens": (_check(lambda v: _is_int(v) and v >= 1), "a positive int"),
    "min_new_tokens": (_check(lambda v: _is_int(v) and v >= 0), "an int >= 0"),
    "n": (_check(lambda v: _is_int(v) and v >= 1), "a positive int"),
    "stop": (_strings, "a non-empty string or a list of them"),
    "stop_token_ids": (_token_ids, "a list of token ids (ints >= 0)"),
    "stop_regex": (_regexes, "a regex or a list of regexes that compile"),
    "temperature": (_check(lambda v: _is_real(v) and v >= 0), "a finite number >= 0"),
    "top_p": (_check(lambda v: _is_real(v) and 0 < v <= 1), "a number in (0, 1]"),
    "top_k": (_check(lambda v: _is_int(v) and v >= -1), "an int >= 1 (0 or -1: no limit)"),
    "min_p": (_check(lambda v: _is_real(v) and 0 <= v <= 1), "a number in [0, 1]"),
    "frequency_penalty": (_check(lambda v: _is_real(v) and -2 <= v <= 2), "a number in [-2, 2]"),
    "presence_penalty": (_check(lambda v: _is_real(v) and -2 <= v <= 2), "a number in [-2, 2]"),
    "ignore_eos": _BOOL,
    "return_logprob": _BOOL,
    "logprob_start_len": (_check(lambda v: _is_int(v) and v >= -1), "an int >= -1"),
    "top_logprobs_num": (_check(lambda v: _is_int(v) and v >= 0), "an int >= 0"),
    "return_text_in_logprobs": _BOOL,
    "seed": (_check(lambda v: _is_int(v) and 0 <= v < 2**63), "an int in [0, 2**63)"),
}
assert set(_RULES) == SAMPLING_NAMES, "every sampling field has a rule"


def check_option(field: str, value: Any, *, spelled: str | None = None,
                 program: str | None = None) -> Any:
    """``value`` as stored in :class:`SamplingParams` (``stop="x"`` -> ``("x",)``), or
    :class:`OptionError` naming ``spelled`` (the caller's name for ``field``)."""
    normalise, expected = _RULES[field]
    out = normalise(value)
    if out is None:
        raise OptionError(spelled or field, value, expected, program=program)
    return out


def split_options(kwargs: dict[str, Any], arg_names: Iterable[str] = (), *,
                  program: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Separate validated sampling options (by field name) from program arguments.

    A program's own parameter names win: ``def f(s, n)`` takes ``n`` as its argument.
    ``None`` means "not set". Raises :class:`OptionError` for a bad value.
    """
    sampling: dict[str, Any] = {}
    args: dict[str, Any] = {}
    own = set(arg_names)
    for name, value in kwargs.items():
        if name in own:
            args[name] = value
            continue
        if name in IGNORED:
            continue
        field = ALIASES.get(name, name)
        if field in SAMPLING_NAMES:
            if value is not None:
                sampling[field] = check_option(field, value, spelled=name, program=program)
        else:
            args[name] = value
    return sampling, args
