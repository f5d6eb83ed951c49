"""One cluster of namespace hosts for every test of tests/hosts: starting one (5 hosts, a Ray head
and 4 raylets, on this 2-core machine) is the dominant cost of these tests, so it is started once
for the package (its layout: ``Cluster`` in tests/_helpers/hosts.py) and restored after each test
(every link up, every process the test started ended, no worker left, a raylet that Ray's GCS
declared dead started again), never rebuilt."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests._helpers.hosts import Cluster, namespaces_unavailable


@pytest.fixture(scope="package")
def _package_cluster() -> Iterator[Cluster]:
    unavailable = namespaces_unavailable()
    if unavailable is not None:
        pytest.skip(unavailable)
    with Cluster.started() as cluster:
        yield cluster


@pytest.fixture
def cluster(_package_cluster: Cluster) -> Iterator[Cluster]:
    """The package's cluster, restored after the test (see the module docstring)."""
    try:
        yield _package_cluster
    finally:
        _package_cluster.hosts.restore()
        _package_cluster.ray.revive()
