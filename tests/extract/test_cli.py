"""The `structgen` command line: help, schemas, extract (JSONL and OpenAI batch in and out,
the README's sample), run, and typed errors as one-line messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from structgen.cli.main import app
from structgen.constraints.validation import validate_output
from structgen.extract import resolve_schema

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def structgen_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120"}
    return subprocess.run([sys.executable, "-m", "structgen", *args], cwd=cwd, env=env, capture_output=True,
                          check=False, text=True, timeout=900)


def test_help_names_every_option() -> None:
    res = runner.invoke(app, ["extract", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0
    for opt in ("--schema", "--input", "--output", "--text-field", "--id-field", "--schema-field", "--instructions",
                "--few-shot", "--backend", "--url", "--model", "--retries", "--concurrency", "--confidence", "--ray",
                "--address", "--workers", "--cpus-per-worker", "--output-format", "--retry-failed", "--quiet"):
        assert opt in res.output, opt
    for backend in ("embedded", "vllm", "sglang", "openai", "llamacpp", "triton", "trtllm"):
        assert backend in res.output
    top = runner.invoke(app, ["--help"])
    assert top.exit_code == 0 and all(c in top.output for c in ("extract", "run", "schemas"))


def test_schemas_list_and_show() -> None:
    from structgen import schemas

    res = runner.invoke(app, ["schemas"], env={"COLUMNS": "200"})
    assert res.exit_code == 0
    for name in schemas.names():
        assert name in res.output
    shown = runner.invoke(app, ["schemas", "invoice"])
    assert shown.exit_code == 0
    body = shown.output[shown.output.index("{"):]
    assert json.loads(body) == json.loads(schemas.json_path("invoice").read_text())
    sample = runner.invoke(app, ["schemas", "receipt", "--sample"])
    assert sample.output == schemas.sample_path("receipt").read_text()
    bad = structgen_cli("schemas", "nope")
    assert bad.returncode == 2 and "structgen: error: no bundled schema 'nope'" in bad.stderr


def test_missing_input_is_one_line_error(tmp_path: Path) -> None:
    res = structgen_cli("extract", "--schema", "invoice", "--input", str(tmp_path / "nope.jsonl"),
                        "--output", str(tmp_path / "o.jsonl"))
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1].startswith("structgen: error:") and "no such input file" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.model
def test_readme_sample_extracts_valid_records_in_order(tmp_path: Path) -> None:
    out = tmp_path / "cards.jsonl"
    res = structgen_cli("extract", "--schema", "contact_card", "--input", "schemas/samples/contact_card.jsonl",
                        "--few-shot", "schemas/examples/contact_card.jsonl", "--output", str(out))
    assert res.returncode == 0, res.stderr
    inputs = [json.loads(x) for x in (ROOT / "schemas/samples/contact_card.jsonl").read_text().splitlines()]
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["id"] for r in recs] == [i["id"] for i in inputs]
    spec = resolve_schema("contact_card").spec
    for r in recs:
        assert set(r["usage"]) >= {"prompt_tokens", "cached_tokens", "generated_tokens", "forced_tokens", "ms"}
        if "data" in r:
            validate_output(spec, json.dumps(r["data"]))
        else:
            assert r["error"]["type"] and r["error"]["message"]
    summary = json.loads((tmp_path / "cards.jsonl.summary.json").read_text())
    assert summary["records"] == 3 and summary["valid"] + summary["failed"] == 3
    assert "records" in res.stderr and "valid" in res.stderr  # the summary table
    # the same command again: everything comes from the journal, the output is unchanged
    again = structgen_cli("extract", "--schema", "contact_card", "--input", "schemas/samples/contact_card.jsonl",
                          "--few-shot", "schemas/examples/contact_card.jsonl", "--output", str(out), "--quiet")
    assert again.returncode == 0
    assert [json.loads(x) for x in out.read_text().splitlines()] == recs
    assert json.loads((tmp_path / "cards.jsonl.summary.json").read_text())["resumed"] == 3


@pytest.mark.model
def test_openai_batch_in_and_out(tmp_path: Path) -> None:
    schema = {"type": "object", "additionalProperties": False, "required": ["city"],
              "properties": {"city": {"type": "string", "maxLength": 20}}}
    lines = [{"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "smollm2", "max_tokens": 24,
                       "messages": [{"role": "system", "content": "Extract the city as JSON."},
                                    {"role": "user", "content": text}],
                       "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}}}
             for i, text in enumerate(["I live in Lyon.", "Home is Graz."])]
    inp = tmp_path / "batch.jsonl"
    inp.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "results.jsonl"
    res = structgen_cli("extract", "--input", str(inp), "--output", str(out), "--output-format", "openai-batch",
                        "--max-tokens", "24", "--quiet")
    assert res.returncode == 0, res.stderr
    got = [json.loads(x) for x in out.read_text().splitlines()]
    assert [g["custom_id"] for g in got] == ["req-0", "req-1"]
    for g in got:
        if g["error"] is None:
            body = g["response"]["body"]
            assert g["response"]["status_code"] == 200 and body["model"] == "smollm2"
            validate_output(resolve_schema(schema).spec, body["choices"][0]["message"]["content"])
        else:
            assert g["error"]["code"] and g["error"]["message"]


@pytest.mark.model
def test_run_program_file(tmp_path: Path) -> None:
    prog = tmp_path / "prog.py"
    prog.write_text("import structgen as sg\n\n@sg.program\ndef pick(s, n):\n"
                    "    s += f'Pick a digit below {n}: '\n    s += sg.gen('x', regex=r'[0-9]', max_tokens=4)\n")
    res = structgen_cli("run", f"{prog}:pick", "--arg", "n=3")
    assert res.returncode == 0, res.stderr
    values = json.loads(res.stdout)["values"]
    assert set(values) == {"x"} and len(values["x"]) == 1 and values["x"].isdigit()
    bad = structgen_cli("run", f"{prog}:nope")
    assert bad.returncode == 2 and "not a structgen @program" in bad.stderr
