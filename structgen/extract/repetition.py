"""Repeated list values: an array item that repeats what an earlier item wrote for the same field.

A small model that starts a list often loops: it writes the items the text gives, then
copies them again until the list ends or hits its bound (``$.meds[2].dose`` = 50,
``$.meds[3].dose`` = 12.5, ``$.meds[4].dose`` = 50, ... to ``$.meds[41]``). Each copy is
fluent and, deep in the loop, near-certain, so token log-probability ranks the copies
*above* the values read from the text, and they occur in the text, so grounding passes
them too. :class:`Repeats` marks them: a string or number leaf inside an array whose
value, normalised as :func:`structgen.grounding.normalize` does (numbers by value),
was already written at the same path with the array indices wildcarded
(``$.meds[*].dose``) -- by an earlier item of the same list, or of an earlier list at the
same place. The first occurrence is not marked, only its copies.

Booleans and null are not judged (with two or three values, a repeat says nothing), nor
are leaves outside arrays. A list whose items truly share a value (two drugs at 50 mg) gets
its later ones marked too: ``repeated`` is a reason to review a value, not a verdict.
"""

from __future__ import annotations

import math
import re
from typing import Any

from structgen.grounding import normalize

__all__ = ["Repeats", "wildcard"]

_INDEX = re.compile(r"\[\d+\]")


def wildcard(path: str) -> str:
    """``path`` with its array indices made ``[*]``: ``$.a[2].b[0]`` -> ``$.a[*].b[*]``."""
    return _INDEX.sub("[*]", path)


class Repeats:
    """Feed the leaves of one JSON output in text order; each answer says whether that
    leaf repeats an earlier item's value (None where the question does not apply)."""

    def __init__(self) -> None:
        self._seen: set[tuple[str, Any]] = set()

    def repeated(self, path: str, value: Any) -> bool | None:
        pattern = wildcard(path)
        if pattern == path or value is None or isinstance(value, bool):
            return None  # not a list item (no index in the path), or a value not judged
        if isinstance(value, (int, float)):
            if not math.isfinite(value):
                return None
            key: Any = ("num", round(float(value), 9))
        elif isinstance(value, str):
            key = ("str", normalize(value).strip())
        else:
            return None
        item = (pattern, key)
        if item in self._seen:
            return True
        self._seen.add(item)
        return False
