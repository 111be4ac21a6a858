"""jsonschema's IRI checkers keep working while their parsers are built on first use
(structgen.constraints.schema.lazy_iri): importing structgen no longer builds them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("rfc3987_syntax")  # jsonschema's format-nongpl extra, which pyproject asks for


def _run(code: str) -> list[str]:
    """``code`` in a fresh interpreter (nothing imported yet); its stdout lines."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                         cwd=ROOT, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout.splitlines()


def test_importing_structgen_does_not_build_the_iri_parsers_and_iri_formats_are_still_checked() -> None:
    lines = _run("""
import sys
import structgen, structgen.extract
print("after import:", "rfc3987_syntax.syntax_helpers" in sys.modules, "jsonschema" in sys.modules)
from structgen.constraints.schema.check import schema_validator
iri = schema_validator({"type": "string", "format": "iri"})
ref = schema_validator({"type": "string", "format": "iri-reference"})
print("iri:", [e.message for e in iri.iter_errors("http://exa mple.org/")],
      [e.message for e in iri.iter_errors("http://\u4f8b\u3048.jp/\u30d1\u30b9?q=1#f")],
      [e.message for e in iri.iter_errors("no-scheme")])
print("ref:", [e.message for e in ref.iter_errors("a b")], [e.message for e in ref.iter_errors("../x?y")])
print("after check:", "rfc3987_syntax.syntax_helpers" in sys.modules)
""")
    assert lines[0] == "after import: False True", lines
    assert lines[1] == ("iri: [\"'http://exa mple.org/' is not a 'iri'\"] [] [\"'no-scheme' is not a 'iri'\"]"), lines
    assert lines[2] == "ref: [\"'a b' is not a 'iri-reference'\"] []", lines
    assert lines[3] == "after check: True", lines


def test_the_package_itself_still_works_through_the_stand_in() -> None:
    lines = _run("""
import structgen.constraints.schema.check
import rfc3987_syntax
print(rfc3987_syntax.is_valid_syntax_iri("http://a.example/"), rfc3987_syntax.is_valid_syntax("iri", "x y"))
print(rfc3987_syntax.syntax_helpers.RFC3987_SYNTAX_PARSER_TYPE, callable(rfc3987_syntax.parse))
try:
    rfc3987_syntax.no_such_name
except AttributeError as exc:
    print("AttributeError", exc)
""")
    assert lines == ["True False", "earley True",
                     "AttributeError module 'rfc3987_syntax' has no attribute 'no_such_name'"], lines


def test_nothing_is_replaced_when_jsonschema_came_first() -> None:
    lines = _run("""
import sys
import jsonschema
real = sys.modules["rfc3987_syntax"]
from structgen.constraints.schema.lazy_iri import install
print(install(), sys.modules["rfc3987_syntax"] is real)
""")
    assert lines == ["False True"], lines
