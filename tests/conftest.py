"""Shared fixtures. Every test fails if it leaks child processes, phalanx threads or env vars."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from _leaks import no_leaks as check_no_leaks
from _leaks import wait_until_settled


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    with check_no_leaks():
        yield


@pytest.fixture
def storage(tmp_path):
    return str(tmp_path / "runs")


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
