"""Shared fixtures. HOME is a temp directory for the session; every test fails if it leaks child
processes, phalanx threads, env vars or files outside its temp directory (tests/_leaks.py)."""

from __future__ import annotations

import faulthandler
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from _leaks import no_leaks as check_no_leaks
from _leaks import wait_until_settled
from _pytest.faulthandler import fault_handler_stderr_fd_key
from _skips import pytest_addoption, pytest_configure  # noqa: F401  (the skip check's hooks)


@pytest.fixture(autouse=True, scope="session")
def isolated_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """HOME is a temp directory for the whole session, so the default storage path
    (~/phalanx_results), the log cache (~/.cache) and anything else a code path puts under ~ stay
    in the session's temp dir; PHALANX_STORAGE_PATH is unset so the default is that one. Set
    before any test's leak snapshot; restored at the end."""
    saved = {key: os.environ.get(key) for key in ("HOME", "PHALANX_STORAGE_PATH")}
    home = tmp_path_factory.mktemp("home")
    os.environ["HOME"] = str(home)
    os.environ.pop("PHALANX_STORAGE_PATH", None)
    try:
        yield str(home)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(autouse=True)
def crash_stacks(request: pytest.FixtureRequest) -> None:
    """A segfault in this process prints every thread's Python stack. pytest's faulthandler is
    installed once, at the start; the first ``ray.init`` puts Ray's own SIGSEGV handler over it,
    and after ``ray.shutdown()`` that handler writes into Ray's closed log: a crash later in the
    session printed nothing at all (CI: exit 139, no trace). Re-installed before every test, on
    pytest's own copy of the terminal's stderr (fd 2 is the test's capture file)."""
    fd = request.config.stash.get(fault_handler_stderr_fd_key, None)
    faulthandler.enable(file=fd if fd is not None else sys.__stderr__, all_threads=True)


@pytest.fixture(autouse=True)
def no_leaks(isolated_home: str) -> Iterator[None]:
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
