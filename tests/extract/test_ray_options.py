"""`--ray`'s CPU shares (no cluster needed): an embedded engine's actor gets the node's
cores -- Ray sets its torch threads from them -- and a worker bound to servers gets one."""

from __future__ import annotations

import os

import pytest

from structgen.extract.ray_job import RayOptions, local_cpus, worker_cpus


def test_the_local_cluster_has_a_cpu_beside_the_cores() -> None:
    assert local_cpus() == (os.cpu_count() or 1) + 1


@pytest.mark.parametrize(("node", "workers", "want"), [(3, 1, 2.0), (3, 2, 1.0), (9, 2, 4.0), (9, 3, 2.0), (2, 1, 1.0),
                                                      (1, 1, 1.0), (17, 4, 4.0)])
def test_an_embedded_worker_shares_the_largest_node_less_one(node: int, workers: int, want: float) -> None:
    assert worker_cpus(RayOptions(workers=workers), node) == want


def test_the_local_cluster_gives_one_embedded_worker_every_core() -> None:
    assert worker_cpus(RayOptions(), local_cpus()) == float(os.cpu_count() or 1)


def test_a_worker_bound_to_servers_takes_one_cpu_and_an_explicit_share_wins() -> None:
    assert worker_cpus(RayOptions(backend="vllm", urls=("http://127.0.0.1:8000",), workers=1), 33) == 1.0
    assert worker_cpus(RayOptions(backend="openai", workers=2), 33) == 1.0
    assert worker_cpus(RayOptions(cpus_per_worker=0.5), 33) == 0.5
    assert worker_cpus(RayOptions(backend="vllm", cpus_per_worker=3), 33) == 3
