"""structgen.extract on the real embedded model (SmolLM2-135M, CPU): typed results in
input order, usage, retries with the validator's feedback and prefix resumption,
per-field confidence, heterogeneous schemas sharing the compile cache, the journal."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field

import structgen
from structgen.constraints.validation import validate_output
from structgen.extract import InputRecord, resolve_schema
from structgen.extract.jsonspans import leaf_spans
from structgen.grounding import normalize
from tests.extract.conftest import Recording

pytestmark = pytest.mark.model


class Person(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=120)


DOCS = ["Ada is 36 years old.", "Bruno, aged 52, lives in Porto.", "Chloe turned 29 this spring."]


def test_typed_results_in_order_with_usage(recording: Recording) -> None:
    results = list(structgen.extract(DOCS, Person, backend=recording, max_tokens=32, retries=0, concurrency=3))
    assert [r.id for r in results] == ["0", "1", "2"]
    for r in results:
        assert r.error is None, r.error
        assert isinstance(r.data, Person)
        u = r.usage
        assert u.prompt_tokens > 0 and u.generated_tokens > 0 and u.attempts == 1 and u.ms > 0
    # the shared system turn was warmed first: every record reused it from the prefix cache
    assert all(r.usage.cached_tokens > 0 for r in results)
    assert len(recording.requests) == 3
    assert all(req.constraint == resolve_schema(Person).spec for req in recording.requests)


def test_retry_feeds_back_the_validator_message_and_resumes_from_the_valid_prefix(recording: Recording) -> None:
    # 6 tokens cannot hold the object: the first attempt is cut short (a validator error)
    (r,) = structgen.extract(["Ada is 36 years old."], Person, backend=recording, max_tokens=6, retries=1)
    assert r.usage.attempts == 2
    first = recording.requests[0]
    assert "rejected by the validator" not in first.prompt
    retry_req, prefix = recording.continued[0]
    assert "rejected by the validator" in retry_req.prompt
    assert "cut short by max_tokens" in retry_req.prompt or "Unterminated" in retry_req.prompt
    # the retry kept the first attempt's valid part and generated only what follows it
    assert prefix.startswith("{") and len(prefix) > 1
    final = r.data.model_dump_json() if r.ok else r.error.raw  # type: ignore[union-attr]
    assert final is not None and final.startswith(prefix)
    assert r.usage.generated_tokens <= 12  # two attempts of at most 6 tokens: nothing regenerated twice


def test_confidence_per_leaf(recording: Recording) -> None:
    results = list(structgen.extract(DOCS[:2], Person, backend=recording, max_tokens=32, retries=0,
                                     confidence=True))
    for doc, r in zip(DOCS[:2], results, strict=True):
        assert r.ok and r.confidence is not None
        text = r.data.model_dump_json()
        assert set(r.confidence) == {s.path for s in leaf_spans(text)} == {"$.name", "$.age"}
        for c in r.confidence.values():
            assert c["min"] <= c["mean"] <= 0.0
        # grounded: whether each written value occurs in the record's own text
        name = normalize(r.data.name).strip(" .,")
        assert r.confidence["$.name"].get("grounded") is ((name in normalize(doc)) if name else None)
        assert r.confidence["$.age"]["grounded"] is (str(r.data.age) in re.findall(r"\d+", doc))


class Team(BaseModel):
    model_config = ConfigDict(extra="forbid")
    team: str = Field(max_length=16)
    members: list[str] = Field(min_length=3, max_length=5)


def test_confidence_marks_repeated_list_items(embedded_backend: Any) -> None:
    docs = ["The team Otters: Ana, Ben and Cy.", "Team Blue has Dee, Dee again, and Eve."]
    results = list(structgen.extract(docs, Team, backend=embedded_backend, max_tokens=64, retries=0,
                                     confidence=True))
    for r in results:
        assert r.ok and r.confidence is not None
        assert "repeated" not in r.confidence["$.team"]  # not a list item
        seen: set[str] = set()
        for i, member in enumerate(r.data.members):
            key = normalize(member).strip()
            assert r.confidence[f"$.members[{i}]"]["repeated"] is (key in seen), (i, r.data.members)
            seen.add(key)


def test_heterogeneous_schemas_share_the_compile_cache(embedded_backend: Any) -> None:
    from structgen.constraints.compiler import compiler_for

    class City(BaseModel):
        model_config = ConfigDict(extra="forbid")
        city: str = Field(max_length=20)

    records = [InputRecord("p1", "Ada is 36.", schema=Person), InputRecord("c1", "I live in Lyon.", schema=City),
               InputRecord("p2", "Bo is 41.", schema=Person), InputRecord("c2", "Home is Graz.", schema=City)]
    cache = compiler_for(embedded_backend.tokenizer, n_vocab=embedded_backend.vocab_size).cache
    before = cache.stats()
    # fit_budget off: one constraint per schema (with it, one per schema and bound: below)
    results = list(structgen.extract(records, backend=embedded_backend, max_tokens=24, retries=0, fit_budget=False))
    after = cache.stats()
    assert [type(r.data).__name__ for r in results] == ["Person", "City", "Person", "City"]
    assert after.misses - before.misses <= 2  # at most one compile per schema, then hits
    assert after.hits - before.hits >= 2


def test_bad_records_carry_typed_errors(embedded_backend: Any) -> None:
    records = [InputRecord("bad-schema", "x", schema="no_such_schema"),
               InputRecord("unreadable", error="line 3: not JSON"),
               InputRecord("good", "Ada is 36.")]
    results = list(structgen.extract(records, Person, backend=embedded_backend, max_tokens=24, retries=0))
    assert [r.id for r in results] == ["bad-schema", "unreadable", "good"]
    assert results[0].error is not None and results[0].error.type == "InputError"
    assert "no_such_schema" in results[0].error.message
    assert results[1].error is not None and results[1].error.type == "InputError"
    assert results[2].ok


def test_journal_skips_finished_reruns_changed_and_retry_failed(tmp_path: Path, recording: Recording) -> None:
    journal = tmp_path / "p.sqlite"
    docs = [{"id": "a", "text": "Ada is 36."}, {"id": "b", "text": "Bo is 41."}]

    def run(items: list[dict[str, str]], **kw: Any) -> list[Any]:
        return list(structgen.extract(items, Person, backend=recording, max_tokens=24, retries=0,
                                      journal=journal, **kw))

    first = run(docs)
    n = len(recording.requests)
    assert n == 2
    again = run(docs)
    assert len(recording.requests) == n  # nothing recomputed
    assert [r.to_json() for r in again] == [r.to_json() for r in first]
    assert isinstance(again[0].data, Person)  # typed when read back from the journal
    changed = run([docs[0], {"id": "b", "text": "Bo is 42."}])
    assert len(recording.requests) == n + 1 and recording.requests[-1].prompt.count("Bo is 42.") == 1
    assert changed[0].to_json() == first[0].to_json()
    # a failed record (max_tokens too small) is stored as failed; rerunning skips it
    # unless retry_failed is set
    tiny = list(structgen.extract([{"id": "c", "text": "Cy is 7."}], Person, backend=recording, max_tokens=3,
                                  retries=0, journal=journal))
    assert tiny[0].error is not None
    k = len(recording.requests)
    list(structgen.extract([{"id": "c", "text": "Cy is 7."}], Person, backend=recording, max_tokens=3,
                           retries=0, journal=journal))
    assert len(recording.requests) == k
    list(structgen.extract([{"id": "c", "text": "Cy is 7."}], Person, backend=recording, max_tokens=3,
                           retries=0, journal=journal, retry_failed=True))
    assert len(recording.requests) == k + 1


def test_a_record_is_yielded_only_once_its_journal_group_is_committed(tmp_path: Path, embedded_backend: Any) -> None:
    from structgen.extract.extractor import ExtractConfig, Extractor
    from structgen.extract.inputs import as_records
    from structgen.extract.journal import Journal
    from structgen.extract.stream import run_records

    path = tmp_path / "p.sqlite"
    journal = Journal(path, max_pending=10_000, max_delay=3600)  # only the stream's commits
    ex = Extractor(embedded_backend, Person, config=ExtractConfig(max_tokens=24, retries=0))
    docs = [{"id": str(i), "text": f"P{i} is {20 + i}."} for i in range(6)]
    seen = 0
    for done in run_records(as_records(docs), ex, journal=journal, concurrency=6):
        db = sqlite3.connect(path)
        ids = {r[0] for r in db.execute("SELECT id FROM records")}
        db.close()
        assert done.result.id in ids  # on disk before it is handed on (and written out)
        seen += 1
    assert seen == 6 and 1 <= journal.commits <= 6
    journal.close()


def test_window_bounds_what_is_read_ahead(embedded_backend: Any) -> None:
    pulled = 0

    def source() -> Any:
        nonlocal pulled
        for i in range(12):
            pulled += 1
            yield {"id": str(i), "text": f"P{i} is {20 + i}."}

    seen = 0
    for _ in structgen.extract(source(), Person, backend=embedded_backend, max_tokens=24, retries=0,
                               concurrency=2):
        seen += 1
        assert pulled <= seen + 4  # window = 2 x concurrency: input is read lazily
    assert seen == 12


@pytest.mark.parametrize("name", structgen.extract.bundled_names())
def test_bundled_schema_compiles_and_matches_its_files(name: str, embedded_backend: Any) -> None:
    from structgen import schemas

    schema = resolve_schema(name)
    embedded_backend.compile(schema.spec)  # ConstraintError if it cannot be compiled
    assert json.loads(schemas.json_path(name).read_text()) == schema.dict
    assert resolve_schema(str(schemas.json_path(name))).spec.schema == schema.spec.schema
    assert resolve_schema(f"structgen.schemas.{name}:{schemas.BUNDLED[name]}").model is schemas.model(name)
    samples = [json.loads(line) for line in schemas.sample_path(name).read_text().splitlines()]
    assert len(samples) >= 3 and all(s["text"] and s["id"] for s in samples)


def test_every_bundled_schema_extracts_a_valid_record(embedded_backend: Any) -> None:
    """One job over every schema's first sample (a schema per record). Each schema bounds
    its strings and lists, so with enough max_tokens the constrained output always
    completes; the validator then accepts it."""
    from structgen import schemas

    records = []
    for name in schemas.names():
        first = json.loads(schemas.sample_path(name).read_text().splitlines()[0])
        records.append(InputRecord(name, first["text"], schema=name))
    results = list(structgen.extract(records, backend=embedded_backend, max_tokens=1500, retries=0))
    for name, r in zip(schemas.names(), results, strict=True):
        assert r.id == name
        assert r.error is None, (name, r.error)
        assert isinstance(r.data, schemas.model(name))
        validate_output(resolve_schema(name).spec, r.data.model_dump_json())


def test_state_confidence_in_the_dsl(embedded_backend: Any) -> None:
    @structgen.program
    def person(s: Any, text: str) -> None:
        s += structgen.user("Extract the person as JSON: " + text)
        s += structgen.assistant(structgen.gen("p", json_schema=Person, max_tokens=32, return_logprob=True))

    state = person.run(text="Ada is 36 years old.", backend=embedded_backend)
    conf = state.confidence("p")
    assert set(conf) == {"$.name", "$.age"}
    assert all(c["min"] <= c["mean"] <= 0.0 for c in conf.values())
    assert all("grounded" not in c for c in conf.values())  # no source given
    value = state.value("p")
    for source in ("Ada is 36 years old.", "nothing here"):
        grounded = state.confidence("p", source=source)
        assert grounded["$.age"]["grounded"] is (str(value.age) in re.findall(r"\d+", source))
        name = normalize(value.name).strip(" .,")
        assert grounded["$.name"].get("grounded") is ((name in normalize(source)) if name else None)
        assert {k: (c["mean"], c["min"]) for k, c in grounded.items()} == {
            k: (c["mean"], c["min"]) for k, c in conf.items()}

    @structgen.program
    def plain(s: Any) -> None:
        s += structgen.user("Say a name as JSON.")
        s += structgen.assistant(structgen.gen("p", json_schema=Person, max_tokens=32))

    with pytest.raises(structgen.ProgramError, match="return_logprob=True"):
        plain.run(backend=embedded_backend).confidence("p")


class Notes(BaseModel):
    model_config = ConfigDict(extra="forbid")
    title: str
    summary: str
    tags: list[str]


def test_fit_budget_bounds_every_free_length_to_fit_max_tokens(embedded_backend: Any) -> None:
    from structgen.constraints.schema.bounds import items_cap, json_chars
    from structgen.extract.fit import CAP_STEPS, MIN_CAP, BudgetFit, chars_per_token

    schema = resolve_schema(Notes)
    assert BudgetFit(64, None).spec_for(schema, "text") is schema.spec  # no tokenizer: the schema as it is
    texts = ["The quarterly report says revenue grew in every region, led by a new product line.",
             "会议纪要：本季度营收增长，新产品线表现突出。"]
    for max_tokens in (48, 96, 400):
        fit = BudgetFit(max_tokens, embedded_backend.encode)
        for text in texts:
            ratio = chars_per_token(text, embedded_backend.encode)
            spec = fit.spec_for(schema, text)
            assert fit.spec_for(schema, text) is spec  # cached per (schema, characters per token)
            cap = fit.cap(schema, ratio)
            assert cap in CAP_STEPS
            bounded = spec.schema_dict
            props = bounded["properties"]
            assert props["title"]["maxLength"] == props["summary"]["maxLength"] == cap
            assert props["tags"]["maxItems"] == items_cap(cap) and props["tags"]["items"]["maxLength"] == cap
            # the longest object the constraint allows fits the budget (unless even the floor does not)
            assert json_chars(bounded, bounded, 10**6) <= (max_tokens - 1) * ratio or cap == MIN_CAP
    results = list(structgen.extract(texts, Notes, backend=embedded_backend, max_tokens=48, retries=0))
    for text, r in zip(texts, results, strict=True):
        cap = BudgetFit(48, embedded_backend.encode).cap(schema, chars_per_token(text, embedded_backend.encode))
        if r.ok:  # validated against the original schema, within the bound
            assert isinstance(r.data, Notes)
            assert max(len(r.data.title), len(r.data.summary), *map(len, r.data.tags or [""])) <= cap
        else:
            assert r.error is not None and r.error.type == "OutputValidationError", r.error

