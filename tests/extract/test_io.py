"""Extraction plumbing without a model: readers, writers, JSON spans, confidence
mapping, the journal, fill-rate statistics."""

from __future__ import annotations

import csv
import json
import sqlite3
from pathlib import Path

import pytest

from structgen.errors import InputError
from structgen.extract.confidence import leaf_confidence, token_spans
from structgen.extract.inputs import Fields, read_records
from structgen.extract.journal import Journal, content_key
from structgen.extract.jsonspans import leaf_spans, resume_point, scan
from structgen.extract.outputs import open_writer
from structgen.extract.records import ExtractResult, RecordError, Usage
from structgen.extract.summary import Stats


def write_jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


# -- readers ---------------------------------------------------------------------------------

def test_jsonl_reader_keeps_bad_lines_as_error_records(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "text": "x"}, "{not json", {"id": 7, "body": "y"},
                                              "", {"text": "no id"}, [1, 2]])
    recs = list(read_records(src))
    assert [r.id for r in recs] == ["a", "line-2", "7", "line-5", "line-6"]
    assert recs[0].text == "x" and recs[0].error is None
    assert recs[1].error is not None and "line 2" in recs[1].error and "not JSON" in recs[1].error
    assert recs[2].error is not None and "'text' is missing" in recs[2].error
    assert recs[3].text == "no id" and recs[3].error is None
    assert recs[4].error is not None and "not a JSON object" in recs[4].error


def test_reader_is_lazy(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": i, "text": "t"} for i in range(3)] + ["{broken"])
    it = read_records(src)
    assert next(it).id == "0"  # nothing past the first line has been parsed yet
    with open(src, "a") as fh:  # lines appended after the reader started are still read
        fh.write(json.dumps({"id": "late", "text": "t"}) + "\n")
    assert [r.id for r in it] == ["1", "2", "line-4", "late"]


def test_fields_and_schema_field(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [{"doc_id": "d1", "body": "hello", "kind": "invoice"},
                                              {"doc_id": "d2", "body": "hi"}])
    recs = list(read_records(src, Fields(text="body", id="doc_id", schema="kind")))
    assert [(r.id, r.text, r.schema) for r in recs] == [("d1", "hello", "invoice"), ("d2", "hi", None)]


def test_csv_reader(tmp_path: Path) -> None:
    src = tmp_path / "in.csv"
    with open(src, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["id", "text"])
        w.writerow(["r1", "multi\nline, with comma"])
        w.writerow(["r2", "plain"])
    recs = list(read_records(src))
    assert [(r.id, r.text) for r in recs] == [("r1", "multi\nline, with comma"), ("r2", "plain")]
    bad = tmp_path / "bad.csv"
    bad.write_text("id,body\n1,x\n")
    with pytest.raises(InputError, match="no column 'text'"):
        list(read_records(bad))


def test_glob_reader(tmp_path: Path) -> None:
    (tmp_path / "b.txt").write_text("second")
    (tmp_path / "a.txt").write_text("first")
    recs = list(read_records(str(tmp_path / "*.txt")))
    assert [Path(r.id).name for r in recs] == ["a.txt", "b.txt"]
    assert [r.text for r in recs] == ["first", "second"]
    with pytest.raises(InputError, match="matches no file"):
        read_records(str(tmp_path / "*.md"))


def test_missing_input_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such input file"):
        read_records(tmp_path / "nope.jsonl")


def test_openai_batch_input(tmp_path: Path) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    line = {"custom_id": "req-1", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "system", "content": "S"},
                                                {"role": "user", "content": [{"type": "text", "text": "U"}]}],
                     "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}}
    src = write_jsonl(tmp_path / "batch.jsonl", [line])
    (rec,) = list(read_records(src))
    assert rec.id == "req-1" and rec.messages == (("system", "S"), ("user", "U")) and rec.text == "U"
    assert rec.schema == schema


def test_parquet_roundtrip(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": ["p1", "p2"], "text": ["one", "two"]}), src)
    assert [(r.id, r.text) for r in read_records(src)] == [("p1", "one"), ("p2", "two")]
    out = tmp_path / "out.parquet"
    w = open_writer(out)
    ok = ExtractResult("p1", data={"a": 1}, usage=Usage(prompt_tokens=5))
    bad = ExtractResult("p2", error=RecordError("OutputValidationError", "nope", raw='{"a"', path="$.a"))
    for r in (ok, bad):
        w.write(r.to_json(), {})
    w.close()
    rows = pq.read_table(out).to_pylist()
    assert rows[0]["id"] == "p1" and json.loads(rows[0]["data"]) == {"a": 1} and rows[0]["prompt_tokens"] == 5
    assert rows[1]["error_type"] == "OutputValidationError" and rows[1]["error_path"] == "$.a"
    assert rows[1]["error_raw"] == '{"a"' and rows[1]["data"] is None


def test_openai_batch_output(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    w = open_writer(out, "openai-batch")
    w.write(ExtractResult("r1", data={"a": 1}, usage=Usage(prompt_tokens=3, generated_tokens=2)).to_json(),
            {"openai_body": {"model": "m"}})
    w.write(ExtractResult("r2", error=RecordError("BackendError", "down")).to_json(), {})
    w.close()
    one, two = (json.loads(x) for x in out.read_text().splitlines())
    assert one["custom_id"] == "r1" and one["error"] is None
    body = one["response"]["body"]
    assert json.loads(body["choices"][0]["message"]["content"]) == {"a": 1}
    assert body["usage"]["prompt_tokens"] == 3 and body["model"] == "m"
    assert two["response"] is None and two["error"] == {"code": "BackendError", "message": "down"}


def test_result_line_roundtrip() -> None:
    r = ExtractResult("x", error=RecordError("OutputValidationError", "m", raw="{", path="$", errors=("$: e",),
                                             truncated=True), usage=Usage(1, 2, 3, 4, 5.0, 1))
    again = ExtractResult.from_dict(json.loads(r.to_json()))
    assert again.to_json() == r.to_json()


# -- spans and confidence ---------------------------------------------------------------------

def test_scan_paths_and_spans() -> None:
    text = '{"a":1,"b":{"c":"x y","d":[true,null]},"e f":-2.5}'
    spans = {s.path: s for s in scan(text)}
    assert set(spans) == {"$", "$.a", "$.b", "$.b.c", "$.b.d", "$.b.d[0]", "$.b.d[1]", '$["e f"]'}
    assert text[spans["$.b.c"].start:spans["$.b.c"].end] == '"x y"'
    assert text[spans['$["e f"]'].start:spans['$["e f"]'].end] == "-2.5"
    assert [s.path for s in leaf_spans(text)] == ["$.a", "$.b.c", "$.b.d[0]", "$.b.d[1]", '$["e f"]']


def test_scan_truncated_and_resume_point() -> None:
    text = '{"name":"Ada","bio":"she wrote the first progr'
    spans = {s.path: s for s in scan(text)}
    assert spans["$.name"].complete and not spans["$.bio"].complete and not spans["$"].complete
    cut = resume_point(text, "$", truncated=True)
    assert text[:cut] == '{"name":"Ada","bio":'
    in_key = '{"name":"Ada","ag'
    assert in_key[:resume_point(in_key, "$", truncated=True)] == '{"name":"Ada"'
    done = '{"name":"Ada","email":"not-an-email","age":3}'
    assert done[:resume_point(done, "$.email")] == '{"name":"Ada","email":'
    assert resume_point(done, "$") == 0 and resume_point(in_key, "$") == 0


def test_leaf_confidence_from_token_texts() -> None:
    text = '{"a":"xy","b":12}'
    toks = ['{"', 'a', '":"', 'x', 'y', '","', 'b', '":', '1', '2', '}']
    lps = [-0.1, -0.2, -0.3, -1.0, -2.0, -0.5, -0.1, -0.1, -0.4, -0.6, -0.05]
    entries = [(lp, i, t) for i, (lp, t) in enumerate(zip(lps, toks, strict=True))]
    spans = token_spans(text, entries)
    conf = leaf_confidence(text, spans)
    # "xy" with its quotes: tokens '":"' (holds the opening quote), x, y, '","'
    assert conf["$.a"]["min"] == -2.0
    assert conf["$.a"]["mean"] == pytest.approx((-0.3 - 1.0 - 2.0 - 0.5) / 4, abs=1e-4)
    assert conf["$.b"] == {"mean": pytest.approx(-0.5), "min": -0.6}


def test_forced_tokens_have_no_logprob() -> None:
    text = '{"a":true}'
    entries = [(None, 0, '{"a":'), (None, 1, "true"), (None, 2, "}")]
    assert leaf_confidence(text, token_spans(text, entries)) == {"$.a": {"mean": 0.0, "min": 0.0}}


# -- journal and stats -----------------------------------------------------------------------------

def test_journal_persists_and_keys_are_content_hashes(tmp_path: Path) -> None:
    key = content_key({"id": "a", "text": "t", "schema": "s"})
    assert key == content_key({"schema": "s", "text": "t", "id": "a"})  # order-independent
    assert key != content_key({"id": "a", "text": "t2", "schema": "s"})
    j = Journal(tmp_path / "p.sqlite")
    assert j.get(key) is None
    j.put(key, "a", True, '{"id":"a"}')
    j.put("k2", "b", False, '{"id":"b"}')
    j.close()
    again = Journal(tmp_path / "p.sqlite")
    assert again.get(key) == (True, '{"id":"a"}') and again.get("k2") == (False, '{"id":"b"}')
    assert again.counts() == {"ok": 1, "failed": 1}
    mode = again._db.execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
    again.close()


def _on_disk(path: Path) -> set[str]:
    """Keys another connection sees (what a resumed job would find)."""
    db = sqlite3.connect(path)
    try:
        return {r[0] for r in db.execute("SELECT key FROM records")}
    finally:
        db.close()


def test_journal_group_commit(tmp_path: Path) -> None:
    path = tmp_path / "g.sqlite"
    j = Journal(path, max_pending=3, max_delay=3600)
    j.put("k1", "a", True, "1")
    j.put("k2", "b", False, "2")
    assert j.get("k1") == (True, "1")  # pending records answer in-process
    assert _on_disk(path) == set() and j.commits == 0  # not yet durable
    j.commit()
    assert _on_disk(path) == {"k1", "k2"} and j.commits == 1  # one transaction for the group
    j.commit()
    assert j.commits == 1  # nothing pending: no empty transaction
    for k in ("k3", "k4", "k5"):  # a full group commits itself
        j.put(k, k, True, k)
    assert _on_disk(path) == {"k1", "k2", "k3", "k4", "k5"} and j.commits == 2
    j.put_many([("k6", "f", True, "6"), ("k7", "g", True, "7")])
    assert {"k6", "k7"} <= _on_disk(path) and j.commits == 3
    j.put("k8", "h", True, "8")
    j.close()  # close commits what is buffered
    assert "k8" in _on_disk(path)
    aged = Journal(path, max_pending=100, max_delay=0.0)  # an old group commits on the next put
    aged.put("k9", "i", True, "9")
    assert "k9" in _on_disk(path)
    aged.close()


def test_stats_fill_rates() -> None:
    s = Stats()
    s.add(ExtractResult("1", data={"a": 1, "b": None, "c": [{"d": "x"}]}))
    s.add(ExtractResult("2", data={"a": None, "b": "y", "c": []}))
    s.add(ExtractResult("3", error=RecordError("OutputValidationError", "m")))
    d = s.to_dict()
    assert d["records"] == 3 and d["valid"] == 2 and d["failed_by_type"] == {"OutputValidationError": 1}
    assert d["fill_rate"] == {"a": 0.5, "b": 0.5, "c": 0.5, "c[].d": 0.5}


def test_progress_bar_and_summary_table_render() -> None:
    import io

    from structgen.extract.progress import Progress, summary_table

    s = Stats(total=4)
    buf = io.StringIO()
    bar = Progress(s, file=buf, refresh_per_second=1000)
    s.add(ExtractResult("1", data={"a": 1}, usage=Usage(prompt_tokens=100, cached_tokens=80, generated_tokens=10)))
    s.add(ExtractResult("2", error=RecordError("OutputValidationError", "m"), usage=Usage(prompt_tokens=100)))
    bar.update()
    bar.close()
    out = buf.getvalue()
    for part in ("2/4", "docs/s", "tok/s", "cache 40%", "errors 1", "ETA"):
        assert part in out, (part, out)
    quiet = io.StringIO()
    Progress(s, quiet=True, file=quiet).close()
    assert quiet.getvalue() == ""
    table = io.StringIO()
    summary_table(s, file=table)
    text = table.getvalue()
    for part in ("records", "valid", "failed: OutputValidationError", "prefix-cache hit rate", "field fill rate", "a"):
        assert part in text, part
