"""`--ray`: the job as a Ray Data pipeline on a local Ray cluster (2 CPUs): the same
records as the local job, and a rerun skips finished work through the same journal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from structgen.extract import ExtractConfig, JobOptions, run_job

pytestmark = [pytest.mark.model, pytest.mark.slow]

ray = pytest.importorskip("ray")

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}}}


def _records(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        rec.pop("usage")
        out.append(rec)
    return out


@pytest.fixture(scope="module")
def local_ray() -> Any:
    from structgen.extract.ray_job import start_local_ray

    start_local_ray(num_cpus=2)  # a cluster that cannot start fails the test, never skips it
    yield ray
    ray.shutdown()


def test_ray_job_matches_local_and_resumes(tmp_path: Path, local_ray: Any, embedded_backend: Any) -> None:
    from structgen.extract.ray_job import RayOptions, run_ray_job

    docs = [{"id": f"r{i}", "text": f"{n} is {30 + i} years old."} for i, n in enumerate(["Ada", "Bo", "Cy", "Di"])]
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(d) + "\n" for d in docs) + "{not json\n")
    cfg = ExtractConfig(max_tokens=16, retries=0)

    def opts(out: Path) -> JobOptions:
        return JobOptions(input=str(inp), output=str(out), schema=SCHEMA, config=cfg, quiet=True, concurrency=4)

    run_job(opts(tmp_path / "local.jsonl"), embedded_backend)
    ropts = RayOptions(workers=1, batch_size=2)  # three batches
    stats = run_ray_job(opts(tmp_path / "ray.jsonl"), ropts)
    local, distributed = _records(tmp_path / "local.jsonl"), _records(tmp_path / "ray.jsonl")
    assert stats.records == 5 and stats.computed_records == 5 and stats.resumed == 0
    # the same data for every record, in input order; the unreadable line is an error record
    assert [r["id"] for r in distributed[:4]] == ["r0", "r1", "r2", "r3"]
    assert distributed[:4] == local[:4]
    assert distributed[4]["error"]["type"] == "InputError"
    # restarted with one record changed: only that one runs again, the rest (the error
    # record too) come from the journal, and the file keeps input order
    docs[1]["text"] = "Bo is 44 years old."
    inp.write_text("".join(json.dumps(d) + "\n" for d in docs) + "{not json\n")
    again = run_ray_job(opts(tmp_path / "ray.jsonl"), ropts)
    assert again.records == 5 and again.computed_records == 1 and again.resumed == 4
    rerun = _records(tmp_path / "ray.jsonl")
    assert [r["id"] for r in rerun] == [r["id"] for r in distributed]
    assert rerun[:1] + rerun[2:] == distributed[:1] + distributed[2:]


def test_the_local_cluster_runs_its_workers_at_the_callers_priority(local_ray: Any) -> None:
    """Ray's default starts workers at nice 15, below its own processes: the engine actor
    would lose the CPU to them. start_local_ray runs workers at the caller's priority
    (a caller's own RAY_worker_niceness would win)."""
    import os

    from structgen.extract.ray_job import RAY_ENV

    @local_ray.remote(num_cpus=1)
    def niceness() -> int:
        return os.getpriority(os.PRIO_PROCESS, 0)

    key = "RAY_worker_niceness"  # Ray reads its settings with their own case
    assert os.environ[key] == RAY_ENV[key] == "0"  # set by start_local_ray
    assert local_ray.get(niceness.remote()) == os.getpriority(os.PRIO_PROCESS, 0)


def test_two_workers_share_the_records_and_the_summary_counts_each_ones(tmp_path: Path, local_ray: Any) -> None:
    """Two workers on an input Ray reads as several blocks: every record is written once, in
    order, and the summary says which worker (host:pid) computed how many. The pool keeps
    both busy: with Ray Data's defaults one worker took most of the batches while the other
    waited (512 of 600 records measured, and this test failed); each worker holds two batches
    at a time (``BATCHES_IN_FLIGHT``), so neither computes much more than twice the other's
    share."""
    from structgen.extract.ray_job import RayOptions, run_ray_job

    n = 32
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": f"r{i}", "text": f"P{i} is {20 + i} years old."}) + "\n"
                           for i in range(n)))
    opts = JobOptions(input=str(inp), output=str(tmp_path / "out.jsonl"), schema=SCHEMA,
                      config=ExtractConfig(max_tokens=12, retries=0), quiet=True, concurrency=2)
    stats = run_ray_job(opts, RayOptions(workers=2, batch_size=2, cpus_per_worker=0.5))
    assert stats.records == stats.computed_records == n
    assert [r["id"] for r in _records(tmp_path / "out.jsonl")] == [f"r{i}" for i in range(n)]
    assert len(stats.workers) == 2 and sum(stats.workers.values()) == n, stats.workers
    assert min(stats.workers.values()) >= n // 3, stats.workers
    assert stats.to_dict()["computed_by_worker"] == dict(sorted(stats.workers.items()))
    again = run_ray_job(opts, RayOptions(workers=2, batch_size=2, cpus_per_worker=0.5))
    assert again.resumed == n and not again.workers and "computed_by_worker" not in again.to_dict()


def test_csv_and_a_glob_of_text_files_run_on_ray_as_locally(tmp_path: Path, local_ray: Any,
                                                            embedded_backend: Any) -> None:
    """The workers parse the rows Ray reads: a CSV's rows (by their id and text columns) and
    a glob's files (one record each, the id its path) give the local job's records."""
    from structgen.extract.ray_job import RayOptions, run_ray_job

    csv_in = tmp_path / "in.csv"
    csv_in.write_text("id,text,source\nc0,Ada is 31 years old.,web\nc1,Bo is 27.,mail\nc2,Cy is 40 years old.,web\n")
    folder = tmp_path / "docs"
    folder.mkdir()
    for i, text in enumerate(["Di is 22 years old.", "Eve is 58 years old."]):
        (folder / f"d{i}.txt").write_text(text)
    cfg = ExtractConfig(max_tokens=16, retries=0)
    for name, src in (("csv", str(csv_in)), ("glob", str(folder / "*.txt"))):
        def opts(out: Path, src: str = src) -> JobOptions:
            return JobOptions(input=src, output=str(out), schema=SCHEMA, config=cfg, quiet=True, concurrency=4)

        run_job(opts(tmp_path / f"{name}-local.jsonl"), embedded_backend)
        stats = run_ray_job(opts(tmp_path / f"{name}-ray.jsonl"), RayOptions(workers=1, batch_size=2))
        local, distributed = _records(tmp_path / f"{name}-local.jsonl"), _records(tmp_path / f"{name}-ray.jsonl")
        assert stats.records == len(local), name
        if name == "csv":
            assert [r["id"] for r in distributed] == ["c0", "c1", "c2"]
        else:
            assert [r["id"] for r in distributed] == [str(folder / f"d{i}.txt") for i in range(2)]
        assert distributed == local, name


@pytest.mark.parametrize("workers", [1, 2])
def test_one_worker_reads_while_its_engine_loads_several_wait_for_the_whole_pool(tmp_path: Path, local_ray: Any,
                                                                                 workers: int) -> None:
    """balance_workers: with one worker the read runs while the actor starts (Ray Data would
    otherwise start no task before the pool is up); with several, no task runs before every
    actor is up. The actor waits in its constructor until the read has run, up to 20 s."""
    import time

    from structgen.extract.ray_job import balance_workers

    ctx = ray.data.DataContext.get_current()
    saved = (ctx.target_max_block_size, ctx.wait_for_min_actors_s)
    marker = tmp_path / "read"

    def read(batch: dict[str, Any]) -> dict[str, Any]:
        marker.touch()
        return batch

    class Loads:
        def __init__(self) -> None:
            deadline = time.monotonic() + 20
            while not marker.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            self.saw = marker.exists()

        def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
            return {"saw": [self.saw] * len(batch["id"])}

    try:
        balance_workers(ctx, workers)
        ds = ray.data.range(4, override_num_blocks=1).map_batches(read).map_batches(
            Loads, compute=ray.data.ActorPoolStrategy(size=1), num_cpus=0.25)
        saw = [bool(s) for b in ds.iter_batches(batch_size=None, batch_format="numpy") for s in b["saw"]]
    finally:
        ctx.target_max_block_size, ctx.wait_for_min_actors_s = saved
    assert saw == [workers == 1] * 4
