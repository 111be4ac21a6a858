"""The extraction entry points: :func:`extract` (Python, yields typed results) and
:func:`run_job` (files in, files out, journal, progress, summary: what the CLI runs).

    for r in structgen.extract(["Ada Lovelace, ada@example.org"], schema="contact_card"):
        print(r.id, r.data if r.ok else r.error)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from structgen.contract.backend import Backend
from structgen.contract.registry import get_backend, resolve
from structgen.errors import BackendError, InputError
from structgen.extract.extractor import ExtractConfig, Extractor
from structgen.extract.inputs import Fields, as_records, read_records
from structgen.extract.journal import Journal
from structgen.extract.outputs import open_writer
from structgen.extract.progress import Progress, summary_table
from structgen.extract.prompt import Example, PromptBuilder, load_few_shot
from structgen.extract.records import ExtractResult
from structgen.extract.stream import DEFAULT_CONCURRENCY, run_records
from structgen.extract.summary import Stats

__all__ = ["JobOptions", "extract", "make_backend", "run_job"]


def make_backend(name: str = "embedded", urls: Sequence[str] = (), model: str | None = None,
                 **kw: Any) -> Backend:
    """A backend by name; several ``urls`` make a :class:`~structgen.extract.balance.Balancer`
    over one server backend per URL."""
    if name == "embedded":
        if urls:
            raise BackendError("the embedded backend runs in-process and takes no --url", backend=name)
        return get_backend("embedded", model=model, **kw) if model else get_backend("embedded", **kw)
    if model:
        kw["model"] = model
    if len(urls) <= 1:
        return get_backend(name, **({"base_url": urls[0]} if urls else {}), **kw)
    from structgen.extract.balance import Balancer

    return Balancer([get_backend(name, base_url=u, **kw) for u in urls])


def _examples(few_shot: str | Path | Sequence[Any] | None) -> list[Example]:
    if few_shot is None:
        return []
    if isinstance(few_shot, (str, Path)):
        return load_few_shot(few_shot)
    out = []
    import json

    for ex in few_shot:
        if isinstance(ex, Example):
            out.append(ex)
        elif isinstance(ex, dict):
            data = ex["data"]
            dump = getattr(data, "model_dump_json", None)
            out.append(Example(ex["text"], dump() if callable(dump) else
                               json.dumps(data, ensure_ascii=False, separators=(",", ":"))))
        else:
            raise InputError(f"a few-shot example is an Example or a {{'text', 'data'}} dict, not {ex!r:.80}")
    return out


def _instructions(instructions: str | Path | None) -> str | None:
    if isinstance(instructions, Path):
        return instructions.read_text(encoding="utf-8")
    return instructions


def extract(inputs: Iterable[Any] | str | Path, schema: Any = None, *, backend: Backend | str | None = None,
            instructions: str | Path | None = None, few_shot: str | Path | Sequence[Any] | None = None,
            max_tokens: int = 512, temperature: float = 0.0, retries: int = 1, confidence: bool = False,
            concurrency: int = DEFAULT_CONCURRENCY, journal: str | Path | None = None,
            retry_failed: bool = False, fields: Fields | None = None,
            fit_budget: bool = True) -> Iterator[ExtractResult]:
    """Extract ``schema`` from every input; yield one :class:`ExtractResult` per input, in
    input order, as they finish.

    ``inputs``: strings, dicts (``{"id", "text"}``), :class:`InputRecord` objects, or a file
    path / glob (JSONL, CSV, Parquet, text files). ``schema``: a pydantic model class (then
    ``result.data`` is an instance of it), a JSON schema dict, a bundled schema's name, a
    ``.json`` file or ``pkg.module:Model``; a record's own ``schema`` (``fields.schema``)
    overrides it. ``journal``: an SQLite file recording finished records, so a rerun skips
    them (``retry_failed`` re-runs the failed ones). ``fit_budget``: bound the schema's free
    lengths so the longest object fits ``max_tokens`` (:mod:`structgen.extract.fit`). Never
    raises for one record: a failure is the result's ``error``.
    """
    be = resolve(backend)
    fields = fields or Fields()
    records = read_records(inputs, fields) if isinstance(inputs, (str, Path)) else as_records(inputs, fields)
    cfg = ExtractConfig(max_tokens=max_tokens, temperature=temperature, retries=retries, confidence=confidence,
                        fit_budget=fit_budget)
    prompts = PromptBuilder(be, instructions=_instructions(instructions), examples=_examples(few_shot))
    extractor = Extractor(be, schema, config=cfg, prompts=prompts)
    jr = Journal(journal) if journal is not None else None
    try:
        for done in run_records(records, extractor, journal=jr, retry_failed=retry_failed,
                                concurrency=concurrency):
            yield done.result
    finally:
        if jr is not None:
            jr.close()


@dataclass
class JobOptions:
    """A whole job, as the CLI states it."""

    input: str
    output: str
    schema: Any = None
    fields: Fields = field(default_factory=Fields)
    instructions: str | None = None
    few_shot: str | None = None
    config: ExtractConfig = field(default_factory=ExtractConfig)
    concurrency: int = DEFAULT_CONCURRENCY
    journal: str | None = None  # default: <output>.progress.sqlite
    resume: bool = True
    retry_failed: bool = False
    output_format: str | None = None
    quiet: bool = False
    summary: str | None = None  # default: <output>.summary.json
    total: int | None = None

    def journal_path(self) -> Path | None:
        if not self.resume:
            return None
        if self.journal:
            return Path(self.journal)
        if self.output == "-":
            return None
        return Path(self.output + ".progress.sqlite")

    def summary_path(self) -> Path | None:
        if self.summary:
            return Path(self.summary)
        return None if self.output == "-" else Path(self.output + ".summary.json")


def count_lines(path: str) -> int | None:
    """Records in a JSONL file (for the progress bar's total); None for other inputs."""
    p = Path(path)
    if not p.is_file() or p.suffix.lower() not in (".jsonl", ".ndjson"):
        return None
    n = 0
    with open(p, "rb") as fh:
        for line in fh:
            if line.strip():
                n += 1
    return n


def run_job(opts: JobOptions, backend: Backend) -> Stats:
    """Run a job: read lazily, extract, write each record as it is ready (input order),
    record progress in the journal, show progress, write the summary JSON."""
    records = read_records(opts.input, opts.fields)
    prompts = PromptBuilder(backend, instructions=opts.instructions, examples=_examples(opts.few_shot))
    extractor = Extractor(backend, opts.schema, config=opts.config, prompts=prompts)
    stats = Stats(total=opts.total if opts.total is not None else count_lines(opts.input))
    jpath = opts.journal_path()
    journal = Journal(jpath) if jpath is not None else None
    writer = open_writer(opts.output, opts.output_format)
    progress = Progress(stats, quiet=opts.quiet or opts.output == "-")
    try:
        for done in run_records(records, extractor, journal=journal, retry_failed=opts.retry_failed,
                                concurrency=opts.concurrency):
            writer.write(done.line, done.result.extra)
            stats.add(done.result, resumed=done.resumed)
            progress.update()
    finally:
        progress.close()
        writer.close()
        if journal is not None:
            journal.close()
    spath = opts.summary_path()
    if spath is not None:
        stats.write(spath)
    if not opts.quiet:
        summary_table(stats)
    return stats
