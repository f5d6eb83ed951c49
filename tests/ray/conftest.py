"""Fixtures for the Ray engine: a local Ray instance, or a fake multi-node cluster, per module;
the worker nodes one test adds to a cluster (``nodes``, ``default_checks_nodes``), per test.

Ray's own processes (GCS, raylet, agents, idle workers) are children of the test process. They
are started by the module-scoped fixtures, before any test's leak snapshot, and stopped by
``ray.shutdown()`` in the fixture's teardown. The environment variables ``ray.init`` sets
(``RAY_AUTH_MODE``, ...) are left in place: they describe this process's Ray client, and removing
them makes the next ``ray.init`` in the same process start nodes that reject its actors. This directory's ``no_leaks`` replaces the global
one: tests/_leaks.py's check, tolerant of Ray's own processes until the fixture shuts Ray down.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from _helpers import WorkerNodes, free_port
from _leaks import no_leaks as check_no_leaks
from _leaks import ray_tolerant, wait_until_settled


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    with check_no_leaks(ray_tolerant):
        yield


# A removed node is declared dead within a few seconds, not Ray's default 30 s; not faster, or a
# node of a busy machine that answers late is declared dead too.
FAST_HEALTH_CHECKS = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 2000,
    "health_check_failure_threshold": 4,
}


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[Any, list[str]]]:
    """A head node (1 CPU) and two worker nodes (2 CPUs, ``trainer: 2``; the first also
    ``spot: 1``); yields the cluster and the worker nodes' ids."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "include_dashboard": False,
            # Not 8265: when another Ray (a benchmark) holds it, Ray's start leaks a socket.
            "dashboard_port": free_port(),
            "_system_config": FAST_HEALTH_CHECKS,
        },
    )
    nodes = [
        cluster.add_node(num_cpus=2, resources={"trainer": 2, **extra})
        for extra in ({"spot": 1}, {})
    ]
    ray.init(address=cluster.address)
    try:
        cluster.wait_for_nodes()
        wait_until_settled()
        yield cluster, [node.node_id for node in nodes]
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture
def nodes(cluster: tuple[Any, list[str]]) -> Iterator[WorkerNodes]:
    """Worker nodes this test adds to ``cluster``; those it did not kill are removed at its end."""
    with WorkerNodes(cluster[0]) as added:
        yield added


@pytest.fixture
def storage(tmp_path: Any) -> str:
    return str(tmp_path / "runs")


@pytest.fixture(scope="module")
def default_checks_cluster() -> Iterator[Any]:
    """A head node (1 CPU, ``slot: 1``) with Ray's default health checks: a killed node is
    declared dead ~15 s after the kill, long after phalanx notices the loss (the node-loss
    tests add and remove their own worker nodes)."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "resources": {"slot": 1},
            "include_dashboard": False,
            "dashboard_port": free_port(),  # not 8265: a benchmark's cluster may hold it
        },
    )
    ray.init(address=cluster.address)
    try:
        cluster.wait_for_nodes()
        wait_until_settled()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture
def default_checks_nodes(default_checks_cluster: Any) -> Iterator[WorkerNodes]:
    """Worker nodes this test adds to ``default_checks_cluster``; those it did not kill are
    removed at its end."""
    with WorkerNodes(default_checks_cluster) as added:
        yield added
