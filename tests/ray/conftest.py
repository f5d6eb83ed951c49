"""Fixtures for the Ray engine: a local Ray instance, or a fake multi-node cluster, per module.

Ray's own processes (GCS, raylet, agents, idle workers) are children of the test process. They
are started by the module-scoped fixtures, before any test's leak snapshot, and stopped by
``ray.shutdown()`` in the fixture's teardown. The environment variables ``ray.init`` sets
(``RAY_AUTH_MODE``, ...) are left in place: they describe this process's Ray client, and removing
them makes the next ``ray.init`` in the same process start nodes that reject its actors. This directory's ``no_leaks`` replaces the global
one: it is as strict about threads, environment variables and child processes, except that
Ray's own processes (``ray::IDLE`` pool workers, Ray Data's coordinator actors) may outlive a
test until the fixture shuts Ray down; phalanx's actors (``ray::PhalanxWorker``) must be gone
after every test.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

PHALANX_ACTOR = "PhalanxWorker"


RAY_DAEMONS = ("raylet", "gcs_server")


def _is_leak(name: str) -> bool:
    """Ray's processes end with ray.shutdown(); phalanx's actors must end with fit()."""
    if PHALANX_ACTOR in name:
        return True
    return not name.startswith(("ray::", "ray-daemon ")) and name not in RAY_DAEMONS


def _children() -> dict[int, str]:
    found = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                found[proc.pid] = _label(proc)
        except psutil.NoSuchProcess:
            continue
    return found


def _label(proc: psutil.Process) -> str:
    """The process title; Ray's Python daemons (log monitor, agents) are named by their script."""
    name = proc.name()
    if name.startswith("python"):
        script = next((a for a in proc.cmdline()[1:] if not a.startswith("-")), "")
        if f"{os.sep}ray{os.sep}" in script:
            return f"ray-daemon {os.path.basename(script)}"
    return name


def _phalanx_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("phalanx-")}


def wait_until_settled(timeout_s: float = 30.0, quiet_s: float = 1.0) -> None:
    """Wait until Ray has started what it starts in the background (agents, idle workers)."""
    deadline = time.monotonic() + timeout_s
    last, since = _children(), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < quiet_s:
        time.sleep(0.1)
        now = _children()
        if now != last:
            last, since = now, time.monotonic()


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    env_before = dict(os.environ)
    children_before = _children()
    threads_before = _phalanx_threads()
    yield
    deadline = time.monotonic() + 5
    while True:
        leaked_children = {
            pid: name
            for pid, name in _children().items()
            if pid not in children_before and _is_leak(name)
        }
        leaked_threads = _phalanx_threads() - threads_before
        if (not leaked_children and not leaked_threads) or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert not leaked_children, f"test left child processes behind: {leaked_children}"
    assert not leaked_threads, f"test left phalanx threads running: {leaked_threads}"
    changed = {
        k
        for k in set(env_before) | set(os.environ)
        if env_before.get(k) != os.environ.get(k) and k != "PYTEST_CURRENT_TEST"
    }
    os.environ.clear()
    os.environ.update(env_before)
    assert not changed, f"test changed environment variables: {sorted(changed)}"


@pytest.fixture(scope="module")
def local_ray() -> Iterator[Any]:
    """A local Ray instance with 4 CPUs for the module's tests."""
    ray = pytest.importorskip("ray")
    # address="local": a new instance, never one that another process on this machine started.
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    wait_until_settled()
    try:
        yield ray
    finally:
        ray.shutdown()


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
def storage(tmp_path: Any) -> str:
    return str(tmp_path / "runs")
