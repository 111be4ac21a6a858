"""A record's constraint fitted to its token budget, so one runaway value cannot eat it.

A small model extracting into a large schema sometimes starts a string (or an array) and
never ends it: the output is then cut by ``max_tokens`` and the whole record fails,
though every other field was fine. :class:`BudgetFit` gives the record's constraint a
bound on every free length (:func:`structgen.constraints.schema.bounds.bounded_schema`:
strings, arrays, open objects; never below the schema's own minimums), the largest bound
``cap`` with which the longest object the schema allows fits the budget: ``max_tokens - 1``
tokens at the record text's own characters per token (measured with the backend's
tokenizer: values are mostly copied from the text). ``cap`` is rounded down to one of
:data:`CAP_STEPS` (few distinct grammars, so the compile cache serves them) and is at
least :data:`MIN_CAP`. The output is still validated against the original schema; the
bounded one accepts a subset of it.

A plan, not a proof: a value may tokenize worse than the text, numbers are counted at a
fixed width, and what the schema cannot bound is not bounded
(:mod:`structgen.constraints.schema.bounds`). A retry (with the validator's feedback)
still follows an output that was cut. Backends without a tokenizer (``encode``) get the
schema as it is.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable

from structgen.constraints.kinds.json_schema import JsonSchemaSpec, json_schema_spec
from structgen.constraints.schema.bounds import bounded_schema, fit_cap
from structgen.extract.schemas import Schema

__all__ = ["CAP_STEPS", "MIN_CAP", "BudgetFit", "chars_per_token"]

#: the bounds given (characters); a fitted cap is rounded down to one of them
CAP_STEPS = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 4096)
#: the smallest bound: a budget below the plan is served best effort
MIN_CAP = CAP_STEPS[0]


def chars_per_token(text: str, encode: Callable[[str], list[int]]) -> float:
    """``text``'s characters per token, rounded down to a quarter, at least 1."""
    n = len(encode(text)) if text else 0
    return max(1.0, int(4 * len(text) / n) / 4) if n else 1.0


class BudgetFit:
    """Bounded specs for records of ``max_tokens``, cached by (schema, characters per token)."""

    def __init__(self, max_tokens: int, encode: Callable[[str], list[int]] | None):
        self.max_tokens = max_tokens
        self.encode = encode
        self._specs: dict[tuple[str, float], JsonSchemaSpec] = {}
        self._lock = threading.Lock()

    def cap(self, schema: Schema, ratio: float) -> int:
        """The bound for ``schema`` at ``ratio`` characters per token."""
        fitted = fit_cap(schema.dict, (self.max_tokens - 1) * ratio, floor=MIN_CAP)
        return CAP_STEPS[max(bisect.bisect_right(CAP_STEPS, fitted) - 1, 0)]

    def spec_for(self, schema: Schema, text: str) -> JsonSchemaSpec:
        """The constraint for one record of ``schema`` whose input is ``text``."""
        if self.encode is None:
            return schema.spec
        ratio = chars_per_token(text, self.encode)
        key = (schema.digest, ratio)
        with self._lock:
            spec = self._specs.get(key)
        if spec is None:
            bounded = bounded_schema(schema.dict, self.cap(schema, ratio))
            spec = json_schema_spec(bounded, whitespace=schema.spec.whitespace, strict=False)  # closed already
            with self._lock:
                self._specs[key] = spec
        return spec
