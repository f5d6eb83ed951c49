"""The store a contract test runs on: one fixture parameter per store.

To prove a new store, add one ``StoreCase`` to ``CASES``: every test in this folder then runs on
it too. ``open`` makes a fresh run directory on that store (another ``open`` of the same root and
name is what a second driver, a reader or a restarted driver sees); ``abandon`` leaves a claim as
its owner's death does (the kernel drops a lock; a lease stops being renewed); ``child_args``
tells a driver in another process (``commit_child.py``) how to open the same run, for stores
whose files outlive the process that wrote them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import fsspec
import pytest
from _helpers import moto_s3
from norename_store import NoRenameStore

from phalanx._internal.storage.run_storage import RunStorage
from phalanx._internal.storage.store import RunClaim, RunStore


def _abandon_lock(claim: Any) -> None:
    os.close(claim._fd)  # as the owner's death does: the kernel drops the flock
    claim._fd = None


def _abandon_lease(claim: Any) -> None:
    claim._stop.set()  # the owner died: no more heartbeats, and no release
    claim._heartbeat.join()
    claim._heartbeat = None


@dataclass(frozen=True)
class StoreCase:
    id: str
    open_run: Callable[[str], RunStore]
    """A store for the run ``name`` under this case's root (one root per test)."""
    abandon: Callable[[RunClaim], None]
    expected_type: type | None = None  # what ``RunStorage(...)`` chose, for the shipped stores
    child_args: Callable[[str], list[str]] | None = None
    """``commit_child.py``'s store arguments for the run ``name``; None for a store held in this
    process's memory, which a killed process would take along."""

    def open(self, name: str = "run") -> RunStore:
        return self.open_run(name)


def _local(tmp_path: Any, s3: Any) -> StoreCase:
    from phalanx._internal.storage.local_store import LocalStore

    root = str(tmp_path / "runs")
    return StoreCase(
        "local",
        lambda n: RunStorage.create(root, n),
        _abandon_lock,
        LocalStore,
        lambda n: ["local", root, n],
    )


def _memory(tmp_path: Any, s3: Any) -> StoreCase:
    from phalanx._internal.storage.object_store import ObjectStore

    root = f"memory://contract-{uuid.uuid4().hex[:8]}"
    return StoreCase("memory", lambda n: RunStorage.create(root, n), _abandon_lease, ObjectStore)


def _s3(tmp_path: Any, s3: Any) -> StoreCase:
    from phalanx._internal.storage.object_store import ObjectStore

    root = f"s3://contract/{uuid.uuid4().hex[:8]}"
    return StoreCase(
        "s3",
        lambda n: RunStorage.create(root, n, s3()),
        _abandon_lease,
        ObjectStore,
        lambda n: ["s3", root, n, s3().client_kwargs["endpoint_url"]],
    )


def _norename(tmp_path: Any, s3: Any) -> StoreCase:
    fs = fsspec.filesystem("memory")
    root = f"/norename-{uuid.uuid4().hex[:8]}"
    return StoreCase("norename", lambda n: NoRenameStore(fs, root, n), _abandon_lease)


CASES = {"local": _local, "memory": _memory, "s3": _s3, "norename": _norename}


@pytest.fixture(scope="session")
def s3_server() -> Iterator[Callable[[], Any]]:
    """A real S3-compatible server (moto) on 127.0.0.1, started on first use."""
    with ExitStack() as stack:
        started: list[Any] = []

        def filesystem() -> Any:
            if not started:
                started.append(stack.enter_context(moto_s3("contract")))
            return started[0]

        yield filesystem


@pytest.fixture(params=list(CASES))
def case(request: pytest.FixtureRequest, tmp_path: Any) -> StoreCase:
    s3 = request.getfixturevalue("s3_server") if request.param == "s3" else None
    made = CASES[request.param](tmp_path, s3)
    if made.id == "s3":
        s3()  # start the server (or skip) before the test runs
    return made
