"""The constraint-kind registry: each kind declared once, every consumer dispatching by table.

A toy kind registered here goes through the same paths as the built-in ones: final
validation, the capability check before sending, a backend's translation table, and the
error a table without an entry raises.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from structgen.constraints.kind import (
    ConstraintKind,
    ConstraintSpec,
    Translations,
    all_kinds,
    kind_of,
    output_failed,
    register_kind,
)
from structgen.constraints.spec import ChoiceSpec, GrammarSpec, JsonSchemaSpec, RegexSpec
from structgen.constraints.validation import validate_output
from structgen.contract.backend import Capabilities, GenerateRequest
from structgen.errors import CapabilityError, ConstraintError, OutputValidationError

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class UpperSpec(ConstraintSpec):
    """A toy kind: the output must be upper-case letters."""

    kind: Literal["upper"] = "upper"

    def describe(self) -> str:
        return "upper"


def _validate_upper(spec: UpperSpec, text: str, truncated: bool) -> str:
    if not (text.isalpha() and text.isupper()):
        output_failed(text, truncated, "output is not upper case", [f"{text!r} has lower-case letters"])
    return text


UPPER = register_kind(ConstraintKind(name="upper", spec_type=UpperSpec, feature="upper",
                                     description="upper-case constraints", validate=_validate_upper))


def test_builtin_kinds_are_declared_once_with_a_capability_flag():
    flags = {f.name for f in dataclasses.fields(Capabilities)}
    builtin = {k.spec_type: k for k in all_kinds() if k.spec_type in (RegexSpec, JsonSchemaSpec, ChoiceSpec,
                                                                       GrammarSpec)}
    assert set(builtin) == {RegexSpec, JsonSchemaSpec, ChoiceSpec, GrammarSpec}
    for kind in builtin.values():
        assert kind.feature in flags, kind
        assert kind.description.endswith("constraints")
    assert kind_of(RegexSpec("a")).feature == "regex"
    assert kind_of(ChoiceSpec(("a",))).feature == "choices"


def test_a_new_kind_validates_through_validate_output():
    assert validate_output(UpperSpec(), "ABC") == "ABC"
    with pytest.raises(OutputValidationError, match="not upper case") as info:
        validate_output(UpperSpec(), "AbC", truncated=True)
    assert info.value.truncated and info.value.raw == "AbC"


def test_registering_a_kind_twice_is_an_error():
    with pytest.raises(ValueError, match="already registered"):
        register_kind(dataclasses.replace(UPPER, description="other"))
    assert register_kind(UPPER) is UPPER  # the same declaration again is harmless

    @dataclass(frozen=True)
    class Other(ConstraintSpec):
        def describe(self) -> str:
            return "other"

    with pytest.raises(ValueError, match="already taken"):
        register_kind(dataclasses.replace(UPPER, spec_type=Other))


def test_an_unregistered_spec_is_a_constraint_error():
    with pytest.raises(ConstraintError, match="no registered constraint kind"):
        kind_of(object())
    with pytest.raises(ConstraintError):
        validate_output("not a spec", "x")


def test_capability_check_reads_the_kinds_feature(monkeypatch):
    from structgen.backends.fake import FakeBackend

    backend = FakeBackend(["ABC"])
    with pytest.raises(CapabilityError, match="upper-case constraints") as info:
        backend.check_generate(GenerateRequest(prompt="p", constraint=UpperSpec()))
    assert info.value.backend == "fake"
    no_regex = FakeBackend(capabilities=Capabilities(json_schema=True))
    with pytest.raises(CapabilityError, match="regex constraints"):
        no_regex.check_generate(GenerateRequest(prompt="p", constraint=RegexSpec("a")))
    no_regex.check_generate(GenerateRequest(prompt="p", constraint=JsonSchemaSpec("{}")))


def test_translation_tables_dispatch_by_class_and_refuse_what_they_lack():
    table: Translations[str] = Translations("toy")

    @table.register(RegexSpec, ChoiceSpec)
    def _text(spec: Any, ctx: Any) -> str:
        return f"{ctx.name}:{spec.describe()}"

    class Ctx:
        name = "toy-server"
        version = "1.2"

    assert table(RegexSpec("a+"), Ctx()) == "toy-server:regex 'a+'"
    assert table.supports(ChoiceSpec(("x",))) and not table.supports(UpperSpec())
    with pytest.raises(CapabilityError) as info:
        table(UpperSpec(), Ctx())
    assert info.value.backend == "toy-server" and info.value.version == "1.2"
    assert "upper-case constraints" in str(info.value)
    with pytest.raises(ValueError, match="already has a translation"):
        table.register(RegexSpec)(_text)

    @dataclass(frozen=True)
    class Pattern(RegexSpec):  # a subclass inherits its base's translation (MRO lookup)
        pass

    assert table(Pattern("b"), Ctx()) == "toy-server:regex 'b'"


def test_a_new_kind_registers_into_a_backend_table():
    from structgen.backends.sglang.adapter import FIELDS
    from tests.backends.test_sglang import backend as recorded_sglang

    @dataclass(frozen=True)
    class Shout(UpperSpec):  # a fresh class per run: the registration below is its own
        pass

    b, _ = recorded_sglang()  # a recorded server: translation and sending, no engine
    request = GenerateRequest(prompt="p", constraint=Shout())
    with pytest.raises(CapabilityError, match="upper-case constraints"):
        b.constraint_fields(Shout())

    @FIELDS.register(Shout)
    def _shout(spec: Shout, backend: Any) -> dict[str, Any]:
        return {"regex": "[A-Z]+"}

    assert b.constraint_fields(Shout()) == {"regex": "[A-Z]+"}
    assert b.build_payload(request)["sampling_params"]["regex"] == "[A-Z]+"
    assert b.constraint_fields(RegexSpec("[A-Z]+")) == {"regex": "[A-Z]+"}
    with pytest.raises(CapabilityError, match="--grammar-backend llguidance"):
        b.constraint_fields(GrammarSpec('start: "a"'))


def test_no_isinstance_chains_on_constraint_specs_remain():
    """Kinds are dispatched through the registry and tables, not ``isinstance`` checks."""
    chain = re.compile(r"isinstance\([^)]*\b(RegexSpec|JsonSchemaSpec|ChoiceSpec|GrammarSpec)\b")
    found = []
    for folder in ("structgen", "backends"):
        for path in (ROOT / folder).rglob("*.py"):
            if "structgen/backends" in path.as_posix():
                continue  # the link to backends/
            for no, line in enumerate(path.read_text().splitlines(), 1):
                if chain.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{no}: {line.strip()}")
    assert found == []
