"""Source grounding: does a leaf value the model wrote occur in the text it was read from?

Token log-probability alone ranks a small model's guesses badly: a field the text does not
fill gets fluent, high-probability text (a value repeated from another field, an echo of
the schema), while a value copied from an unfamiliar text is often a low-probability
string. Whether the value occurs in the source is a signal the log-probability does not
carry, and extraction is mostly copying, so per-field confidence reports both
(:func:`structgen.extract.confidence.leaf_confidence` with ``source=``): ``grounded`` is

* for a string: its normalised text (NFKC, case-folded, whitespace collapsed, surrounding
  punctuation stripped) is a substring of the normalised source;
* for a number: its value (sign aside) is one of the numbers written in the source
  (``12``, ``12.50``, ``.5``, ``1e-9``; digit groups such as ``1,200`` read as ``1200``;
  compared to 12 significant digits, so ``1e-09`` matches and small values stay apart), or
  a number word of the source (``zero`` to ``twenty``, the tens, ``dozen``, ``hundred``,
  ``thousand``, ``million``, ``billion``: "assuming initial velocity is zero" gives 0);
* absent for booleans, null and empty strings (the source cannot show them).

:func:`structgen.extract.confidence.rank` orders leaves for review with this signal, and
``tool_choice="auto"`` withdraws a call whose arguments the conversation did not give
(:mod:`structgen.tools.grounding`).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["DIGIT_GROUP", "NUMBER_WORDS", "Source", "leaves", "normalize"]

_SPACE = re.compile(r"\s+")
_PUNCT = " \t\n\"'`.,;:!?()[]{}<>«»“”‘’。，、；：！？（）【】"
#: a digit-group separator (``1,200``, ``1 200``): removed before numbers are read
DIGIT_GROUP = re.compile(r"(?<=\d)[,\u00a0\u202f' ](?=\d{3}(?!\d))")


def normalize(text: str) -> str:
    """NFKC, case-folded, whitespace runs made one space."""
    return _SPACE.sub(" ", unicodedata.normalize("NFKC", text).casefold())


#: a number as written: digits with an optional fraction and exponent (the text is case-folded)
_NUMBER = re.compile(r"(?:\d+(?:\.\d+)?|\.\d+)(?:e[+-]?\d+)?")
_WORD = re.compile(r"[^\W\d_]+")
#: the number words a source may spell a value with
_UNITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
          "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty")
_TENS = ("thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
NUMBER_WORDS = ({w: float(i) for i, w in enumerate(_UNITS)} | {w: 10.0 * i for i, w in enumerate(_TENS, start=3)}
                | {"dozen": 12.0, "hundred": 100.0, "thousand": 1e3, "million": 1e6, "billion": 1e9})


def _number_key(value: float) -> float:
    """How numbers are compared: by value to 12 significant digits, sign aside."""
    return float(f"{abs(value):.12g}")


def _numbers(text: str) -> set[float]:
    found = {_number_key(float(m)) for m in _NUMBER.findall(text)}
    return found | {_number_key(NUMBER_WORDS[w]) for w in _WORD.findall(text) if w in NUMBER_WORDS}


def leaves(value: Any) -> Iterator[Any]:
    """The scalar values inside a JSON value (objects' values and arrays' items, depth first)."""
    if isinstance(value, Mapping):
        for v in value.values():
            yield from leaves(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from leaves(v)
    else:
        yield value


class Source:
    """A source text, normalised once, asked about many values."""

    def __init__(self, text: str) -> None:
        self.text = normalize(text)
        self._numbers = _numbers(DIGIT_GROUP.sub("", self.text))

    def grounded(self, value: Any) -> bool | None:
        """Whether ``value`` occurs in the source; None where the question does not apply."""
        if value is None or isinstance(value, bool):
            return None
        if isinstance(value, (int, float)):
            return math.isfinite(value) and _number_key(float(value)) in self._numbers
        if isinstance(value, str):
            needle = normalize(value).strip(_PUNCT)
            return (needle in self.text) if needle else None
        return None

