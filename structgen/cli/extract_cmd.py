"""``structgen extract``: a file of documents in, one validated JSON record per document out."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from structgen.extract.stream import DEFAULT_CONCURRENCY

__all__ = ["extract_command"]


class BackendName(StrEnum):
    embedded = "embedded"
    vllm = "vllm"
    sglang = "sglang"
    openai = "openai"
    llamacpp = "llamacpp"
    triton = "triton"
    trtllm = "trtllm"


class OutputFormat(StrEnum):
    jsonl = "jsonl"
    parquet = "parquet"
    openai_batch = "openai-batch"


_IO = "Input and output"
_PROMPT = "Prompt"
_MODEL = "Backend and model"
_GEN = "Generation"
_JOB = "Job control"


def extract_command(
    schema: Annotated[str | None, typer.Option(
        "--schema", "-s", rich_help_panel=_IO,
        help="A bundled schema (`structgen schemas`), a JSON Schema file, or `pkg.module:Model`.")] = None,
    input: Annotated[str, typer.Option(
        "--input", "-i", rich_help_panel=_IO,
        help="Documents: `.jsonl`, `.csv`, `.parquet`, a quoted glob of text files (`'docs/*.txt'`), an "
             "OpenAI batch JSONL file, or `-` for JSONL on stdin.")] = ...,  # type: ignore[assignment]
    output: Annotated[str, typer.Option(
        "--output", "-o", rich_help_panel=_IO,
        help="Where results go: `.jsonl`, `.parquet`, or `-` for stdout. Written as records finish, in input order.")
    ] = ...,  # type: ignore[assignment]
    output_format: Annotated[OutputFormat | None, typer.Option(
        "--output-format", rich_help_panel=_IO,
        help="Force a format; `openai-batch` writes OpenAI Batch API result lines.")] = None,
    text_field: Annotated[str, typer.Option("--text-field", rich_help_panel=_IO,
                                            help="Field (column) holding the document.")] = "text",
    id_field: Annotated[str, typer.Option("--id-field", rich_help_panel=_IO,
                                          help="Field holding the record id (default: line number).")] = "id",
    schema_field: Annotated[str | None, typer.Option(
        "--schema-field", rich_help_panel=_IO,
        help="Field naming each record's own schema (heterogeneous jobs); records without it use --schema.")] = None,
    instructions: Annotated[Path | None, typer.Option(
        "--instructions", rich_help_panel=_PROMPT, exists=True, dir_okay=False,
        help="File with the system instructions; `{schema}` in it is replaced by the JSON schema.")] = None,
    few_shot: Annotated[Path | None, typer.Option(
        "--few-shot", rich_help_panel=_PROMPT, exists=True, dir_okay=False,
        help='JSONL of examples, one `{"text": ..., "data": {...}}` per line.')] = None,
    backend: Annotated[BackendName, typer.Option("--backend", "-b", rich_help_panel=_MODEL,
                                                 help="Where the model runs.")] = BackendName.embedded,
    url: Annotated[list[str] | None, typer.Option(
        "--url", rich_help_panel=_MODEL,
        help="Engine server URL; repeat for several servers (least-outstanding balancing with prefix affinity).")
    ] = None,
    model: Annotated[str | None, typer.Option(
        "--model", "-m", rich_help_panel=_MODEL,
        help="Model: a local path / .gguf for embedded, the served model name for servers.")] = None,
    dtype: Annotated[str | None, typer.Option("--dtype", rich_help_panel=_MODEL,
                                              help="Embedded model dtype: float32 (default on CPU), bfloat16, or auto "
                                                   "(bfloat16 where a load-time probe measures it faster).")
                     ] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, rich_help_panel=_GEN,
                                            help="Most tokens generated per attempt.")] = 512,
    temperature: Annotated[float, typer.Option("--temperature", min=0.0, rich_help_panel=_GEN,
                                               help="0 = greedy (the default).")] = 0.0,
    retries: Annotated[int, typer.Option(
        "--retries", min=0, rich_help_panel=_GEN,
        help="Attempts after a rejected output; each shows the model the validator's message.")] = 1,
    confidence: Annotated[bool, typer.Option(
        "--confidence", rich_help_panel=_GEN,
        help="Add per-field confidence: mean and minimum token log-probability of each leaf value, "
             "whether the value occurs in the record's text (grounded), and for list items whether "
             "it repeats an earlier item's value (repeated).")] = False,
    fit_budget: Annotated[bool, typer.Option(
        "--fit-budget/--no-fit-budget", rich_help_panel=_GEN,
        help="Bound the schema's strings and arrays so the longest object fits --max-tokens "
             "(a runaway value cannot cut the record).")] = True,
    concurrency: Annotated[int, typer.Option("--concurrency", "-c", min=1, rich_help_panel=_JOB,
                                             help="Records in flight at once.")] = DEFAULT_CONCURRENCY,
    journal: Annotated[Path | None, typer.Option(
        "--journal", rich_help_panel=_JOB,
        help="Progress database (default: OUTPUT.progress.sqlite). Rerunning the same command skips finished records.")
    ] = None,
    no_resume: Annotated[bool, typer.Option("--no-resume", rich_help_panel=_JOB,
                                            help="Keep no progress journal; recompute everything.")] = False,
    retry_failed: Annotated[bool, typer.Option("--retry-failed", rich_help_panel=_JOB,
                                               help="Re-run records that failed before (finished ones stay).")] = False,
    summary: Annotated[Path | None, typer.Option("--summary", rich_help_panel=_JOB,
                                                 help="Summary JSON (default: OUTPUT.summary.json).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", rich_help_panel=_JOB,
                                        help="No progress bar and no summary table.")] = False,
    ray: Annotated[bool, typer.Option("--ray", rich_help_panel=_JOB,
                                      help="Run as a Ray Data pipeline over an actor pool of workers.")] = False,
    address: Annotated[str | None, typer.Option("--address", rich_help_panel=_JOB,
                                                help="Ray cluster address (with --ray; default: start a local one).")
                       ] = None,
    workers: Annotated[int, typer.Option("--workers", min=1, rich_help_panel=_JOB,
                                         help="Ray actors (with --ray); each owns a model or binds to servers.")] = 1,
    cpus_per_worker: Annotated[float | None, typer.Option(
        "--cpus-per-worker", min=0.01, rich_help_panel=_JOB,
        help="CPUs per Ray actor (with --ray): an embedded engine's torch threads. Default: the largest node's "
             "CPUs less one, shared by the workers (the local cluster: all cores); 1 with --url.")] = None,
) -> None:
    """Extract one validated JSON record per document.

    Every input record gives exactly one output line: `{"id", "data", "usage"}`, or
    `{"id", "error": {"type", "message", "raw", "path"}, "usage"}` when the output could not
    be validated. Progress is journaled per record: rerun the same command after a crash
    and only unfinished records run.

    Example (the embedded model, a bundled schema and its sample):

        structgen extract --schema contact_card --input schemas/samples/contact_card.jsonl --output -
    """
    from structgen.extract.api import JobOptions, make_backend, run_job
    from structgen.extract.extractor import ExtractConfig
    from structgen.extract.inputs import Fields

    if schema is None and schema_field is None and not _is_openai_batch(input):
        raise typer.BadParameter("give --schema (or --schema-field, or an OpenAI batch input with response_format)",
                                 param_hint="--schema")
    opts = JobOptions(
        input=input, output=output, schema=schema,
        fields=Fields(text=text_field, id=id_field, schema=schema_field),
        instructions=instructions.read_text(encoding="utf-8") if instructions else None,
        few_shot=str(few_shot) if few_shot else None,
        config=ExtractConfig(max_tokens=max_tokens, temperature=temperature, retries=retries, confidence=confidence,
                             fit_budget=fit_budget),
        concurrency=concurrency, journal=str(journal) if journal else None, resume=not no_resume,
        retry_failed=retry_failed, output_format=output_format.value if output_format else None,
        quiet=quiet, summary=str(summary) if summary else None)
    backend_kw: dict[str, object] = {}
    if dtype is not None:
        backend_kw["dtype"] = dtype
    if ray:
        from structgen.extract.ray_job import RayOptions, run_ray_job

        stats = run_ray_job(opts, RayOptions(backend=backend.value, urls=tuple(url or ()), model=model,
                                             backend_kwargs=backend_kw, address=address, workers=workers,
                                             cpus_per_worker=cpus_per_worker))
    else:
        be = make_backend(backend.value, tuple(url or ()), model, **backend_kw)
        try:
            stats = run_job(opts, be)
        finally:
            be.close()
    if stats.records and stats.valid == 0:
        raise typer.Exit(1)


def _is_openai_batch(path: str) -> bool:
    import json

    p = Path(path)
    if not p.is_file() or p.suffix.lower() not in (".jsonl", ".ndjson"):
        return False
    with open(p, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                try:
                    obj = json.loads(line)
                except ValueError:
                    return False
                return isinstance(obj, dict) and "custom_id" in obj and "body" in obj
    return False
