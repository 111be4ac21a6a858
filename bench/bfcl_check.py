"""BFCL data and an AST-style checker (our own), for ``bench/bfcl.py``.

Berkeley Function Calling Leaderboard files: ``BFCL_v4_<category>.json`` (JSON lines:
``id``, ``question`` as chat turns, ``function`` definitions in BFCL's type names) and
``possible_answer/BFCL_v4_<category>.json`` (``ground_truth``: per call, per parameter,
the accepted values; ``""`` among them means the parameter may be omitted).

Category rules come from the file name only, so any directory laid out the same way
works (``live_*`` categories included): ``*irrelevance*`` -> no call expected;
``*parallel*`` -> several calls, matched without regard to order; ``*multiple*`` -> the
model chooses among several functions. A call is correct when its function name is
right, every required parameter is present, no unknown parameter is given, and every
value is among the accepted ones (numbers by value; strings case-, space- and
punctuation-normalised as BFCL does; lists and dicts element by element).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Category", "Record", "check_calls", "load_categories", "to_json_schema", "tool_name"]

_TYPES = {"dict": "object", "float": "number", "tuple": "array", "integer": "integer", "int": "integer",
          "string": "string", "str": "string", "boolean": "boolean", "bool": "boolean", "array": "array",
          "list": "array", "object": "object", "number": "number"}


@dataclass
class Record:
    id: str
    messages: list[dict[str, str]]
    functions: list[dict[str, Any]]
    ground_truth: list[dict[str, dict[str, list[Any]]]] | None


@dataclass
class Category:
    name: str
    records: list[Record] = field(default_factory=list)

    @property
    def irrelevance(self) -> bool:
        return "irrelevance" in self.name

    @property
    def parallel(self) -> bool:
        return "parallel" in self.name

    @property
    def multiple(self) -> bool:
        return "multiple" in self.name


def load_categories(folder: Path, limit: int | None = None, offset: int = 0) -> list[Category]:
    """Each category's records, skipping the first ``offset`` (held-out runs), at most ``limit``."""
    out = []
    for path in sorted(folder.glob("BFCL_v*_*.json")):
        name = re.sub(r"^BFCL_v\d+_", "", path.stem)
        answers: dict[str, Any] = {}
        gold = folder / "possible_answer" / path.name
        if gold.is_file():
            for line in gold.read_text().splitlines():
                if line.strip():
                    item = json.loads(line)
                    answers[item["id"]] = item["ground_truth"]
        cat = Category(name)
        skipped = 0
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            turns = item["question"]
            messages = [m for turn in turns for m in turn] if turns and isinstance(turns[0], list) else turns
            if item["id"] not in answers and "irrelevance" not in name:
                continue  # a category without gold for this record: nothing to check against
            if skipped < offset:
                skipped += 1
                continue
            cat.records.append(Record(item["id"], messages, item["function"], answers.get(item["id"])))
            if limit is not None and len(cat.records) >= limit:
                break
        if cat.records:
            out.append(cat)
    return out


def to_json_schema(node: Any) -> Any:
    """BFCL's parameter description -> JSON schema (``dict`` -> object, ``float`` -> number,
    ``tuple`` -> array, ``any`` -> anything); objects closed to their listed properties."""
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    kind = node.get("type")
    if isinstance(kind, str) and kind != "any":
        out["type"] = _TYPES.get(kind, kind)
    for key in ("description", "enum", "default", "minimum", "maximum", "format", "pattern"):
        if key in node and not (key == "default" and node[key] is None):
            out[key] = node[key]
    if "properties" in node:
        out["properties"] = {k: to_json_schema(v) for k, v in node["properties"].items()}
        out["additionalProperties"] = False
    if "items" in node:
        out["items"] = to_json_schema(node["items"])
    if "required" in node:
        out["required"] = [r for r in node["required"] if r in node.get("properties", {})]
    if out.get("type") == "object" and "properties" not in out:
        out["additionalProperties"] = True
    return out


def tool_name(name: str) -> str:
    """A BFCL function name as a tool name (OpenAI-style: no dots)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)


# -- the checker ----------------------------------------------------------------------------
def _norm_str(s: str) -> str:
    return re.sub(r"[ ,./\-_*^]", "", s).lower().replace("'", '"')


def _value_ok(value: Any, accepted: Any) -> bool:
    if isinstance(accepted, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(accepted, bool) and value == accepted
    if isinstance(accepted, (int, float)):
        return isinstance(value, (int, float)) and float(value) == float(accepted)
    if isinstance(accepted, str):
        return isinstance(value, str) and _norm_str(value) == _norm_str(accepted)
    if isinstance(accepted, list):
        return (isinstance(value, list) and len(value) == len(accepted)
                and all(_value_ok(v, a) for v, a in zip(value, accepted, strict=True)))
    if isinstance(accepted, dict):
        if not isinstance(value, dict):
            return False
        for key, options in accepted.items():
            opts = options if isinstance(options, list) else [options]
            if key not in value:
                if "" not in opts:
                    return False
                continue
            if not any(_value_ok(value[key], o) for o in opts if o != ""):
                return False
        return all(k in accepted for k in value)
    return bool(value == accepted)


def _call_ok(call: tuple[str, dict[str, Any]], gold: dict[str, dict[str, list[Any]]],
             functions: dict[str, dict[str, Any]]) -> bool:
    (gname, params), = gold.items()
    name, args = call
    if tool_name(name) != tool_name(gname) or not isinstance(args, dict):
        return False
    spec = functions.get(tool_name(gname), {}).get("parameters", {})
    props = spec.get("properties", {})
    if any(k not in props for k in args):  # no unknown parameters
        return False
    if any(r not in args for r in spec.get("required", [])):  # every required parameter present
        return False
    for key, options in params.items():
        if key not in args:
            if "" not in options:
                return False
            continue
        if not any(_value_ok(args[key], o) for o in options if o != ""):
            return False
    return all(k in params for k in args)


def check_calls(calls: list[tuple[str, dict[str, Any]]], record: Record, category: Category) -> bool:
    """Whether ``calls`` (name, arguments) answer ``record`` by the category's rules."""
    if category.irrelevance:
        return not calls
    gold = record.ground_truth or []
    if len(calls) != len(gold):
        return False
    functions = {tool_name(f["name"]): f for f in record.functions}
    if not category.parallel:
        return _call_ok(calls[0], gold[0], functions)
    # parallel: a one-to-one matching of calls to gold calls, any order (backtracking)
    used = [False] * len(gold)

    def match(i: int) -> bool:
        if i == len(calls):
            return True
        for j, g in enumerate(gold):
            if not used[j] and _call_ok(calls[i], g, functions):
                used[j] = True
                if match(i + 1):
                    return True
                used[j] = False
        return False

    return match(0)
