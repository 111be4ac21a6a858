"""The schema as XGrammar reads it: rewritten so XGrammar's grammar only widens.

XGrammar narrows two keywords (xgrammar 0.2.9, seen on MaskBench): it full-matches
``pattern`` and ``patternProperties`` keys (JSON Schema searches: ``^https?://`` admits
"https://x"), and with ``patternProperties`` it rejects every other key even when
``additionalProperties`` allows it. :func:`xgrammar_schema` rewrites its copy of the
schema: patterns become full-match equivalents (:func:`full_match_pattern`),
``patternProperties`` fold into ``additionalProperties`` (as the ``relaxed`` rung does).
Still narrower than the schema: strings under a ``pattern`` cannot contain JSON escapes
(XGrammar's regex sees them raw).
"""

from __future__ import annotations

from typing import Any

from structgen.constraints.schema.loosen import fold_pattern_properties, walk

__all__ = ["SKIP_KEYWORDS", "full_match_pattern", "skipped_keyword", "xgrammar_schema"]


def _top_level_branches(pattern: str) -> list[str]:
    """``pattern`` split at its top-level ``|`` (outside groups and classes)."""
    out: list[str] = []
    depth, in_class, start, i = 0, False, 0, 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            i += 2
            continue
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "|" and depth == 0:
            out.append(pattern[start:i])
            start = i + 1
        i += 1
    out.append(pattern[start:])
    return out


def _ends_with_anchor(branch: str) -> bool:
    if not branch.endswith("$"):
        return False
    backslashes = len(branch) - 1 - len(branch[:-1].rstrip("\\"))
    return backslashes % 2 == 0


def full_match_pattern(pattern: str) -> str:
    """A regex whose *full* matches are the strings ``pattern`` *finds* a match in."""
    parts = []
    for branch in _top_level_branches(pattern):
        head, body = ("", branch[1:]) if branch.startswith("^") else (".*", branch)
        tail = ""
        if _ends_with_anchor(body):
            body = body[:-1]
        else:
            tail = ".*"
        parts.append(f"{head}(?:{body}){tail}")
    return "|".join(parts)


def _xgrammar_node(node: dict[str, Any]) -> dict[str, Any]:
    out = fold_pattern_properties(node)
    if isinstance(out.get("pattern"), str):
        out["pattern"] = full_match_pattern(out["pattern"])
    return out


#: keywords XGrammar enforces more loosely than llguidance's lenient rung does (MaskBench:
#: ``allOf`` branches' ``const`` / ``propertyNames`` let through; ``patternProperties``
#: must be folded away, see above): schemas using them skip the xgrammar rung
SKIP_KEYWORDS = ("allOf", "patternProperties")


def skipped_keyword(schema: Any, keys: tuple[str, ...] = SKIP_KEYWORDS) -> str | None:
    """The first of ``keys`` (default :data:`SKIP_KEYWORDS`) ``schema`` uses, if any."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                if k in keys:
                    return str(k)
                stack.append(v)
        elif isinstance(node, list):
            stack.extend(node)
    return None


def xgrammar_schema(schema: Any) -> Any:
    """``schema`` rewritten so XGrammar's grammar admits every value it admits (see above)."""
    return walk(schema, _xgrammar_node)
