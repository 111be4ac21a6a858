"""``structgen extract --ray``: the same job as a Ray Data pipeline.

    read_text / read_csv / read_parquet / read_binary_files   (the input, in blocks)
      -> map_batches(ExtractWorker)    an actor pool; each actor parses its rows into
                                       records (bad lines become error records) and owns an
                                       embedded engine or is bound to engine servers
                                       (--url, balanced)
      -> the driver streams the rows back in input order into the output file

The actors parse their own rows: a separate parse stage was one more operator for Ray Data
to schedule, and its records crossed the object store re-encoded as JSON, for work that
takes microseconds per row.

Exactly-once across restarts uses the same content keys and the same SQLite journal as
the local job (a row without an id gets one from a hash of its content, since blocks are
read in parallel and have no line numbers): the journal is owned by one :class:`JournalActor` beside the driver;
each worker asks it which records of its batch are finished (their stored lines pass
through untouched) and stores new results there in groups, one transaction each, before
they leave the worker. A restarted
job therefore recomputes only unfinished records, and the output file is rewritten in
input order from stored and new lines.

Multi-node: start Ray on each machine (``ray start --head`` / ``ray start
--address=HEAD:6379``), start engine servers, and pass ``--address auto`` with one
``--url`` per server (see backends/README.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

from structgen.errors import BackendError, InputError
from structgen.extract.api import JobOptions, _examples, count_lines
from structgen.extract.extractor import ExtractConfig, Extractor
from structgen.extract.inputs import Fields, _from_mapping, source_kind
from structgen.extract.outputs import open_writer
from structgen.extract.progress import Progress, summary_table
from structgen.extract.prompt import PromptBuilder
from structgen.extract.records import ExtractResult, InputRecord
from structgen.extract.stream import DEFAULT_CONCURRENCY
from structgen.extract.summary import Stats

__all__ = ["RayOptions", "balance_workers", "local_cpus", "run_ray_job", "worker_cpus"]


@dataclass(frozen=True)
class RayOptions:
    """Where and how the workers run. ``address``: an existing cluster (``auto``), else a
    local one is started with ``num_cpus`` (default: this machine's cores plus one logical
    CPU for the pipeline's read tasks). ``workers``: actors in the pool.
    ``cpus_per_worker``: each actor's CPUs -- its engine's torch threads, as Ray sets
    ``OMP_NUM_THREADS`` from them (default: :func:`worker_cpus`)."""

    backend: str = "embedded"
    urls: tuple[str, ...] = ()
    model: str | None = None
    backend_kwargs: dict[str, Any] = field(default_factory=dict)
    address: str | None = None
    workers: int = 1
    num_cpus: int | None = None
    batch_size: int = DEFAULT_CONCURRENCY  # records per map_batches call: one worker's records in flight
    cpus_per_worker: float | None = None


def _require_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise BackendError("--ray needs Ray Data: pip install 'structgen-lm[ray]'", backend="ray") from exc
    return ray


# -- pipeline stages (run on Ray workers) ----------------------------------------------------

def _rows(batch: dict[str, Any]) -> list[dict[str, Any]]:
    names = list(batch)
    n = len(batch[names[0]]) if names else 0
    return [{k: (v.item() if hasattr(v, "item") else v) for k, v in ((k, batch[k][i]) for k in names)}
            for i in range(n)]


def _fallback_id(kind: str, content: str) -> str:
    """An id for a row without one: Ray reads blocks in parallel, so there is no line
    number; a hash of the row keeps the id (and the progress key) stable across runs."""
    return f"{kind}-{hashlib.sha256(content.encode()).hexdigest()[:12]}"


def parse_lines(batch: dict[str, Any], fields: dict[str, Any], source: str) -> list[InputRecord]:
    """JSONL lines (``read_text``'s ``text`` column) -> records; a bad line is an error record."""
    f = Fields(**fields)
    out = []
    for row in _rows(batch):
        line = row["text"]
        rid = _fallback_id("line", line)
        try:
            obj = json.loads(line)
        except ValueError as exc:
            out.append(InputRecord(id=rid, error=str(InputError(f"not JSON: {exc}", source=source, where=rid))))
        else:
            out.append(_from_mapping(obj, f, source, rid, rid))
    return out


def parse_rows(batch: dict[str, Any], fields: dict[str, Any], source: str, files: bool = False
               ) -> list[InputRecord]:
    """Table rows (CSV, Parquet) or whole text files (``path``, ``bytes``) -> records."""
    f = Fields(**fields)
    out = []
    for row in _rows(batch):
        if files:
            try:
                rec = InputRecord(id=str(row["path"]), text=bytes(row["bytes"]).decode("utf-8"))
            except UnicodeDecodeError as exc:
                rec = InputRecord(id=str(row["path"]), error=f"cannot read: {exc}")
        else:
            rid = _fallback_id("row", json.dumps(row, sort_keys=True, default=str))
            rec = _from_mapping(row, f, source, rid, rid)
        out.append(rec)
    return out


class JournalActor:
    """Owns the job's SQLite journal (one writer), beside the driver."""

    def __init__(self, path: str):
        from structgen.extract.journal import Journal

        self.journal = Journal(path)

    def get_many(self, keys: list[str]) -> list[tuple[bool, str] | None]:
        return [self.journal.get(k) for k in keys]

    def put_many(self, rows: list[tuple[str, str, bool, str]]) -> None:
        """One committed transaction for a group of finished records."""
        self.journal.put_many(rows)

    def close(self) -> None:
        self.journal.close()


class ExtractWorker:
    """One actor of the pool: a backend (an embedded engine, or servers) and an
    :class:`Extractor`; parses a batch of input rows and extracts its records concurrently,
    skipping journaled ones."""

    def __init__(self, job: dict[str, Any], ray_opts: dict[str, Any], journal: Any,
                 parse: Callable[[dict[str, Any]], list[InputRecord]]):
        from structgen.extract.api import make_backend

        self.backend = make_backend(ray_opts["backend"], tuple(ray_opts["urls"]), ray_opts["model"],
                                    **ray_opts["backend_kwargs"])
        prompts = PromptBuilder(self.backend, instructions=job["instructions"], examples=_examples(job["few_shot"]))
        self.extractor = Extractor(self.backend, job["schema"], config=ExtractConfig(**job["config"]),
                                   prompts=prompts)
        self.journal = journal
        self.parse = parse
        self.retry_failed = job["retry_failed"]
        self.concurrency = job["concurrency"]
        self.worker = f"{socket.gethostname()}:{os.getpid()}"  # the summary's records per worker

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[Any]]:
        import ray

        from structgen.extract.stream import model_id, record_key, run_records

        records = self.parse(batch)
        model = model_id(self.backend)
        keys = [record_key(self.extractor, r, model)[0] for r in records]
        stored = ray.get(self.journal.get_many.remote(keys)) if self.journal is not None else [None] * len(keys)
        lines: list[str] = [""] * len(records)
        resumed = [False] * len(records)
        todo: list[int] = []
        for i, s in enumerate(stored):
            if s is not None and (s[0] or not self.retry_failed):
                lines[i], resumed[i] = s[1], True
            else:
                todo.append(i)
        journal = self.journal

        class _Remote:  # run_records' journal interface: groups of puts go to the actor at each commit
            def __init__(self) -> None:
                self.rows: list[tuple[str, str, bool, str]] = []
                self.lock = threading.Lock()

            def get(self, key: str) -> None:
                return None

            def put(self, key: str, record_id: str, ok: bool, line: str) -> None:
                with self.lock:
                    self.rows.append((key, record_id, ok, line))

            def commit(self) -> None:
                with self.lock:
                    rows, self.rows = self.rows, []
                if rows and journal is not None:
                    ray.get(journal.put_many.remote(rows))

        for i, done in zip(todo, run_records([records[i] for i in todo], self.extractor,
                                             journal=_Remote(),  # type: ignore[arg-type]
                                             concurrency=self.concurrency), strict=True):
            lines[i] = done.line
        return {"line": lines, "resumed": resumed, "extra": [json.dumps(r.extra, default=str) for r in records],
                "worker": [self.worker] * len(records)}


# -- the driver ---------------------------------------------------------------------------------

def _dataset(ray: Any, opts: JobOptions) -> tuple[Any, Callable[[dict[str, Any]], list[InputRecord]]]:
    """The input as a Ray dataset of raw rows, and the function the workers parse a batch
    of them with (:func:`parse_lines` or :func:`parse_rows`, bound to the fields and source)."""
    src = opts.input
    kw: dict[str, Any] = {"fields": asdict(opts.fields), "source": src}
    kind, paths = source_kind(src)
    if kind == "glob":
        return ray.data.read_binary_files(paths, include_paths=True), partial(parse_rows, **kw, files=True)
    if kind == "jsonl":
        return ray.data.read_text(paths[0]), partial(parse_lines, **kw)
    if kind == "csv":
        return ray.data.read_csv(paths[0]), partial(parse_rows, **kw)
    if kind == "parquet":
        return ray.data.read_parquet(paths[0]), partial(parse_rows, **kw)
    raise InputError("--ray reads .jsonl, .csv, .parquet or a glob of text files", source=src)


#: settings of a local cluster's processes (Ray reads RAY_* variables; the caller's win)
RAY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    # under load the dashboard / runtime-env agents and the workers (importing torch and
    # structgen) start slowly; Ray's defaults (30 s, 60 s) make a busy machine fail
    "RAY_agent_register_timeout_ms": "180000",
    "RAY_worker_register_timeout_seconds": "180",
    # Ray starts its workers at nice 15, below its own processes (raylet, GCS, Ray Data's
    # helper actors, the driver): the engine actor doing all the work then loses the CPU to
    # them whenever they wake, and its threads wait on each other (one worker measured 1.34
    # of 2 cores against the local job's 1.45). The engine is the work: same priority.
    "RAY_worker_niceness": "0",
}


#: batches an actor works on at once (threads of the actor, one engine): the next batch's
#: records queue in the engine behind the current one's and start as they finish, so its
#: last few sequences do not decode alone (steps of a handful of rows, at nearly the cost of
#: a full one). Measured in one process, 1,536 records in batches of 512, the ways run in
#: turn: one batch at a time 21.76 docs/s, two 23.53 (21.36 in a second round), one stream
#: of all 22.64. Each batch keeps the job's records in flight (with half each, the last
#: batch ran alone at half: 22.83 and 20.45).
BATCHES_IN_FLIGHT = 2


def balance_workers(ctx: Any, workers: int) -> None:
    """Ray Data settings that keep every worker of the pool busy (``ctx``: the driver's
    ``DataContext``). With Ray's defaults, a 600-record job with two workers on three CPUs
    computed 512 records on one worker and 88 on the other: Ray Data budgets the object
    store by ``target_max_block_size`` (128 MiB) per task, not by the blocks' real size, so
    on a 256 MiB store it held tasks back and fed one actor. Our blocks are records of text:
    a 1 MiB target makes the budget real; with several workers the pool starts
    dispatching once all its actors are up (an engine loads in seconds to minutes: a
    15-minute wait), and each actor holds two batches at a time (:data:`BATCHES_IN_FLIGHT`),
    so an actor with a free slot takes the next one. One worker has no one to share with:
    Ray Data's waiting would hold back the reading too (it starts no task before the pool
    is up), so the first batch would wait for a read task started only then (2 s measured,
    most of it a worker process starting); without it the input is read while the engine
    loads."""
    ctx.target_max_block_size = 1024 * 1024
    ctx.wait_for_min_actors_s = 900 if workers > 1 else -1  # -1: Ray Data's default, no wait


def local_cpus() -> int:
    """A local cluster's logical CPUs: the machine's cores, plus one for the pipeline's
    read tasks (light work that must not wait behind the engine actors, which
    take the cores)."""
    return (os.cpu_count() or 1) + 1


def worker_cpus(ropts: RayOptions, node_cpus: float) -> float:
    """Each actor's CPUs when ``cpus_per_worker`` is not given. A worker that owns an
    embedded engine computes: it gets the largest node's CPUs less the one left for the
    pipeline's tasks, shared by the workers (on the local cluster, the machine's cores: the
    local job's torch threads), at least 1. A worker bound to engine servers only waits on
    them: 1."""
    if ropts.cpus_per_worker is not None:
        return ropts.cpus_per_worker
    if ropts.backend != "embedded" or ropts.urls:
        return 1.0
    return float(max(1, int(node_cpus - 1) // max(1, ropts.workers)))


def _largest_node_cpus(ray: Any) -> float:
    return max((float(n.get("Resources", {}).get("CPU", 0)) for n in ray.nodes() if n.get("Alive")), default=1.0)


def start_local_ray(num_cpus: int | None = None, attempts: int = 2) -> None:
    """Start a local Ray cluster in this process: no dashboard, no usage stats, 256 MiB of
    object store, generous agent / worker start-up deadlines (:data:`RAY_ENV`). Ray >= 2.54
    replaced the configurable agent deadline by a fixed 15 s one that a loaded machine
    misses (ray-project/ray#65983); the ``ray`` extra therefore asks for Ray < 2.54."""
    ray = _require_ray()
    for key, value in RAY_ENV.items():
        os.environ.setdefault(key, value)
    for attempt in range(attempts):
        try:
            ray.init(num_cpus=local_cpus() if num_cpus is None else num_cpus, object_store_memory=256 * 1024 * 1024,
                     include_dashboard=False, log_to_driver=False)
            return
        except Exception as exc:
            ray.shutdown()
            if attempt == attempts - 1 or "timed out during startup" not in str(exc):
                raise BackendError(f"cannot start a local Ray cluster: {exc}", backend="ray") from exc


def run_ray_job(opts: JobOptions, ropts: RayOptions) -> Stats:
    """Run ``opts`` as a Ray Data pipeline; returns the same :class:`Stats` as :func:`run_job`."""
    ray = _require_ray()
    started_here = False
    if not ray.is_initialized():
        if ropts.address:
            ray.init(address=ropts.address, include_dashboard=False, log_to_driver=False)
        else:
            start_local_ray(ropts.num_cpus)
        started_here = True
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    ctx.enable_progress_bars = False
    balance_workers(ctx, ropts.workers)
    jpath = opts.journal_path()
    journal = ray.remote(num_cpus=0)(JournalActor).remote(str(jpath)) if jpath is not None else None
    job = {"instructions": opts.instructions, "few_shot": opts.few_shot, "schema": opts.schema,
           "config": asdict(opts.config), "retry_failed": opts.retry_failed, "concurrency": opts.concurrency}
    rdict = {"backend": ropts.backend, "urls": list(ropts.urls), "model": ropts.model,
             "backend_kwargs": dict(ropts.backend_kwargs)}
    raw, parse = _dataset(ray, opts)
    ds = raw.map_batches(
        ExtractWorker, fn_constructor_kwargs={"job": job, "ray_opts": rdict, "journal": journal, "parse": parse},
        batch_size=ropts.batch_size,
        compute=ray.data.ActorPoolStrategy(size=ropts.workers, max_tasks_in_flight_per_actor=BATCHES_IN_FLIGHT),
        max_concurrency=BATCHES_IN_FLIGHT, num_cpus=worker_cpus(ropts, _largest_node_cpus(ray)))
    stats = Stats(total=opts.total if opts.total is not None else count_lines(opts.input))
    writer = open_writer(opts.output, opts.output_format)
    progress = Progress(stats, quiet=opts.quiet or opts.output == "-")
    try:
        for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
            for line, resumed, extra, worker in zip(batch["line"], batch["resumed"], batch["extra"], batch["worker"],
                                                    strict=True):
                result = ExtractResult.from_dict(json.loads(str(line)))
                writer.write(str(line), json.loads(str(extra)))
                stats.add(result, resumed=bool(resumed), worker=str(worker))
                progress.update()
    finally:
        progress.close()
        writer.close()
        if journal is not None:
            ray.get(journal.close.remote())
            ray.kill(journal)
        if started_here:
            ray.shutdown()
    spath = opts.summary_path()
    if spath is not None:
        stats.write(spath)
    if not opts.quiet:
        summary_table(stats)
    return stats
